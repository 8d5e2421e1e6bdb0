"""What a simulated run is fed: the scenario's open-loop request stream, or its closed-loop
clients, and the key that tells which scenarios draw the same stream.

Scenarios with equal ``traffic_key`` draw the same requests at the same instants whatever
their fleets and autoscalers do, so ``sim.drive.run_together`` generates the stream once for
all of them. With its engine stated, the stream keeps every conversation below the
engine's ``max_model_len`` (``sim/context_cap.py``); closed-loop clients make each run's
requests depend on its answers, so a run with clients has its own.
"""

from __future__ import annotations

from collections.abc import Hashable

from cachescale.sim.clients import ClosedLoopClients
from cachescale.sim.context_cap import CappedTraffic
from cachescale.sim.engine_spec import max_model_len
from cachescale.sim.scenario import FLEET_EVENTS, Scenario, replica_profile, stream_workload
from cachescale.sim.traffic import Traffic
from cachescale.sim.traffic_spec import Perturbation


def traffic_key(scenario: Scenario) -> Hashable:
    """Everything the request stream depends on: scenarios with equal keys draw the same
    requests at the same instants, whatever their fleets and autoscalers do."""
    engine = scenario.fleet.engine
    return (
        stream_workload(scenario).model_dump_json(),
        scenario.seed,
        scenario.duration_s,
        tuple(p.model_dump_json() for p in _traffic_perturbations(scenario)),
        None if engine is None else max_model_len(engine),
        None if scenario.clients is None else scenario.clients.model_dump_json(),
    )


def _traffic_perturbations(scenario: Scenario) -> list[Perturbation]:
    return [p for p in scenario.perturbations if not isinstance(p, FLEET_EVENTS)]


def open_stream(scenario: Scenario) -> Traffic:
    """The open-loop stream; conversations capped at ``max_model_len`` when the scenario
    states its engine (``sim/context_cap.py``)."""
    workload, engine = stream_workload(scenario), scenario.fleet.engine
    perturbations = _traffic_perturbations(scenario)
    if engine is not None:
        return CappedTraffic(
            workload,
            max_model_len(engine),
            seed=scenario.seed,
            perturbations=perturbations,
            until_s=scenario.duration_s,
        )
    return Traffic(
        workload, seed=scenario.seed, perturbations=perturbations, until_s=scenario.duration_s
    )


def closed_loop_clients(scenario: Scenario) -> ClosedLoopClients | None:
    """The scenario's closed-loop clients, if it has them."""
    if scenario.clients is None:
        return None
    return ClosedLoopClients(
        scenario.clients,
        scenario.seed,
        replica_profile(scenario).block_size,
        max_model_len(scenario.fleet.engine),
        scenario.duration_s,
    )
