"""The SLO guard (``decide.slo_guard``): the estimate of what the SLO needs, the
maxReplicas that drains a backlog and the target lever, through ``decide`` and as a table
of ``drain_max_replicas`` cases."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cachescale.api.reasons import Action
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.learned import Streaks
from cachescale.decide.slo_guard import Drain, drain_max_replicas
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    capped_at_budget,
    dearer_cache_without_a_queue,
    learned,
    run,
    short_fleet,
    signals,
    slo_first,
    snapshot,
    spec,
    workload,
)


def test_slo_first_lifts_the_cap_to_what_the_slo_needs_and_keeps_it() -> None:
    # ceil(12 ready × 32 arriving / 28 served / 0.85) = 17, above the budget's 12.
    decisions = slo_first("Hold", [0.5] * 3 + [2.5] * 2 + [0.5] * 12, applied=True)
    max_replicas = [d.envelope.max_replicas for d in decisions]
    assert max_replicas[2] == 11  # held at the pre-collapse 11 (the demand alone needs 10.9 → 11)
    assert max_replicas[4] == 17
    assert decisions[4].slo_needed_replicas == 17
    assert decisions[4].reason == "ScaledForSLO"
    # Latency recovered, the collapse alert is still active: the cap does not fall back.
    assert max_replicas[5:] == [17] * 12
    message = decisions[4].alerts[0].message
    assert "replicas may grow to 17, what the SLO needs at the current cost" in message
    assert "above the budget's 12" in message


def test_a_growing_queue_confirms_a_breach_for_the_estimate_at_its_first_evaluation() -> None:
    # 3 waiting per pod and 32 arriving against 28 served: the first breaching evaluation
    # makes the estimate, ceil(12 × 32 / 28 / 0.85) = 17, and maxReplicas is raised to it.
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


def test_a_backlog_the_estimate_would_drain_slowly_lifts_max_replicas_to_drain_it() -> None:
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


def test_a_drain_is_never_above_what_the_hpa_asks_for() -> None:
    # Its metric asks for ceil(12 × 30 / 24) = 15, under the estimate's 17: maxReplicas
    # is the estimate's, and no message speaks of a drain.
    *_, last = slo_first("Hold", [0.5] * 3 + [2.5] * 2, waiting=150.0, running=30.0)
    assert last.slo_needed_replicas == 17
    assert last.drain_replicas is None
    assert last.envelope.max_replicas == 17
    assert "to drain" not in last.message


def test_no_drain_on_a_queue_metric_without_an_estimate_or_under_cap_at_budget() -> None:
    # An HPA on the queue (KEDA's trigger) asks for ceil(12 × 150 / 24) = 75: no bound,
    # so no drain; the estimate's 17 is maxReplicas.
    *_, queue = slo_first(
        "Hold", [0.5] * 3 + [2.5] * 2, waiting=150.0, metric="vllm:num_requests_waiting"
    )
    assert queue.slo_needed_replicas == 17
    assert queue.drain_replicas is None
    assert queue.envelope.max_replicas == 17
    # 4 of the 12 pods still starting: the 8 that served need ceil(8 × 32 / 28 / 0.85) =
    # 11, which the budget's 12 covers. No estimate, so no drain: the fleet returns to
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


def test_a_draining_backlog_is_not_a_lack_of_replicas() -> None:
    # Serving 34 req/s of the 32 arriving: the queue is a backlog the fleet is draining.
    *_, last = slo_first("Hold", [0.5] * 3 + [2.5] * 3, served=34.0)
    assert last.slo_needed_replicas is None
    assert last.envelope.max_replicas < 17
    assert last.envelope.min_replicas == 4


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


def test_a_breach_the_hpa_does_not_ask_replicas_for_is_not_answered_with_replicas() -> None:
    # The same breach, but the HPA's metric asks for ceil(12 × 20 / 24) = 10: the cap is
    # not what stops it, and there is no queue, so the breach is not a lack of replicas.
    *_, last = capped_at_budget(running_per_pod=20.0)
    assert last.slo_needed_replicas is None
    assert (last.envelope.min_replicas, last.envelope.max_replicas) == (4, 12)


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


# --- drain_max_replicas, case by case ---------------------------------------------------
#
# ``short_fleet``: 12 ready pods serve 28 of the 32 arriving req/s, each running 40 (the
# HPA, 4..12 at a target of 24, asks for ceil(12 × 40 / 24) = 20); the SLO estimate is 17
# and TTFT has breached for two evaluations unless a case says otherwise. The rule:
# ceil(ready × (arrivals + waiting / 600 s) / served / 0.85), at most budget.maxReplicas
# and at most max(the HPA's ask, the current maxReplicas), and only above the estimate.


@dataclass(frozen=True)
class DrainCase:
    """A backlog and what draining it within ``DRAIN_SECONDS`` asks of maxReplicas."""

    name: str
    state: Snapshot
    drain: Drain | None
    slo_needed: int | None = 17
    breaching: int = 2
    policy: CacheScalingPolicySpec = field(default_factory=spec)


DRAIN_CASES = [
    DrainCase(
        "a backlog the estimate's headroom drains slowly",
        # 150 × 12 = 1,800 waiting: ceil(12 × (32 + 3) / 28 / 0.85) = ceil(17.65) = 18.
        short_fleet(waiting=150.0),
        Drain(waiting=1800, replicas=18),
    ),
    DrainCase(
        "at most what the HPA's own metric asks for",
        # 7,200 waiting: ceil(12 × (32 + 12) / 28 / 0.85) = ceil(22.18) = 23 → the HPA's 20.
        short_fleet(waiting=600.0),
        Drain(waiting=7200, replicas=20),
    ),
    DrainCase(
        "or the current maxReplicas when that is higher",
        short_fleet(waiting=600.0, hpa_max=22),
        Drain(waiting=7200, replicas=22),
    ),
    DrainCase(
        "at most budget.maxReplicas",
        short_fleet(waiting=600.0, hpa_max=22),
        Drain(waiting=7200, replicas=21),
        policy=spec(budget={"maxReplicas": 21}),
    ),
    DrainCase(
        "on the served rate when arrivals are unknown",
        # ceil(12 × (28 + 3) / 28 / 0.85) = ceil(15.63) = 16, above an estimate of 15.
        short_fleet(waiting=150.0, arrivals=None),
        Drain(waiting=1800, replicas=16),
        slo_needed=15,
    ),
    DrainCase(
        "nothing above the estimate",
        # 36 waiting: ceil(12 × (32 + 0.06) / 28 / 0.85) = ceil(16.16) = 17, the estimate.
        short_fleet(waiting=3.0),
        None,
    ),
    DrainCase(
        "the fleet's surplus drains it in time",
        # 720 waiting: 32 + 1.2 = 33.2 req/s to serve, and 34 are served.
        short_fleet(waiting=60.0, served=34.0),
        None,
    ),
    DrainCase("no queue", short_fleet(waiting=0.5), None),
    DrainCase("one breaching evaluation", short_fleet(waiting=150.0), None, breaching=1),
    DrainCase("no estimate", short_fleet(waiting=150.0), None, slo_needed=None),
    DrainCase(
        "not under CapAtBudget",
        short_fleet(waiting=150.0),
        None,
        policy=spec(cache={"onCollapse": "CapAtBudget"}),
    ),
    DrainCase(
        "not for an HPA on the queue",
        short_fleet(waiting=150.0, metric="vllm:num_requests_waiting"),
        None,
    ),
    DrainCase("no pod ready", short_fleet(waiting=150.0, ready=0), None),
    DrainCase("nothing served", short_fleet(waiting=150.0, served=0.0), None),
]


@pytest.mark.parametrize("case", DRAIN_CASES, ids=lambda case: case.name)
def test_drain_max_replicas(case: DrainCase) -> None:
    memory = learned(streaks=Streaks(slo_breach=case.breaching))
    assert drain_max_replicas(case.policy, case.state, memory, case.slo_needed) == case.drain


def test_a_drain_says_what_it_is_for() -> None:
    # DRAIN_SECONDS is 600 s: 10 min.
    assert Drain(waiting=1800, replicas=18).purpose() == (
        "to drain 1,800 waiting requests within 10 min"
    )
