"""KEDA's queue trigger in the simulator: its arithmetic (ceil(sum / threshold) over the
Deployment's replicas, loading pods counted as serving, the polled value with
useCachedMetrics), and
``rag-rechunk-keda`` at seed 7, KEDA alone against KEDA with cachescale."""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.decide.diagnosis import collapse_thresholds
from cachescale.sim.hpa import HPAModel, HPASpec
from cachescale.sim.keda import KedaAutoscaler
from cachescale.sim.policy_loop import scenario_policy
from cachescale.sim.run import FleetObservation, run
from cachescale.sim.scenario import KedaSpec
from cachescale.sim.simulate import SimulationOutcome, build_autoscaler
from tests.sim.closed_loop import LoopRun, LoopSummary, run_all


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


@pytest.fixture(scope="module")
def loops() -> dict[str, LoopSummary]:
    return run_all(
        {
            "keda": LoopRun.builtin("rag-rechunk-keda", "hpa"),
            "cachescale": LoopRun.builtin("rag-rechunk-keda", "cachescale"),
        }
    )


def test_keda_alone_buys_replicas_for_the_collapse(loops: dict[str, LoopSummary]) -> None:
    alone = loops["keda"]
    assert alone.after.replicas >= 1.5 * alone.before.replicas


def test_cachescale_over_keda_alerts_within_three_intervals_and_grows_less(
    loops: dict[str, LoopSummary],
) -> None:
    alone, held = loops["keda"], loops["cachescale"]
    change = held.scenario.change_at_s
    policy = scenario_policy(held.scenario)
    below = next(
        r
        for r in held.policy
        if change is not None
        and r.t_s > change
        and r.hit_rate_seen is not None
        and r.baseline_hit_rate is not None
        and r.hit_rate_seen < collapse_thresholds(policy.cache, r.baseline_hit_rate)[0]
    )
    alert = next(r for r in held.policy if any(x.startswith("PrefixCollapse:") for x in r.raised))
    assert below.t_s <= alert.t_s <= below.t_s + 3 * policy.metrics.interval_seconds
    # SLO first (docs/decisions.md, "Precedence"): the fleet grows to what the SLO needs at
    # the collapsed cost, above the budget's 12, but to half of what KEDA alone buys.
    assert held.after.replicas <= 0.5 * alone.after.replicas
    assert held.after.gpu_s_per_1k < alone.after.gpu_s_per_1k
    assert held.after.ttft_p95_s < alone.after.ttft_p95_s
