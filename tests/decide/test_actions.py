"""What ``decide`` does about a diagnosis: the HPA envelope, the batch ceiling, the
human controls, and the memory that carries it all across evaluations and restarts."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from cachescale.api.reasons import Action, ConditionReason, Diagnosis, Hold
from cachescale.api.spec import MAX_REPLICAS
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import Decision, LearnedState, decide
from cachescale.decide.envelope import hold_level
from cachescale.decide.learned import LearnedBaseline, ReplicaMark
from cachescale.decide.slo_guard import slo_needed_replicas
from cachescale.snapshot import EngineSignals, HumanRequests, Snapshot
from tests.decide.decide_builders import (
    BATCHING,
    INTERVAL,
    T0,
    condition,
    learned,
    run,
    run_applied,
    signals,
    snapshot,
    spec,
    workload,
)


def test_budget_caps_max_replicas_at_the_observed_rate() -> None:
    # 780 GPU-s/1k × 32 req/s / (1000 × 2 GPUs) = 12.48 → 12
    (decision,) = run(spec(), [snapshot()])
    assert decision.budget_max_replicas == 12
    assert (decision.envelope.min_replicas, decision.envelope.max_replicas) == (4, 12)
    # The HPA's metric asks for 10 (11 pods × 20 running / 24): the cap does not bind.
    assert condition(decision, ConditionType.SCALING_HELD) == (
        ConditionStatus.FALSE,
        ConditionReason.NOT_HELD,
    )
    busy = snapshot(signals(running_requests_per_pod=30.0))  # asks for 14
    (held,) = run(spec(), [busy])
    assert condition(held, ConditionType.SCALING_HELD) == (ConditionStatus.TRUE, Hold.BUDGET)


def test_a_saturated_fleet_over_budget_is_held_at_its_replicas() -> None:
    # Requests queue and each costs more than the budget: 27 req/s is what 15 pods manage,
    # not the demand; the formula (10) would cut a saturated fleet and serve even fewer.
    engine = signals(
        requests_per_second=27.0, waiting_requests_per_pod=3.0, gpu_seconds_per_1k_requests=1111
    )
    (decision,) = run(spec(), [snapshot(engine, workload(replicas=15, hpa=(4, 15, 24.0)))])
    assert decision.budget_max_replicas == 15
    assert decision.envelope.max_replicas == 15


def test_a_saturated_fleet_within_budget_is_not_capped_by_what_it_serves() -> None:
    # Demand grew at a steady cost: the queue says the HPA must scale, inside the budget.
    engine = signals(requests_per_second=27.0, waiting_requests_per_pod=3.0)
    (decision,) = run(spec(), [snapshot(engine, workload(replicas=10, hpa=(4, 10, 24.0)))])
    assert decision.budget_max_replicas == 40
    assert decision.envelope.max_replicas == 40  # the budget's range, not what it serves


def test_with_arrivals_known_the_budget_reads_them_even_while_requests_queue() -> None:
    # 15 saturated pods serve 27 req/s of the 41 arriving: the allowance is read at the
    # arrivals, 780 × 41 / (1000 × 2) = 15.99 → 15, not pinned at the replicas.
    engine = signals(
        requests_per_second=27.0,
        arrivals_per_second=41.0,
        waiting_requests_per_pod=3.0,
        gpu_seconds_per_1k_requests=1111,
    )
    (decision,) = run(spec(), [snapshot(engine, workload(replicas=9, hpa=(4, 9, 24.0)))])
    assert decision.budget_max_replicas == 15
    assert "budget allows 15" in decision.message
    # Within budget at a steady cost, demand growth is the arrivals' allowance (20), not
    # the budget's whole range.
    growth = signals(
        requests_per_second=27.0, arrivals_per_second=52.0, waiting_requests_per_pod=3.0
    )
    (grown,) = run(spec(), [snapshot(growth, workload(replicas=10, hpa=(4, 10, 24.0)))])
    assert grown.budget_max_replicas == 20


def test_budget_range_bounds_the_envelope() -> None:
    policy = spec(budget={"gpuSecondsPer1kRequests": 100_000, "minReplicas": 6, "maxReplicas": 20})
    (decision,) = run(policy, [snapshot(fleet=workload(hpa=(2, 60, 24.0)))])
    assert (decision.envelope.min_replicas, decision.envelope.max_replicas) == (6, 20)


def collapse(on_collapse: str, p95: float = 0.5) -> list:  # type: ignore[type-arg]
    policy = spec(
        cache={"onCollapse": on_collapse}, budget={"gpuSecondsPer1kRequests": 1200}
    )  # budget allows 19
    engine = signals(
        hit=0.04, ttft_p95_seconds=p95, prefill_tokens_per_request=2000, running_requests_per_pod=40
    )
    return run(policy, [snapshot(engine, workload(replicas=14))] * 3)


@pytest.mark.parametrize(
    ("action", "top", "held"),
    [
        ("Hold", 11, Hold.COLLAPSE),
        ("CapAtBudget", 19, Hold.BUDGET),
        ("ScaleAsUsual", 19, Hold.BUDGET),
    ],
)
def test_collapse_actions(action: str, top: int, held: str) -> None:
    *_, decision = collapse(action)
    assert decision.envelope.max_replicas == top
    assert decision.alert_active(Diagnosis.PREFIX_COLLAPSE)  # every action alerts
    assert condition(decision, ConditionType.SCALING_HELD) == (ConditionStatus.TRUE, held)


def test_hold_lets_the_slo_guard_scale_inside_the_budget() -> None:
    *_, decision = collapse("Hold", p95=2.5)
    assert decision.envelope.max_replicas == 19
    message = decision.alerts[0].message
    assert "TTFT breaches the SLO, so replicas may grow to the budget's 19" in message


def slo_first(
    on_collapse: str,
    p95s: list[float],
    served: float = 28.0,
    applied: bool = False,
    waiting: float = 3.0,
    running: float = 40.0,
    ready: int = 12,
    metric: str = "vllm:num_requests_running",
    cold_pods: int = 0,
    arrivals: float | None = 32.0,
) -> list[Decision]:
    """A collapse on 12 settled pods capped by the budget (780 × 32 / 2000 = 12) that
    serve 28 of the 32 arriving req/s (``waiting`` per pod), with TTFT p95 going through
    ``p95s``. ``applied``: each evaluation reads the HPA as the one before left it."""

    def at(p95: float) -> Snapshot:
        engine = signals(
            hit=0.04,
            ttft_p95_seconds=p95,
            requests_per_second=served,
            arrivals_per_second=arrivals,
            waiting_requests_per_pod=waiting,
            gpu_seconds_per_1k_requests=1100.0,
            prefill_tokens_per_request=2000,
            running_requests_per_pod=running,
        )
        fleet = workload(replicas=12, ready=ready, cold_pods=cold_pods, hpa=(4, 12, 24.0))
        fleet = replace(fleet, hpa=replace(fleet.hpa, metric_name=metric))
        return snapshot(engine, fleet)

    policy = spec(cache={"onCollapse": on_collapse})
    states = [at(p95) for p95 in p95s]
    return run_applied(policy, states) if applied else run(policy, states)


def test_slo_first_lifts_the_cap_to_what_the_slo_needs_and_keeps_it() -> None:
    # ceil(12 ready × 32 arriving / 28 served / 0.85) = 17, above the budget's 12.
    decisions = slo_first("Hold", [0.5] * 3 + [2.5] * 2 + [0.5] * 12, applied=True)
    tops = [d.envelope.max_replicas for d in decisions]
    assert tops[2] == 11  # held at the pre-collapse 11 (the demand alone needs 10.9 → 11)
    assert tops[4] == 17
    assert decisions[4].slo_needed_replicas == 17
    assert decisions[4].reason == "ScaledForSLO"
    # Latency recovered, the collapse alert is still active: the cap does not fall back.
    assert tops[5:] == [17] * 12
    message = decisions[4].alerts[0].message
    assert "replicas may grow to 17, what the SLO needs at the current cost" in message
    assert "above the budget's 12" in message


def test_a_growing_queue_confirms_a_breach_for_the_estimate_at_its_first_evaluation() -> None:
    # 3 waiting per pod and 32 arriving against 28 served: the first breaching evaluation
    # makes the estimate, ceil(12 × 32 / 28 / 0.85) = 17, and the top is raised to it.
    decisions = slo_first("Hold", [0.5] * 3 + [2.5] * 2)
    assert [d.slo_needed_replicas for d in decisions[2:]] == [None, 17, 17]
    assert [d.envelope.max_replicas for d in decisions[2:]] == [11, 17, 17]
    assert decisions[3].reason == "ScaledForSLO"
    # Without a queue (0.5 waiting per pod) the fleet is only capped below the HPA's ask
    # (ceil(12 × 40 / 24) = 20): the estimate waits for the second breaching evaluation.
    unqueued = slo_first("Hold", [0.5] * 3 + [2.5] * 2, waiting=0.5)
    assert [d.slo_needed_replicas for d in unqueued[2:]] == [None, None, 17]
    assert [d.envelope.max_replicas for d in unqueued[2:]] == [11, 11, 17]
    # A queue served faster than requests arrive is a backlog draining: no estimate at all.
    draining = slo_first("Hold", [0.5] * 3 + [2.5] * 2, served=34.0)
    assert [d.slo_needed_replicas for d in draining] == [None] * 5
    # Arrivals unknown: nothing says the queue grows, so the second breaching evaluation
    # makes the estimate, on the served rate: ceil(12 × 28 / 28 / 0.85) = 15.
    served_only = slo_first("Hold", [0.5] * 3 + [2.5] * 2, arrivals=None)
    assert [d.slo_needed_replicas for d in served_only[2:]] == [None, None, 15]


def test_a_backlog_the_estimate_would_drain_slowly_lifts_the_top_to_drain_it() -> None:
    # 150 waiting on each of 12 pods: 1,800 requests. The SLO estimate, 17, serves the 32
    # arriving req/s with 15% headroom (4 req/s of surplus: 7.5 min for the backlog once
    # there, while it is still short). Draining it within 10 min needs
    # ceil(12 × (32 + 1,800 / 600) / 28 / 0.85) = 18, and the HPA's own metric asks for
    # ceil(12 × 40 / 24) = 20.
    *_, last = slo_first("Hold", [0.5] * 3 + [2.5] * 2, waiting=150.0)
    assert last.slo_needed_replicas == 17
    assert last.drain_replicas == 18
    assert last.envelope.max_replicas == 18
    assert last.reason == "ScaledForSLO"
    assert "the SLO needs 17; 18 to drain 1,800 waiting requests within 10 min" in last.message
    assert "may grow to 18 to drain 1,800 waiting requests" in last.alerts[0].message


def test_a_backlog_top_is_never_above_what_the_hpa_asks_for() -> None:
    # Its metric asks for ceil(12 × 30 / 24) = 15, under the estimate's 17: the top is
    # the estimate's, and no message speaks of a drain.
    *_, last = slo_first("Hold", [0.5] * 3 + [2.5] * 2, waiting=150.0, running=30.0)
    assert last.slo_needed_replicas == 17
    assert last.drain_replicas is None
    assert last.envelope.max_replicas == 17
    assert "to drain" not in last.message


def test_no_backlog_top_on_a_queue_metric_without_an_estimate_or_under_cap_at_budget() -> None:
    # An HPA on the queue (KEDA's trigger) asks for ceil(12 × 150 / 24) = 75: no bound,
    # so no drain top; the estimate's 17 is the top.
    *_, queue = slo_first(
        "Hold", [0.5] * 3 + [2.5] * 2, waiting=150.0, metric="vllm:num_requests_waiting"
    )
    assert queue.slo_needed_replicas == 17
    assert queue.drain_replicas is None
    assert queue.envelope.max_replicas == 17
    # 4 of the 12 pods still starting: the 8 that served need ceil(8 × 32 / 28 / 0.85) =
    # 11, which the budget's 12 covers. No estimate, so no drain top: the fleet returns to
    # an estimate once the backlog is gone, never to the budget's.
    *_, starting = slo_first("Hold", [0.5] * 3 + [2.5] * 2, waiting=150.0, ready=8)
    assert starting.slo_needed_replicas is None
    assert starting.drain_replicas is None
    *_, capped = slo_first("CapAtBudget", [0.5] * 3 + [2.5] * 2, waiting=150.0)
    assert capped.drain_replicas is None
    assert capped.envelope.max_replicas == 12


def test_the_slo_estimate_counts_the_pods_that_served_its_window() -> None:
    # 28 of the 32 arriving req/s served by 12 pods over the whole 5-minute window: the
    # SLO needs ceil(12 × 32 / 28 / 0.85) = 17.
    *_, settled = slo_first("Hold", [0.5] * 3 + [2.5] * 2)
    assert settled.slo_needed_replicas == 17
    # The same rate while 2 of the 12 start: the 10 ready pods served it, ceil(10 × 32 /
    # 28 / 0.85) = 14, without waiting for the 2.
    *_, starting = slo_first("Hold", [0.5] * 3 + [2.5] * 2, ready=10)
    assert starting.slo_needed_replicas == 14
    # 2 of the 12 ready for a minute of the window: 10 + 2 × 60 / 300 = 10.4 pods served
    # it, ceil(10.4 × 32 / 28 / 0.85) = 14; the ready count would say 17.
    *_, new_pods = slo_first("Hold", [0.5] * 3 + [2.5] * 2, cold_pods=2)
    assert new_pods.slo_needed_replicas == 14
    assert "the SLO needs 14" in new_pods.message


def test_slo_first_raises_min_replicas_to_what_the_slo_needs_while_it_breaches() -> None:
    # A raised top only lets the HPA add replicas; its own metric may not ask for them.
    decisions = slo_first("Hold", [0.5] * 3 + [2.5] * 2 + [0.5] * 12, applied=True)
    mins = [d.envelope.min_replicas for d in decisions]
    assert mins[:4] == [4] * 4  # the user's own minReplicas before the breach is sustained
    # Second breaching evaluation: the pods that serve the 32 arriving req/s at the rate
    # each serves now, ceil(17 × 0.85) = 15 (the top keeps the headroom: 17).
    assert mins[4] == 15
    assert "HPA envelope 15..17" in decisions[4].message
    assert (
        "minReplicas 15, the pods that serve the arrivals at the current rate per pod, "
        "while TTFT breaches the SLO" in decisions[4].message
    )
    # The breach is over and the PrefixCollapse alert lasts: the HPA's running batch
    # under-reads a collapsed cache's load, so the floor does not come down below the
    # pods the breach measured (demand unchanged: 15).
    assert mins[5:] == [15] * 12
    assert (
        "minReplicas 15, the pods that serve the arrivals at the rate per pod the SLO "
        "breach measured, held while the PrefixCollapse alert lasts" in decisions[5].message
    )


def test_cap_at_budget_raises_no_floor() -> None:
    decisions = slo_first("CapAtBudget", [0.5] * 3 + [2.5] * 3)
    assert [d.envelope.min_replicas for d in decisions] == [4] * 6


def test_a_draining_backlog_is_not_a_lack_of_replicas() -> None:
    # Serving 34 req/s of the 32 arriving: the queue is a backlog the fleet is draining.
    *_, last = slo_first("Hold", [0.5] * 3 + [2.5] * 3, served=34.0)
    assert last.slo_needed_replicas is None
    assert last.envelope.max_replicas < 17
    assert last.envelope.min_replicas == 4


def dearer_cache_without_a_queue(
    running_per_pod: float, ttft_p95_seconds: float = 2.5
) -> EngineSignals:
    """No collapse, a dearer cache (800 GPU-s/1k against the 780 budget): all 32 arriving
    req/s served with no queue, at ``ttft_p95_seconds`` (by default over the 1 s SLO)."""
    return signals(
        ttft_p95_seconds=ttft_p95_seconds,
        arrivals_per_second=32.0,
        waiting_requests_per_pod=0.2,
        running_requests_per_pod=running_per_pod,
        gpu_seconds_per_1k_requests=800.0,
    )


def capped_at_budget(running_per_pod: float, on_collapse: str = "Hold") -> list[Decision]:
    """``dearer_cache_without_a_queue`` for two evaluations on 12 pods, capped at the
    budget's 12 (780 × 32 / 2000)."""
    engine = dearer_cache_without_a_queue(running_per_pod)
    policy = spec(cache={"onCollapse": on_collapse})
    return run(policy, [snapshot(engine, workload(replicas=12, hpa=(4, 12, 24.0)))] * 2)


