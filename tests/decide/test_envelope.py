"""The HPA envelope (``decide.envelope``): the budget cap, a collapse hold and its release,
the demand-alone floor and the stabilization window, through ``decide`` and as a table of
``plan_envelope`` cases."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from cachescale.api.reasons import ConditionReason, Diagnosis, Hold
from cachescale.api.spec import MAX_REPLICAS, CacheScalingPolicySpec
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide.envelope import Envelope, EnvelopeFacts, hold_level, plan_envelope
from cachescale.decide.learned import EnvelopeMark, LearnedState, ReplicaMark, Streaks
from cachescale.decide.slo_floors import MinFloor
from cachescale.decide.slo_guard import Drain, slo_needed_replicas
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    T0,
    condition,
    learned,
    run,
    short_fleet,
    signals,
    snapshot,
    spec,
    workload,
)

PREFILL_DEARER = 600.0
"""Prefill tokens per request 1.5 × the builders' 400 baseline: requests got dearer."""


def test_budget_caps_max_replicas_at_the_observed_rate() -> None:
    # 780 GPU-s/1k × 32 req/s / (1000 × 2 GPUs) = 12.48 → 12, once requests got dearer.
    dearer = snapshot(signals(prefill_tokens_per_request=PREFILL_DEARER))
    (decision,) = run(spec(), [dearer])
    assert decision.budget_max_replicas == 12
    assert (decision.envelope.min_replicas, decision.envelope.max_replicas) == (4, 12)
    # The HPA's metric asks for 10 (11 pods × 20 running / 24): the cap does not bind.
    assert condition(decision, ConditionType.SCALING_HELD) == (
        ConditionStatus.FALSE,
        ConditionReason.NOT_HELD,
    )
    # Asking for 14 at a cost per request over the budget: held at the budget's 12.
    over = snapshot(signals(running_requests_per_pod=30.0, gpu_seconds_per_1k_requests=800.0))
    (held,) = run(spec(), [over])
    assert held.envelope.max_replicas == 12
    assert condition(held, ConditionType.SCALING_HELD) == (ConditionStatus.TRUE, Hold.BUDGET)


def test_rising_demand_at_a_steady_cost_is_not_held_by_the_windowed_allowance() -> None:
    # At the baseline cost (680 GPU-s/1k, the budget's 780) maxReplicas keeps half again
    # the 11 replicas, 17, above the 12 the windowed allowance gives: the HPA's next step
    # on a rise is not held; asking for 19 (11 × 40 / 24), it gets 19 at once.
    (steady,) = run(spec(), [snapshot()])
    assert steady.envelope.max_replicas == 17
    assert "budget allows 12; room for rising demand 17 (requests cost what they did)" in (
        steady.message
    )
    (rising,) = run(spec(), [snapshot(signals(running_requests_per_pod=40.0))])
    assert rising.envelope.max_replicas == 19
    assert condition(rising, ConditionType.SCALING_HELD) == (
        ConditionStatus.FALSE,
        ConditionReason.NOT_HELD,
    )


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
    ("action", "max_replicas", "held"),
    [
        ("Hold", 11, Hold.COLLAPSE),
        ("CapAtBudget", 19, Hold.BUDGET),
        ("ScaleAsUsual", 19, Hold.BUDGET),
    ],
)
def test_collapse_actions(action: str, max_replicas: int, held: str) -> None:
    *_, decision = collapse(action)
    assert decision.envelope.max_replicas == max_replicas
    assert decision.alert_active(Diagnosis.PREFIX_COLLAPSE)  # every action alerts
    assert condition(decision, ConditionType.SCALING_HELD) == (ConditionStatus.TRUE, held)


def test_hold_lets_the_slo_guard_scale_inside_the_budget() -> None:
    *_, decision = collapse("Hold", p95=2.5)
    assert decision.envelope.max_replicas == 19
    message = decision.alerts[0].message
    assert "TTFT breaches the SLO, so replicas may grow to the budget's 19" in message


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
    # Requests got dearer (``PREFILL_DEARER``), so the budget binds.
    rates = [32.0] * 2 + [24.0] * 4 + [32.0] * 2 + [24.0] * 12
    snapshots = [
        snapshot(
            signals(requests_per_second=r, prefill_tokens_per_request=PREFILL_DEARER),
            workload(hpa=(4, 12, 24.0)),
        )
        for r in rates
    ]
    max_replicas = [d.envelope.max_replicas for d in run(spec(), snapshots)]
    assert max_replicas[:8] == [12] * 8  # the dip was shorter than the window: nothing lowered
    assert max_replicas[8:17] == [12] * 9  # 300 s of recommendations at 9 needed before lowering
    assert max_replicas[17:] == [9] * 3


