"""KEDA's queue trigger in the simulator: its arithmetic (ceil(sum / threshold) over the
Deployment's replicas, loading pods counted as serving, the polled value with
useCachedMetrics), and
the scenario naming its runs. ``rag-rechunk-keda`` itself, KEDA alone against KEDA with
cachescale, runs with the other closed loops (``test_closed_loop.py``)."""

from __future__ import annotations

from typing import Any

from cachescale.commands.simulate import SimulationOutcome, build_autoscaler
from cachescale.sim.autoscaler import FleetObservation
from cachescale.sim.drive import run
from cachescale.sim.hpa import HPAModel, HPASpec
from cachescale.sim.keda import KedaAutoscaler
from cachescale.sim.scenario import KedaSpec
from tests.sim.closed_loop import LoopRun


def keda(**settings: Any) -> KedaAutoscaler:
    spec = HPASpec(min_replicas=2, max_replicas=40, target_average_value=5.0)
    return KedaAutoscaler(HPAModel(spec), "num_requests_waiting", KedaSpec(**settings))


def seen(now_s: float, waiting: tuple[float, ...], replicas: int, starting: int = 0) -> Any:
    return FleetObservation(
        now_s=now_s,
        replicas=replicas,
        ready_replicas=len(waiting),
        starting_replicas=starting,
        waiting_per_ready_pod=waiting,
        running_per_ready_pod=tuple(0.0 for _ in waiting),
    )


def test_the_trigger_asks_for_the_summed_queue_over_the_threshold() -> None:
    # 4 pods with 30 waiting in all: ceil(30 / 5) = 6, rate-limited at most to 8 (+100%).
    assert keda().step(seen(0.0, (10.0, 10.0, 5.0, 5.0), 4)).desired_replicas == 6


def test_pods_still_starting_count_as_serving() -> None:
    # 6 replicas, 4 still loading weights, 12 waiting on the 2 ready ones. KEDA's External
    # metric divides by the Deployment's replicas: 12 / (5 × 6) = 0.4, ceil(12 / 5) = 3, and
    # with no earlier recommendation to stabilize on it shrinks. A Pods-metric HPA counts
    # the loading pods as 0 only where that cannot reverse the direction, and keeps 6.
    assert keda().step(seen(0.0, (6.0, 6.0), 6, starting=4)).desired_replicas == 3
    pods_hpa = HPAModel(HPASpec(min_replicas=2, max_replicas=40, target_average_value=5.0))
    assert pods_hpa.step(0.0, 6, [6.0, 6.0], missing_pods=4).desired_replicas == 6


def test_cached_metrics_read_the_last_poll() -> None:
    autoscaler = keda(polling_interval_s=60.0, use_cached_metrics=True)
    assert autoscaler.step(seen(0.0, (5.0, 5.0), 2)).desired_replicas == 2
    # 15 s later the queue is 40 per pod, but the last poll (at 0 s) still says 10 in all.
    assert autoscaler.step(seen(15.0, (40.0, 40.0), 2)).desired_replicas == 2
    assert autoscaler.step(seen(60.0, (40.0, 40.0), 2)).desired_replicas == 6  # +4 pods/15 s


def test_a_keda_scenario_names_its_runs_after_what_scaled() -> None:
    loop = LoopRun.builtin("rag-rechunk-keda", "hpa")
    assert isinstance(build_autoscaler("hpa", loop.scenario), KedaAutoscaler)
    outcome = SimulationOutcome(loop.scenario.model_copy(update={"duration_s": 30.0}))
    outcome.runs["hpa"] = run(outcome.scenario, build_autoscaler("hpa", outcome.scenario))
    assert "autoscaler: keda\n" in outcome.to_text()