def test_a_breach_the_budget_cap_stops_the_hpa_from_answering_gets_what_the_slo_needs() -> None:
    # The HPA's own metric asks for ceil(12 × 30 / 24) = 15 and the cap holds it at 12;
    # no queue, so nothing said "replicas are short" before (a degraded cache at a tight
    # budget sat at the cap with TTFT breaching, "meeting the SLO needs a larger budget").
    first, second = capped_at_budget(running_per_pod=30.0)
    assert first.envelope.max_replicas == 12
    assert first.slo_needed_replicas is None  # one breaching evaluation is not enough
    # ceil(12 ready × max(32 / 32, 1) / 0.85) = 15, and the floor ceil(15 × 0.85) = 13.
    assert second.slo_needed_replicas == 15
    assert (second.envelope.min_replicas, second.envelope.max_replicas) == (13, 15)
    assert second.reason == "ScaledForSLO"
    # Under CapAtBudget the need is reported, not applied.
    *_, capped = capped_at_budget(running_per_pod=30.0, on_collapse="CapAtBudget")
    assert capped.slo_needed_replicas == 15
    assert capped.envelope.max_replicas == 12


def test_without_a_queue_a_capped_breach_does_not_raise_an_estimate_already_made() -> None:
    # At the 15 the SLO needed, the HPA's metric still asks for more (ceil(15 × 30 / 24) =
    # 19) and TTFT still breaches: what a window just after a backlog drained reads. The
    # estimate is raised only on a growing queue.
    engine = dearer_cache_without_a_queue(running_per_pod=30.0)
    capped = snapshot(engine, workload(replicas=12, hpa=(4, 12, 24.0)))
    raised_to_need = snapshot(engine, workload(replicas=15, hpa=(13, 15, 24.0)))
    decisions = run(spec(), [capped, capped, raised_to_need, raised_to_need])
    assert [d.slo_needed_replicas for d in decisions] == [None, 15, 15, 15]
    assert decisions[-1].envelope.max_replicas == 15