def test_hold_and_slo_guard_do_not_alternate() -> None:
    policy = spec(budget={"gpuSecondsPer1kRequests": 1200})  # allows 19
    fleet = workload(replicas=14)

    def at(p95: float) -> object:
        return snapshot(signals(hit=0.04, ttft_p95_seconds=p95, running_requests_per_pod=40), fleet)

    max_replicas = [
        d.envelope.max_replicas
        for d in run(policy, [at(0.5)] * 3 + [at(2.5)] * 2 + [at(0.9)] * 3 + [at(0.5)] * 11)  # type: ignore[list-item]
    ]
    assert max_replicas[2] == 11  # held
    assert max_replicas[4] == 19  # two breaching windows: released to the budget
    assert max_replicas[5:8] == [19, 19, 19]  # no breach, but not comfortable: stays released
    assert max_replicas[-1] == 11  # comfortable (p95 < 0.7 s) for a whole window: held again


# --- plan_envelope, case by case --------------------------------------------------------
#
# The builders' defaults: a Hold policy (budget 780 GPU-s/1k, replicas 4..40, SLO 1 s, a
# 5 min window read every 30 s), 11 ready pods serving 32 req/s (arrivals unknown), the
# HPA at 4..40 on the running batch with a target of 24, a baseline of 680 GPU-s/1k, and a
# pre-collapse mark of 11 pods at 32 req/s. The demand alone needs
# ceil(680 × 32 / (1000 × 2)) = 11 replicas in every case. ``short_fleet``: 12 pods serve
# 28 of the 32 arriving req/s with 3 waiting each, the HPA at 4..12 asking for
# ceil(12 × 40 / 24) = 20; with two breaching evaluations the SLO estimate is
# ceil(12 × (32 / 28) / 0.85) = ceil(16.13) = 17 and its floor ceil(17 × 0.85) = 15.


@dataclass(frozen=True)
class EnvelopeCase:
    """One evaluation's inputs to ``plan_envelope`` and what it must decide."""

    name: str
    facts: EnvelopeFacts
    envelope: Envelope
    held_by: Hold | None = None
    slo_guard: bool = False
    slo_needed: int | None = None
    drain: Drain | None = None
    min_floor: tuple[int, MinFloor] | None = None
    policy: CacheScalingPolicySpec = field(default_factory=spec)
    state: Snapshot = field(default_factory=snapshot)
    memory: LearnedState = field(default_factory=learned)


def budget(allows: int | None, **facts: bool | int) -> EnvelopeFacts:
    """What the diagnosis found: the budget allows ``allows`` replicas (None: unknown)."""
    return EnvelopeFacts(
        collapse_held=bool(facts.get("collapse_held", False)),
        slo_breached=bool(facts.get("slo_breached", False)),
        budget_max=allows,
        max_num_seqs=int(facts["max_num_seqs"]) if "max_num_seqs" in facts else None,
        over_budget=bool(facts.get("over_budget", False)),
        collapse_active=bool(facts.get("collapse_active", False)),
        requests_got_dearer=bool(facts.get("dearer", False)),
    )


def breaching(evaluations: int = 2, **overrides: object) -> LearnedState:
    """The learned state after ``evaluations`` breaching evaluations in a row."""
    return learned(streaks=Streaks(slo_breach=evaluations), **overrides)


SECONDS = timedelta(seconds=1)
WAITING_QUEUE = "vllm:num_requests_waiting"

BUSY = snapshot(signals(running_requests_per_pod=40.0))
"""11 pods running 40 requests each at a target of 24: the HPA asks for 19."""

