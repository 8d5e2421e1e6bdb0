"""The status conditions (``decide.conditions``): what ``CacheHealthy``, ``WithinBudget``
and ``ScalingHeld`` read after an evaluation, as tables of cases. A failing condition names
its diagnosis; Unknown says why it cannot tell."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cachescale.api.reasons import AnyConditionReason, ConditionReason, Diagnosis, Hold
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide.conditions import ConditionVerdict, conditions
from cachescale.decide.diagnosis import facts_of, findings, run_checks
from cachescale.decide.envelope import Envelope, EnvelopePlan
from cachescale.decide.learned import LearnedState, Streaks
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import learned, signals, snapshot, spec, workload


def verdict(
    kind: ConditionType,
    state: Snapshot,
    memory: LearnedState,
    plan: EnvelopePlan | None = None,
    hpa_wanted: int | None = None,
) -> ConditionVerdict:
    """The ``kind`` condition after checking ``state`` against the default policy."""
    policy = spec()
    results = run_checks(policy, state, memory)
    found = findings(facts_of(policy, state, memory, results))
    plan = plan or EnvelopePlan(Envelope(4, 40, 24.0), None, None, False, memory)
    every = conditions(policy, state, memory, results, found, plan, hpa_wanted)
    return next(c for c in every if c.type is kind)


@dataclass(frozen=True)
class ConditionCase:
    """A fleet, what was learned, and the condition it must read."""

    name: str
    state: Snapshot
    status: ConditionStatus
    reason: AnyConditionReason
    message: str
    """What the message starts with."""
    memory: LearnedState = field(default_factory=learned)


# The builders' baseline: a warm hit rate of 0.85, 680 GPU-s/1k against a 780 budget;
# collapseWindows 3.
CACHE_CASES = [
    ConditionCase(
        "at its baseline",
        snapshot(),
        ConditionStatus.TRUE,
        ConditionReason.HIT_RATE_AT_BASELINE,
        "warm-pod token hit rate 0.85 against a baseline of 0.85",
    ),
    ConditionCase(
        "no warm pod to read",
        snapshot(signals(warm_pods=0, cold_pods=11), workload(cold_pods=11)),
        ConditionStatus.UNKNOWN,
        ConditionReason.NO_WARM_PODS,
        "",
    ),
    ConditionCase(
        "a collapse building is suspected, not confirmed",
        snapshot(signals(hit=0.3)),
        ConditionStatus.UNKNOWN,
        ConditionReason.COLLAPSE_SUSPECTED,
        "warm-pod token hit rate 0.30 under the collapse threshold",
        memory=learned(streaks=Streaks(collapse=1)),
    ),
    ConditionCase(
        "no baseline yet",
        snapshot(),
        ConditionStatus.UNKNOWN,
        ConditionReason.LEARNING_BASELINE,
        "warm-pod token hit rate 0.85; no baseline yet",
        memory=LearnedState(),
    ),
    ConditionCase(
        "a confirmed collapse names it",
        snapshot(signals(hit=0.04)),
        ConditionStatus.FALSE,
        Diagnosis.PREFIX_COLLAPSE,
        "token hit rate 0.85 → 0.04",
        memory=learned(streaks=Streaks(collapse=3)),
    ),
]


@pytest.mark.parametrize("case", CACHE_CASES, ids=lambda case: case.name)
def test_cache_healthy(case: ConditionCase) -> None:
    read = verdict(ConditionType.CACHE_HEALTHY, case.state, case.memory)
    assert (read.status, read.reason) == (case.status, case.reason)
    assert read.message.startswith(case.message)


BUDGET_CASES = [
    ConditionCase(
        "within the budget",
        snapshot(),
        ConditionStatus.TRUE,
        ConditionReason.COST_WITHIN_BUDGET,
        "680 GPU-s per 1k requests within the budget of 780",
    ),
    ConditionCase(
        "over the budget names it",
        snapshot(signals(gpu_seconds_per_1k_requests=900.0)),
        ConditionStatus.FALSE,
        Diagnosis.OVER_BUDGET,
        "900 GPU-s per 1k requests against a budget of 780",
    ),
    ConditionCase(
        "an unknown cost",
        snapshot(signals(gpu_seconds_per_1k_requests=None)),
        ConditionStatus.UNKNOWN,
        ConditionReason.COST_UNKNOWN,
        "series absent",
    ),
]


@pytest.mark.parametrize("case", BUDGET_CASES, ids=lambda case: case.name)
def test_within_budget(case: ConditionCase) -> None:
    read = verdict(ConditionType.WITHIN_BUDGET, case.state, case.memory)
    assert (read.status, read.reason) == (case.status, case.reason)
    assert read.message.startswith(case.message)


# True only while maxReplicas binds: the fleet runs at it, or the HPA asks for more.
@pytest.mark.parametrize(
    ("held_by", "replicas", "hpa_wanted", "status", "reason", "message"),
    [
        (
            Hold.COLLAPSE,
            11,
            None,
            ConditionStatus.TRUE,
            Hold.COLLAPSE,
            "maxReplicas held at the pre-collapse level 12",
        ),
        (
            Hold.BUDGET,
            12,
            None,
            ConditionStatus.TRUE,
            Hold.BUDGET,
            "maxReplicas capped at 12, what the GPU-s/1k budget allows at the current req/s",
        ),
        (
            Hold.BUDGET,
            11,
            13,
            ConditionStatus.TRUE,
            Hold.BUDGET,
            "maxReplicas capped at 12, what the GPU-s/1k budget allows at the current req/s",
        ),
        (
            Hold.BUDGET,
            11,
            12,
            ConditionStatus.FALSE,
            ConditionReason.NOT_HELD,
            "maxReplicas 12 does not bind",
        ),
        (
            None,
            12,
            14,
            ConditionStatus.FALSE,
            ConditionReason.NOT_HELD,
            "maxReplicas 12 does not bind",
        ),
    ],
    ids=[
        "a collapse hold",
        "the budget at the fleet's size",
        "the budget under the HPA's ask",
        "the budget with room",
        "no hold",
    ],
)
def test_scaling_held(
    held_by: Hold | None,
    replicas: int,
    hpa_wanted: int | None,
    status: ConditionStatus,
    reason: AnyConditionReason,
    message: str,
) -> None:
    memory = learned()
    plan = EnvelopePlan(Envelope(4, 12, 24.0), 12, held_by, False, memory)
    state = snapshot(fleet=workload(replicas=replicas, hpa=(4, 12, 24.0)))
    read = verdict(ConditionType.SCALING_HELD, state, memory, plan, hpa_wanted)
    assert (read.status, read.reason, read.message) == (status, reason, message)