def test_without_a_collapse_the_floor_comes_down_in_steps_after_the_breach() -> None:
    # A dearer cache, no collapse, over budget (800 against 780) for as long as it lasts:
    # the breach floors minReplicas at ceil(15 × 0.85) = 13, then it comes down by a
    # tenth per evaluation to the user's 4, however long the cost stays over budget.
    breaching = dearer_cache_without_a_queue(running_per_pod=30.0)
    comfortable = dearer_cache_without_a_queue(running_per_pod=30.0, ttft_p95_seconds=0.5)
    fleet = workload(replicas=12, hpa=(4, 12, 24.0))
    states = [snapshot(breaching, fleet)] * 2 + [snapshot(comfortable, fleet)] * 11
    decisions = run_applied(spec(), states)
    # The estimate lasts with the incident (over budget), the floor does not.
    assert [decisions[1].slo_needed_replicas, decisions[-1].slo_needed_replicas] == [15, 15]
    mins = [d.envelope.min_replicas for d in decisions]
    assert mins == [4, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 4, 4]
    assert "minReplicas 12, coming down 10% per evaluation after the SLO breach" in (
        decisions[2].message
    )


def test_slo_at_risk_at_the_budget_cap_while_pods_start_does_not_ask_for_a_budget() -> None:
    # 2 of the 12 pods still starting: what the 10 ready pods served needs no more than
    # the budget's 12, so no estimate, and the alert says no need beyond the 12 is
    # measured yet, not that the budget must grow.
    engine = dearer_cache_without_a_queue(running_per_pod=30.0)
    starting = snapshot(engine, workload(replicas=12, ready=10, hpa=(4, 12, 24.0)))
    *_, last = run(spec(), [starting] * 3)
    assert last.slo_needed_replicas is None
    message = next(a.message for a in last.alerts if a.reason == "SLOAtRisk")
    assert "with replicas at the 12 the budget of 780 GPU-s/1k allows while 2 of them start" in (
        message
    )
    assert "no need beyond it is measured yet" in message
    assert "larger budget" not in message