# The budget binds only where a rise in the HPA's metric may be cost, not demand: the
# cases about the cap and its stabilization say requests got dearer (``dearer``). At a
# steady cost maxReplicas keeps room over the current replicas (the first cases).
ENVELOPE_CASES = [
    EnvelopeCase(
        "rising demand at a steady cost: maxReplicas lets the HPA follow it",
        # What the HPA asks for (19) over the budget's windowed allowance (12), at once.
        budget(12),
        Envelope(4, 19, 24.0),
        state=BUSY,
    ),
    EnvelopeCase(
        "the room for rising demand is at least half again the current replicas",
        # 11 × 25 / 24 asks for 12; 11 + ceil(0.5 × 11) = 17 leaves the next step room.
        budget(12),
        Envelope(4, 17, 24.0),
        state=snapshot(signals(running_requests_per_pod=25.0)),
    ),
    EnvelopeCase(
        "dearer requests: the budget binds",
        budget(12, dearer=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=BUSY,
    ),
    EnvelopeCase(
        "a cost per request over the budget: the budget binds",
        budget(12, over_budget=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=BUSY,
    ),
    EnvelopeCase(
        "a collapse alert that lasts: the budget binds",
        budget(12, collapse_active=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=BUSY,
    ),
    EnvelopeCase(
        "CapAtBudget: the budget binds whatever the demand",
        budget(12),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        policy=spec(cache={"onCollapse": "CapAtBudget"}),
        state=BUSY,
    ),
    EnvelopeCase(
        "an unknown cost per request: the budget binds",
        budget(12),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=snapshot(signals(running_requests_per_pod=30.0, gpu_seconds_per_1k_requests=None)),
    ),
    EnvelopeCase(
        "the room for demand is never above the hard cap",
        # budget.maxReplicas is the user's own top, not a hold.
        budget(12),
        Envelope(4, 13, 24.0),
        policy=spec(budget={"maxReplicas": 13}),
        state=BUSY,
    ),
    EnvelopeCase(
        "the budget caps maxReplicas and holds it",
        # 12 < budget.maxReplicas 40: held by the budget; no earlier mark in the window,
        # so the lowering from 40 takes the recommendation at once.
        budget(12, dearer=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
    ),
    EnvelopeCase(
        "an allowance above the hard cap is clamped to it and holds nothing",
        budget(50),
        Envelope(4, 40, 24.0),
    ),
    EnvelopeCase(
        "an unknown rate keeps the current maxReplicas",
        budget(None),
        Envelope(4, 20, 24.0),
        state=snapshot(fleet=workload(hpa=(4, 20, 24.0))),
    ),
    EnvelopeCase(
        "never below what the demand needs at the baseline cost",
        # The budget allows 8; the demand alone needs 11: 11, still held by the budget.
        budget(8, dearer=True),
        Envelope(4, 11, 24.0),
        held_by=Hold.BUDGET,
    ),
    EnvelopeCase(
        "the user's minReplicas is raised into the budget's range",
        budget(12, dearer=True),
        Envelope(6, 12, 24.0),
        held_by=Hold.BUDGET,
        policy=spec(budget={"minReplicas": 6}),
        state=snapshot(fleet=workload(hpa=(2, 40, 24.0))),
    ),
    EnvelopeCase(
        "a confirmed collapse holds at the pre-collapse level",
        # The mark: 11 pods at 32 req/s, demand unchanged: 11 < the budget's 19.
        budget(19, collapse_held=True),
        Envelope(4, 11, 24.0),
        held_by=Hold.COLLAPSE,
    ),
    EnvelopeCase(
        "the hold follows demand growth since the mark",
        # 10 pods at 20 req/s, 32 now: ceil(10 × 32 / 20) = 16.
        budget(19, collapse_held=True),
        Envelope(4, 16, 24.0),
        held_by=Hold.COLLAPSE,
        memory=learned(pre_collapse=ReplicaMark(replicas=10, requests_per_second=20.0, at=T0)),
    ),
    EnvelopeCase(
        "a hold at or above the budget's allowance is no hold",
        # The hold's 11 is not under the budget's 10; the demand alone lifts 10 to 11.
        budget(10, collapse_held=True),
        Envelope(4, 11, 24.0),
        held_by=Hold.BUDGET,
    ),
    EnvelopeCase(
        "a confirmed breach releases the hold to the budget and lowers the target",
        # Released: the budget's 19. The target falls a step (24 × 0.8 = 19.2) on the
        # second breaching evaluation: 11 replicas leave room under 19, every pod is
        # ready and settled, and arrivals unknown count as falling behind.
        budget(19, collapse_held=True),
        Envelope(4, 19, 19.2),
        held_by=Hold.BUDGET,
        slo_guard=True,
        state=snapshot(signals(ttft_p95_seconds=2.5)),
        memory=breaching(),
    ),
    EnvelopeCase(
        "a released hold stays released until a whole window of comfortable latency",
        # 9 comfortable evaluations: a window is ceil(300 / 30) = 10.
        budget(19, collapse_held=True),
        Envelope(4, 19, 24.0),
        held_by=Hold.BUDGET,
        slo_guard=True,
        memory=learned(hold_released_for_slo=True, streaks=Streaks(slo_comfortable=9)),
    ),
    EnvelopeCase(
        "a whole comfortable window holds again",
        budget(19, collapse_held=True),
        Envelope(4, 11, 24.0),
        held_by=Hold.COLLAPSE,
        memory=learned(hold_released_for_slo=True, streaks=Streaks(slo_comfortable=10)),
    ),
    EnvelopeCase(
        "the SLO estimate lifts maxReplicas above the budget and floors minReplicas",
        # maxReplicas 17 (the estimate), minReplicas 15 (its pods without the headroom),
        # the target a step lower: 12 replicas leave room under 17.
        budget(12, dearer=True),
        Envelope(15, 17, 19.2),
        slo_guard=True,
        slo_needed=17,
        min_floor=(15, MinFloor.SLO_NEED),
        state=short_fleet(),
        memory=breaching(),
    ),
    EnvelopeCase(
        "under CapAtBudget the estimate is reported, not applied",
        # No room under the budget's 12 at 12 replicas: the target stays.
        budget(12),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        slo_needed=17,
        policy=spec(cache={"onCollapse": "CapAtBudget"}),
        state=short_fleet(),
        memory=breaching(),
    ),
    EnvelopeCase(
        "a backlog the estimate drains slowly lifts maxReplicas to drain it",
        # 150 waiting on each of 12 pods: ceil(12 × (32 + 1,800 / 600) / 28 / 0.85) =
        # ceil(17.65) = 18, under the HPA's 20 and above the estimate's 17.
        budget(12, dearer=True),
        Envelope(15, 18, 19.2),
        slo_guard=True,
        slo_needed=17,
        drain=Drain(waiting=1800, replicas=18),
        min_floor=(15, MinFloor.SLO_NEED),
        state=short_fleet(waiting=150.0),
        memory=breaching(),
    ),
    EnvelopeCase(
        "the backlog's maxReplicas is never above what the HPA asks for",
        # 600 waiting each: ceil(12 × (32 + 7,200 / 600) / 28 / 0.85) = ceil(22.18) = 23,
        # bounded by the HPA's 20.
        budget(12, dearer=True),
        Envelope(15, 20, 19.2),
        slo_guard=True,
        slo_needed=17,
        drain=Drain(waiting=7200, replicas=20),
        min_floor=(15, MinFloor.SLO_NEED),
        state=short_fleet(waiting=600.0),
        memory=breaching(),
    ),
    EnvelopeCase(
        "a target on the running batch stays under the batch ceiling",
        # 0.75 × 20 = 15 < 24.
        budget(12, max_num_seqs=20, dearer=True),
        Envelope(4, 12, 15.0),
        held_by=Hold.BUDGET,
    ),
    EnvelopeCase(
        "a target on the queue is not bound by the batch ceiling",
        budget(12, max_num_seqs=20, dearer=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=short_fleet(waiting=0.0, arrivals=None, served=32.0, metric=WAITING_QUEUE, p95=0.5),
    ),
    EnvelopeCase(
        "a lowering waits for the highest recommendation of the window",
        # 16 recommended a minute ago: min(20 now, max(16, 12)) = 16.
        budget(12, dearer=True),
        Envelope(4, 16, 24.0),
        held_by=Hold.BUDGET,
        state=snapshot(fleet=workload(hpa=(4, 20, 24.0))),
        memory=learned(max_replicas_marks=[EnvelopeMark(at=T0 - 60 * SECONDS, max_replicas=16)]),
    ),
    EnvelopeCase(
        "a recommendation just inside the window still holds a lowering",
        budget(12, dearer=True),
        Envelope(4, 16, 24.0),
        held_by=Hold.BUDGET,
        state=snapshot(fleet=workload(hpa=(4, 20, 24.0))),
        memory=learned(max_replicas_marks=[EnvelopeMark(at=T0 - 299 * SECONDS, max_replicas=16)]),
    ),
    EnvelopeCase(
        "a recommendation a whole window old no longer holds a lowering",
        budget(12, dearer=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=snapshot(fleet=workload(hpa=(4, 20, 24.0))),
        memory=learned(max_replicas_marks=[EnvelopeMark(at=T0 - 300 * SECONDS, max_replicas=16)]),
    ),
    EnvelopeCase(
        "a raise inside the window after a lowering is refused",
        budget(16, dearer=True),
        Envelope(4, 12, 24.0),
        held_by=Hold.BUDGET,
        state=snapshot(fleet=workload(hpa=(4, 12, 24.0))),
        memory=learned(
            last_max_replicas_change_at=T0 - 60 * SECONDS, last_max_replicas_direction=-1
        ),
    ),
    EnvelopeCase(
        "the SLO's estimate outlasts the breach while requests stay dearer",
        # No breach now and the cost within budget, but requests still dearer: the 19 the
        # SLO needed is kept (a cost held in budget by a short fleet ends nothing).
        budget(12, dearer=True),
        Envelope(4, 19, 24.0),
        slo_guard=True,
        slo_needed=19,
        memory=learned(slo_needed=ReplicaMark(replicas=19, requests_per_second=32.0, at=T0)),
    ),
    EnvelopeCase(
        "the SLO's estimate is released when requests cost what they did",
        # Nothing left of the incident: the estimate goes, and the room for demand stays.
        budget(12),
        Envelope(4, 17, 24.0),
        memory=learned(slo_needed=ReplicaMark(replicas=19, requests_per_second=32.0, at=T0)),
    ),
    EnvelopeCase(
        "a raise for rising demand is taken inside the window after a lowering",
        # Room at a steady cost (11 + 6): following demand is not a flap.
        budget(12),
        Envelope(4, 17, 24.0),
        state=snapshot(signals(running_requests_per_pod=30.0), workload(hpa=(4, 12, 24.0))),
        memory=learned(
            last_max_replicas_change_at=T0 - 60 * SECONDS, last_max_replicas_direction=-1
        ),
    ),
    EnvelopeCase(
        "a raise a whole window after a lowering is taken",
        budget(16, dearer=True),
        Envelope(4, 16, 24.0),
        held_by=Hold.BUDGET,
        state=snapshot(fleet=workload(hpa=(4, 12, 24.0))),
        memory=learned(
            last_max_replicas_change_at=T0 - 300 * SECONDS, last_max_replicas_direction=-1
        ),
    ),
    EnvelopeCase(
        "a collapse hold lowers at once, whatever the window recommended",
        budget(19, collapse_held=True),
        Envelope(4, 11, 24.0),
        held_by=Hold.COLLAPSE,
        state=snapshot(fleet=workload(hpa=(4, 20, 24.0))),
        memory=learned(max_replicas_marks=[EnvelopeMark(at=T0 - 60 * SECONDS, max_replicas=20)]),
    ),
]


@pytest.mark.parametrize("case", ENVELOPE_CASES, ids=lambda case: case.name)
def test_plan_envelope(case: EnvelopeCase) -> None:
    plan = plan_envelope(case.policy, case.state, case.memory, T0, case.facts)
    floor = (plan.min_floor, plan.min_floor_kind) if plan.min_floor is not None else None
    assert plan.envelope == case.envelope
    assert (plan.held_by, plan.slo_guard) == (case.held_by, case.slo_guard)
    assert (plan.slo_needed, plan.drain, floor) == (case.slo_needed, case.drain, case.min_floor)
    assert plan.demand_replicas == 11
    assert plan.budget_max == case.facts.budget_max
