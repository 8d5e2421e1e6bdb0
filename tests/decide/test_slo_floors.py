"""The SLO guard's floors on minReplicas (``decide.slo_floors``): raised to the pods the
SLO needs while TTFT breaches, held while a collapse alert lasts, released in steps.
The floor learned from a scale-down has its own file, ``test_scale_down_floor.py``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.learned import LearnedAlert, LearnedState, ReplicaCount, Streaks
from cachescale.decide.slo_floors import MinFloor, collapse_floor, released_floor, slo_floor
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    T0,
    dearer_cache_without_a_queue,
    learned,
    run_applied,
    slo_first,
    snapshot,
    spec,
    workload,
)


def test_slo_first_raises_min_replicas_to_what_the_slo_needs_while_it_breaches() -> None:
    # A raised maxReplicas only lets the HPA add replicas; its own metric may not ask for them.
    decisions = slo_first("Hold", [0.5] * 3 + [2.5] * 2 + [0.5] * 12, applied=True)
    mins = [d.envelope.min_replicas for d in decisions]
    assert mins[:4] == [4] * 4  # the user's own minReplicas before the breach is sustained
    # Second breaching evaluation: the pods that serve the 32 arriving req/s at the rate
    # each serves now, ceil(17 × 0.85) = 15 (maxReplicas keeps the headroom: 17).
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


# --- slo_floor and collapse_floor, case by case -----------------------------------------
#
# Both are the SLO estimate without its headroom, ceil(slo_needed × 0.85): the first while
# TTFT has breached for two evaluations, the second while a PrefixCollapse alert lasts;
# neither under CapAtBudget.

CAP_AT_BUDGET = {"cache": {"onCollapse": "CapAtBudget"}}
COLLAPSE_ALERT = [LearnedAlert(reason=Diagnosis.PREFIX_COLLAPSE, since=T0, message="m")]


@dataclass(frozen=True)
class FloorCase:
    """An estimate, the learned state, and the floor each rule puts under minReplicas."""

    name: str
    slo_needed: int | None
    memory: LearnedState
    breach_floor: int | None
    collapse_floor: int | None
    policy: CacheScalingPolicySpec = field(default_factory=spec)


FLOOR_CASES = [
    # ceil(14.45) = 15.
    FloorCase("a sustained breach", 17, learned(streaks=Streaks(slo_breach=2)), 15, None),
    FloorCase("one breaching evaluation", 17, learned(streaks=Streaks(slo_breach=1)), None, None),
    FloorCase("a collapse alert after the breach", 17, learned(alerts=COLLAPSE_ALERT), None, 15),
    # 20 × 0.85 is 17 to within a rounding error: 17, not 18.
    FloorCase(
        "an exact product is not rounded up past itself",
        20,
        learned(streaks=Streaks(slo_breach=2), alerts=COLLAPSE_ALERT),
        17,
        17,
    ),
    FloorCase(
        "no estimate",
        None,
        learned(streaks=Streaks(slo_breach=2), alerts=COLLAPSE_ALERT),
        None,
        None,
    ),
    FloorCase(
        "not under CapAtBudget",
        17,
        learned(streaks=Streaks(slo_breach=2), alerts=COLLAPSE_ALERT),
        None,
        None,
        policy=spec(**CAP_AT_BUDGET),
    ),
]


@pytest.mark.parametrize("case", FLOOR_CASES, ids=lambda case: case.name)
def test_slo_floor_and_collapse_floor(case: FloorCase) -> None:
    assert slo_floor(case.policy, case.memory, case.slo_needed) == case.breach_floor
    assert collapse_floor(case.policy, case.memory, case.slo_needed) == case.collapse_floor


# --- released_floor, case by case -------------------------------------------------------
#
# After the breach a raised minReplicas steps down by max(1, floor(0.1 × minReplicas)):
# each evaluation on the running batch, once the fleet has run a whole 5 min window at it
# on any other metric; it holds while TTFT breaches again.

QUEUE = "vllm:num_requests_waiting"


def hpa_min(replicas: int, metric: str = "vllm:num_requests_running") -> Snapshot:
    """The HPA at ``replicas``..40 on ``metric``."""
    fleet = workload(replicas=replicas, hpa=(replicas, 40, 24.0))
    return snapshot(fleet=replace(fleet, hpa=replace(fleet.hpa, metric_name=metric)))


def ran(*counts: tuple[int, int]) -> LearnedState:
    """The learned state with these ``(replicas, seconds ago)`` evaluations."""
    recent = [ReplicaCount(replicas=n, at=T0 - timedelta(seconds=ago)) for n, ago in counts]
    return learned(recent_replicas=recent)


@dataclass(frozen=True)
class ReleaseCase:
    """A floor found on the HPA after the breach, and where it goes next."""

    name: str
    state: Snapshot
    released: tuple[int, MinFloor] | None
    memory: LearnedState = field(default_factory=learned)
    policy: CacheScalingPolicySpec = field(default_factory=spec)


RELEASE_CASES = [
    ReleaseCase("a tenth down per evaluation", hpa_min(20), (18, MinFloor.RELEASING)),
    ReleaseCase("at least one down", hpa_min(5), (4, MinFloor.RELEASING)),
    ReleaseCase(
        "held while TTFT breaches again",
        hpa_min(20),
        (20, MinFloor.HELD_IN_BREACH),
        memory=learned(streaks=Streaks(slo_breach=2)),
    ),
    ReleaseCase(
        "on the queue, held until a window has run at it",
        hpa_min(20, QUEUE),
        (20, MinFloor.RELEASING_PER_WINDOW),
        memory=ran((20, 270), (20, 30)),
    ),
    ReleaseCase(
        "on the queue, a step once a whole window ran at it or fewer",
        hpa_min(20, QUEUE),
        (18, MinFloor.RELEASING_PER_WINDOW),
        memory=ran((21, 330), (20, 300), (19, 30)),
    ),
    ReleaseCase(
        "on the queue, more replicas within the window hold it",
        hpa_min(20, QUEUE),
        (20, MinFloor.RELEASING_PER_WINDOW),
        memory=ran((20, 300), (22, 60)),
    ),
    ReleaseCase("not under CapAtBudget", hpa_min(20), None, policy=spec(**CAP_AT_BUDGET)),
]


@pytest.mark.parametrize("case", RELEASE_CASES, ids=lambda case: case.name)
def test_released_floor(case: ReleaseCase) -> None:
    assert released_floor(case.policy, case.state, case.memory, T0) == case.released