def test_a_breach_the_hpa_does_not_ask_replicas_for_is_not_answered_with_replicas() -> None:
    # The same breach, but the HPA's metric asks for ceil(12 × 20 / 24) = 10: the cap is
    # not what stops it, and there is no queue, so the breach is not a lack of replicas.
    *_, last = capped_at_budget(running_per_pod=20.0)
    assert last.slo_needed_replicas is None
    assert (last.envelope.min_replicas, last.envelope.max_replicas) == (4, 12)


def test_cap_at_budget_says_latency_is_sacrificed_and_how_much() -> None:
    decisions = slo_first("CapAtBudget", [0.5] * 3 + [2.5] * 3)
    last = decisions[-1]
    assert last.envelope.max_replicas == 12
    assert last.slo_needed_replicas == 17
    messages = {a.reason: a.message for a in last.alerts}
    for reason in ("PrefixCollapse", "SLOAtRisk"):
        assert (
            "latency is being sacrificed to the budget (onCollapse: CapAtBudget)"
            in (messages[reason])
        )
        assert "TTFT p95 2.50 s against the 1.00 s SLO" in messages[reason]
        assert "the SLO needs 17 replicas" in messages[reason]


def test_no_policy_caps_below_the_demand_alone() -> None:
    # A budget under the healthy cost: 500 × 32 / 2000 = 8, but the demand alone at the
    # baseline's 680 GPU-s/1k needs ceil(680 × 32 / 2000) = 11.
    for action in ("Hold", "CapAtBudget", "ScaleAsUsual"):
        policy = spec(budget={"gpuSecondsPer1kRequests": 500}, cache={"onCollapse": action})
        (decision,) = run(policy, [snapshot()])
        assert decision.budget_max_replicas == 8
        assert decision.demand_replicas == 11
        assert decision.envelope.max_replicas == 11


