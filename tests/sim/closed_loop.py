"""Run scenarios closed-loop in worker processes and bring back what the tests read.

A full ``RunResult`` holds every pod's engine (caches included) and every finished
request; shipping that between processes would cost more than the run. A worker runs one
(scenario, autoscaler) pair and returns a ``LoopSummary``: the policy's evaluations, the
timeline, and the ground-truth signals of the windows the tests ask for. Two workers use
both cores, so the closed-loop suite costs about half its CPU time. They run at a lower
priority (``NICENESS``): under `make unit` they share the cores with the e2e suite on the
other pytest-xdist worker, whose control plane and operators answer to real deadlines.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from cachescale.sim.present import before_after
from cachescale.sim.report import Signals, Windows
from cachescale.sim.run import PolicyRecord, TimelineSample, run
from cachescale.sim.scenario import Scenario, load_builtin
from cachescale.sim.simulate import build_autoscaler

Window = tuple[float, float]
NICENESS = 5
"""How much less CPU priority a simulation worker takes than the test process."""


@dataclass(frozen=True)
class LoopSummary:
    """What one closed-loop run leaves for the assertions."""

    scenario: Scenario
    autoscaler: str
    policy: list[PolicyRecord]
    samples: list[TimelineSample]
    before: Signals
    after: Signals
    windows: dict[Window, Signals]


@dataclass(frozen=True)
class LoopRun:
    """One run to make: a built-in scenario (possibly modified) under an autoscaler."""

    scenario: Scenario
    autoscaler: str
    windows: tuple[Window, ...] = ()

    @classmethod
    def builtin(cls, name: str, autoscaler: str, *windows: Window) -> LoopRun:
        return cls(load_builtin(name), autoscaler, windows)


def summarize(job: LoopRun) -> LoopSummary:
    """Run ``job`` to the end (in a worker) and keep only what the tests read."""
    result = run(job.scenario, build_autoscaler(job.autoscaler, job.scenario))
    windows = Windows(result)
    (b0, b1), (a0, a1) = before_after(result)
    return LoopSummary(
        scenario=job.scenario,
        autoscaler=job.autoscaler,
        policy=result.policy,
        samples=result.samples,
        before=windows.signals(b0, b1),
        after=windows.signals(a0, a1),
        windows={window: windows.signals(*window) for window in job.windows},
    )


def run_all(jobs: dict[str, LoopRun], workers: int = 2) -> dict[str, LoopSummary]:
    """Every job, ``workers`` at a time, longest first (so the pool drains evenly)."""
    order = sorted(jobs, key=lambda key: -jobs[key].scenario.duration_s)
    with ProcessPoolExecutor(
        max_workers=workers, initializer=os.nice, initargs=(NICENESS,)
    ) as pool:
        futures = {key: pool.submit(summarize, jobs[key]) for key in order}
        return {key: future.result() for key, future in futures.items()}
