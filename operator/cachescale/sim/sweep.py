"""Sweeps: the same scenario over a grid of fleet settings, each on a fixed fleet.

Used by ``cold-dilution`` (replicas × router) and ``batch-pressure`` (max_num_seqs): the
question there is what the cache does at a given setting, so no autoscaler moves the
fleet. Every point reuses the scenario's seed, so points differ only in the setting.
"""

from __future__ import annotations

from cachescale.sim.drive import run
from cachescale.sim.run import RunResult
from cachescale.sim.scenario import Scenario


def run_sweep(scenario: Scenario) -> list[tuple[dict[str, object], RunResult]]:
    """Run every point of ``scenario.sweep``; returns (setting, result) pairs in order."""
    if scenario.sweep is None:
        raise ValueError(f"scenario {scenario.name!r} has no sweep")
    results: list[tuple[dict[str, object], RunResult]] = []
    for setting in scenario.sweep.points():
        fleet = scenario.fleet.model_copy(update=setting)
        workload = scenario.workload
        if scenario.sweep.rate_per_s_per_seq is not None:
            rate = scenario.sweep.rate_per_s_per_seq * fleet.max_num_seqs
            workload = workload.model_copy(update={"rate_per_s": rate})
        point = scenario.model_copy(
            update={"fleet": fleet, "workload": workload, "autoscaler": None}
        )
        results.append((dict(setting), run(point, autoscaler=None)))
    return results