def test_a_mark_taken_at_a_vanishing_rate_scales_to_a_finite_count() -> None:
    # 5e-324 req/s then, 32 now: a growth of infinity, which ceil() cannot take.
    vanishing = ReplicaMark(replicas=10, requests_per_second=5e-324, at=T0)
    assert hold_level(vanishing, 32.0, 11) == MAX_REPLICAS
    assert slo_needed_replicas(vanishing, 32.0) == MAX_REPLICAS


def test_hold_follows_demand_growth_since_the_mark() -> None:
    memory = learned(pre_collapse=ReplicaMark(replicas=10, requests_per_second=20.0, at=T0))
    policy = spec(budget={"gpuSecondsPer1kRequests": 1200})
    engine = signals(hit=0.04, requests_per_second=32.0)
    *_, decision = run(policy, [snapshot(engine)] * 3, memory)
    assert decision.envelope.max_replicas == 16  # 10 × 32/20


def test_lowering_waits_for_the_stabilization_window_and_never_reverses_inside_it() -> None:
    # Demand dips: the budget allows 9 instead of 12, then recovers to 12 after 2 minutes.
    rates = [32.0] * 2 + [24.0] * 4 + [32.0] * 2 + [24.0] * 12
    snapshots = [
        snapshot(signals(requests_per_second=r), workload(hpa=(4, 12, 24.0))) for r in rates
    ]
    tops = [d.envelope.max_replicas for d in run(spec(), snapshots)]
    assert tops[:8] == [12] * 8  # the dip was shorter than the window: nothing lowered
    assert tops[8:17] == [12] * 9  # 300 s of recommendations at 9 needed before lowering
    assert tops[17:] == [9] * 3


def test_slo_guard_lowers_the_target_in_steps_when_the_budget_has_room() -> None:
    engine = signals(ttft_p95_seconds=1.5)
    decisions = run(spec(), [snapshot(engine, workload(replicas=8))] * 6)
    targets = [d.envelope.target_average_value for d in decisions]
    assert targets == [24.0, 19.2, 19.2, 15.36, 15.36, 12.288]
    assert decisions[1].reason == Action.SCALED_FOR_SLO


def test_slo_guard_leaves_the_target_while_a_backlog_drains() -> None:
    # Serving 32 req/s of the 30 arriving: the queue shrinks by itself; a lower target
    # would leave the fleet oversized once it is gone.
    engine = signals(ttft_p95_seconds=1.5, requests_per_second=32.0, arrivals_per_second=30.0)
    decisions = run(spec(), [snapshot(engine, workload(replicas=8))] * 6)
    assert {d.envelope.target_average_value for d in decisions} == {24.0}


def test_slo_guard_waits_while_new_pods_warm() -> None:
    engine = signals(ttft_p95_seconds=1.5)
    decisions = run(spec(), [snapshot(engine, workload(replicas=8, cold_pods=2))] * 6)
    assert {d.envelope.target_average_value for d in decisions} == {24.0}


def test_slo_alert_names_the_trade_off_when_the_budget_forbids_scaling() -> None:
    engine = signals(ttft_p95_seconds=1.5)
    decisions = run(spec(), [snapshot(engine, workload(replicas=12, hpa=(4, 12, 24.0)))] * 3)
    (raised,) = decisions[-1].raised
    assert raised.reason == Diagnosis.SLO_AT_RISK
    assert "replicas at the 12 the budget of 780 GPU-s/1k allows" in raised.message


# --- --max-num-seqs -------------------------------------------------------------------


def pressured(seqs: int, running: float = 60.0) -> object:
    engine = signals(hit=0.3, preemptions_per_second=1.0, running_requests_per_pod=running)
    return snapshot(engine, workload(max_num_seqs=seqs))


def test_sustained_eviction_lowers_by_at_most_a_quarter() -> None:
    decisions = run(spec(batching=BATCHING), [pressured(128)] * 3)
    assert [d.max_num_seqs for d in decisions] == [128, 128, 96]
    assert decisions[-1].reason == Action.LOWERED_MAX_NUM_SEQS
    assert "--max-num-seqs 128 → 96" in decisions[-1].message


def test_never_below_b_max() -> None:
    decisions = run(spec(batching=BATCHING), [pressured(60)] * 3)
    assert decisions[-1].max_num_seqs == 50  # 25% would be 45; B_max is 50


def test_one_change_per_cooldown_even_across_a_restart() -> None:
    policy = spec(batching=BATCHING)
    first = run(policy, [pressured(128)] * 3)[-1]
    assert first.max_num_seqs == 96
    # The operator restarts: the memory comes back from its JSON form.
    restored = LearnedState.model_validate_json(first.memory.model_dump_json())
    later = run(policy, [pressured(96)] * 3, restored, start=T0 + 3 * INTERVAL)
    assert [d.max_num_seqs for d in later] == [96, 96, 96]
    assert "cooldown" in later[-1].notes[0]
    after = run(policy, [pressured(96)], later[-1].memory, start=T0 + timedelta(minutes=31))
    assert after[0].max_num_seqs == 72


def test_no_change_during_a_rollout() -> None:
    engine = signals(hit=0.3, preemptions_per_second=1.0, running_requests_per_pod=60)
    rolling = snapshot(engine, workload(max_num_seqs=128, rollout=True))
    decisions = run(spec(batching=BATCHING), [rolling] * 3)
    assert decisions[-1].max_num_seqs == 128
    assert decisions[-1].notes == ("a rollout is in progress",)


def test_a_cache_that_does_not_hit_buys_throughput() -> None:
    busy = snapshot(signals(hit=0.1, waiting_requests_per_pod=2.0), workload(max_num_seqs=32))
    memory = learned(baseline=LearnedBaseline(token_hit_rate=0.1, evaluations=100))
    decisions = run(spec(batching=BATCHING), [busy] * 21, memory)
    assert [d.max_num_seqs for d in decisions].index(40) == 19  # 20 evaluations = 10 min


@pytest.mark.parametrize(
    "engine",
    [signals(hit=0.25, waiting_requests_per_pod=2.0), signals(hit=0.1, running_requests_per_pod=5)],
)
def test_no_raise_when_the_cache_hits_or_the_batch_is_idle(engine: object) -> None:
    memory = learned(baseline=LearnedBaseline(token_hit_rate=0.1, evaluations=100))
    decisions = run(spec(batching=BATCHING), [snapshot(engine, workload())] * 25, memory)  # type: ignore[arg-type]
    assert {d.max_num_seqs for d in decisions} == {32}


def test_unmanaged_ceiling_is_never_changed_and_eviction_alerts_instead() -> None:
    decisions = run(spec(), [pressured(128, running=120)] * 3)
    assert {d.max_num_seqs for d in decisions} == {128}
    assert decisions[-1].alert_active(Diagnosis.EVICTION_PRESSURE)
    assert "not managed" in decisions[-1].alerts[-1].message


def test_out_of_bounds_ceiling_is_clamped() -> None:
    (decision,) = run(spec(batching=BATCHING), [snapshot(fleet=workload(max_num_seqs=512))])
    assert decision.max_num_seqs == 256
    assert decision.reason == Action.CLAMPED_MAX_NUM_SEQS


def slo_at_risk(seqs: int, hit: float = 0.6, **values: float | None) -> object:
    """TTFT p95 1.5 s against a 1 s SLO, no preemptions, the warm hit rate ``hit`` (the
    baseline is 0.85: 0.6 is depressed, not collapsed)."""
    engine = signals(hit=hit, ttft_p95_seconds=1.5, **values)
    return snapshot(engine, workload(max_num_seqs=seqs))


def test_a_breached_slo_with_a_depressed_cache_keeps_stepping_toward_b_max() -> None:
    decisions = run(spec(batching=BATCHING), [slo_at_risk(72)] * 3)
    assert [d.max_num_seqs for d in decisions] == [72, 72, 54]
    assert decisions[-1].reason == Action.LOWERED_MAX_NUM_SEQS
    assert (
        "--max-num-seqs 72 → 54: SLO at risk for 3 evaluations with the batch above the "
        "cache-friendly ceiling B_max 50 and the warm hit rate 0.60 under its baseline 0.85"
    ) in decisions[-1].message


def test_the_slo_rule_continues_where_eviction_pressure_stopped() -> None:
    policy = spec(batching=BATCHING)
    lowered = run(policy, [pressured(96)] * 3)[-1]
    assert lowered.max_num_seqs == 72
    # Preemptions stop; the SLO stays breached and the cache depressed.
    later = run(policy, [slo_at_risk(72)] * 3, lowered.memory, start=T0 + timedelta(minutes=31))
    assert later[-1].max_num_seqs == 54


def test_the_slo_rule_stops_at_b_max() -> None:
    policy = spec(batching=BATCHING)
    assert run(policy, [slo_at_risk(60)] * 3)[-1].max_num_seqs == 50  # 25% would be 45
    at_b_max = run(policy, [slo_at_risk(50)] * 5)
    assert {d.max_num_seqs for d in at_b_max} == {50}
    assert "--max-num-seqs" not in at_b_max[-1].message


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (
            slo_at_risk(72, hit=0.8),
            "--max-num-seqs stays 72: the warm hit rate 0.80 is within 10% of its baseline "
            "0.85, so the batch is not what costs the cache",
        ),
        (
            slo_at_risk(72, hit=0.04),
            "--max-num-seqs stays 72: a prefix collapse is active: the prompts emptied the "
            "cache, not the batch",
        ),
        (
            slo_at_risk(72, context_tokens_per_request=None),
            "SLO at risk for 3 evaluations; --max-num-seqs stays 72: B_max is unknown "
            "(no context length)",
        ),
    ],
    ids=["cache-healthy", "collapse-active", "b-max-unknown"],
)
def test_the_slo_rule_says_why_it_does_not_step(state: object, why: str) -> None:
    decisions = run(spec(batching=BATCHING), [state] * 3)  # type: ignore[list-item]
    assert {d.max_num_seqs for d in decisions} == {72}
    assert decisions[-1].reason != Action.LOWERED_MAX_NUM_SEQS
    assert why in decisions[-1].message


def test_no_slo_step_while_the_slo_is_met() -> None:
    met = snapshot(signals(hit=0.6), workload(max_num_seqs=72))
    decisions = run(spec(batching=BATCHING), [met] * 5)
    assert {d.max_num_seqs for d in decisions} == {72}
    assert "SLO at risk" not in decisions[-1].message


def test_a_blocked_slo_step_names_the_cooldown() -> None:
    memory = learned(last_max_num_seqs_change_at=T0 - timedelta(minutes=5))
    decisions = run(spec(batching=BATCHING), [slo_at_risk(72)] * 3, memory)
    assert decisions[-1].max_num_seqs == 72
    assert decisions[-1].notes == (
        "cooldown: the last change was 6 min ago; next possible in 24 min",
    )
    assert "under its baseline 0.85; --max-num-seqs stays 72: cooldown" in decisions[-1].message


def test_a_raise_for_throughput_stops_at_b_max_while_the_slo_rule_holds() -> None:
    # Baseline 0.3, warm rate 0.15: under LOW_HIT_RATE, depressed, not collapsed (0.1).
    memory = learned(baseline=LearnedBaseline(token_hit_rate=0.3, evaluations=100))
    busy = slo_at_risk(44, hit=0.15, waiting_requests_per_pod=2.0)
    decisions = run(spec(batching=BATCHING), [busy] * 21, memory)
    assert max(d.max_num_seqs or 0 for d in decisions) == 50  # 25% more would be 55
    raised = next(d for d in decisions if d.reason == Action.RAISED_MAX_NUM_SEQS)
    assert "--max-num-seqs 44 → 50" in raised.message
    assert "up to B_max 50" in raised.message


# --- humans and memory ----------------------------------------------------------------


def collapsed_memory() -> LearnedState:
    engine = signals(hit=0.04)
    return run(spec(), [snapshot(engine)] * 3)[-1].memory


def test_acknowledging_a_collapse_releases_the_hold_but_keeps_the_alert() -> None:
    memory = collapsed_memory()
    human = HumanRequests(acknowledge_at=T0 + 3 * INTERVAL)
    later = T0 + 4 * INTERVAL
    decision = decide(spec(), snapshot(signals(hit=0.04), human=human), memory, later)
    assert decision.alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert decision.alerts[0].acknowledged
    assert decision.envelope.max_replicas == 12  # the budget's, not the hold's 11
    assert "collapse acknowledged" in decision.notes[0]


def test_rebaseline_accepts_the_new_hit_rate() -> None:
    memory = collapsed_memory()
    human = HumanRequests(rebaseline_at=T0 + 3 * INTERVAL)
    later = T0 + 4 * INTERVAL
    decision = decide(spec(), snapshot(signals(hit=0.04), human=human), memory, later)
    assert not decision.alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert [c.reason for c in decision.cleared] == [Diagnosis.PREFIX_COLLAPSE]  # one Normal Event
    assert decision.memory.baseline.token_hit_rate == pytest.approx(0.04)
    again = decide(
        spec(), snapshot(signals(hit=0.04), human=human), decision.memory, later + INTERVAL
    )
    assert again.memory.baseline.evaluations == 2  # the same request is not handled twice


def test_memory_round_trips_through_json_exactly() -> None:
    memory = collapsed_memory()
    assert LearnedState.model_validate_json(memory.model_dump_json()) == memory
    wire = memory.to_wire()
    assert "streaks" in wire
    assert LearnedState.model_validate(wire) == memory


def test_hold_and_slo_guard_do_not_alternate() -> None:
    policy = spec(budget={"gpuSecondsPer1kRequests": 1200})  # allows 19
    fleet = workload(replicas=14)

    def at(p95: float) -> object:
        return snapshot(signals(hit=0.04, ttft_p95_seconds=p95, running_requests_per_pod=40), fleet)

    tops = [
        d.envelope.max_replicas
        for d in run(policy, [at(0.5)] * 3 + [at(2.5)] * 2 + [at(0.9)] * 3 + [at(0.5)] * 11)  # type: ignore[list-item]
    ]
    assert tops[2] == 11  # held
    assert tops[4] == 19  # two breaching windows: released to the budget
    assert tops[5:8] == [19, 19, 19]  # no breach, but not comfortable: stays released
    assert tops[-1] == 11  # comfortable (p95 < 0.7 s) for a whole window: held again
