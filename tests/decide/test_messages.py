"""The words of an evaluation's action (``decide.messages``): what ``CapAtBudget``
sacrifices, and which reason names what the evaluation did."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cachescale.api.reasons import Action, Hold
from cachescale.decide.batching import BatchPlan
from cachescale.decide.envelope import Envelope, EnvelopePlan
from cachescale.decide.learned import LearnedFloor
from cachescale.decide.messages import action
from cachescale.decide.slo_floors import MinFloor
from tests.decide.decide_builders import (
    T0,
    learned,
    slo_first,
    snapshot,
)


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


# --- action, case by case ---------------------------------------------------------------
#
# The HPA as the builders leave it: 4..40 at a target of 24. The reason is the first of: a
# batch-ceiling change, a collapse hold, the SLO guard, a budget cap the HPA presses on
# (it asks for more than maxReplicas), any other change to the envelope; else NoChange.
# The words list the envelope (and what it was, when it changed), a new target, the
# budget's allowance, what the SLO needs, a minReplicas floor and the ceiling's words.

UNCHANGED = BatchPlan(32, None, "")


@dataclass(frozen=True)
class ActionCase:
    """A planned envelope and ceiling, and the reason and words that name them."""

    name: str
    envelope: Envelope
    reason: Action
    words: str
    budget_max: int | None = None
    held_by: Hold | None = None
    slo_guard: bool = False
    slo_needed: int | None = None
    min_floor: tuple[int, MinFloor] | None = None
    batch: BatchPlan = field(default_factory=lambda: UNCHANGED)
    hpa_wanted: int | None = None


AFTER_SCALE_DOWN = learned(scale_down_floor=LearnedFloor(replicas=5, at=T0, hold_seconds=7200.0))

ACTION_CASES = [
    ActionCase(
        "a ceiling change leads",
        Envelope(4, 11, 24.0),
        Action.LOWERED_MAX_NUM_SEQS,
        "HPA envelope 4..11 (was 4..40); --max-num-seqs 128 → 96: why",
        held_by=Hold.COLLAPSE,
        batch=BatchPlan(96, Action.LOWERED_MAX_NUM_SEQS, "--max-num-seqs 128 → 96: why"),
    ),
    ActionCase(
        "a collapse hold",
        Envelope(4, 11, 24.0),
        Action.HELD_FOR_PREFIX_COLLAPSE,
        "HPA envelope 4..11 (was 4..40); budget allows 19",
        budget_max=19,
        held_by=Hold.COLLAPSE,
    ),
    ActionCase(
        "the SLO guard",
        Envelope(15, 17, 19.2),
        Action.SCALED_FOR_SLO,
        "HPA envelope 15..17 (was 4..40); target 24 → 19.2; budget allows 12; the SLO needs "
        "17; minReplicas 15, the pods that serve the arrivals at the current rate per pod, "
        "while TTFT breaches the SLO",
        budget_max=12,
        slo_guard=True,
        slo_needed=17,
        min_floor=(15, MinFloor.SLO_NEED),
    ),
    ActionCase(
        "a floor learned again says how long it holds and why",
        Envelope(5, 40, 24.0),
        Action.SCALED_FOR_SLO,
        "HPA envelope 5..40 (was 4..40); minReplicas 5, one above the fewest replicas the HPA "
        "had scaled down to when TTFT breached the SLO, held until 120 min after the last "
        "breach (its last release broke the SLO again)",
        slo_guard=True,
        min_floor=(5, MinFloor.AFTER_SCALE_DOWN),
    ),
    ActionCase(
        "a floor coming down is an update, not the SLO guard",
        Envelope(12, 40, 24.0),
        Action.ENVELOPE_UPDATED,
        "HPA envelope 12..40 (was 4..40); minReplicas 12, coming down 10% per evaluation "
        "after the SLO breach",
        min_floor=(12, MinFloor.RELEASING),
    ),
    ActionCase(
        "a budget cap the HPA presses on",
        Envelope(4, 12, 24.0),
        Action.CAPPED_AT_BUDGET,
        "HPA envelope 4..12 (was 4..40); budget allows 12",
        budget_max=12,
        held_by=Hold.BUDGET,
        hpa_wanted=14,
    ),
    ActionCase(
        "a budget cap the HPA does not press on is an update",
        Envelope(4, 12, 24.0),
        Action.ENVELOPE_UPDATED,
        "HPA envelope 4..12 (was 4..40); budget allows 12",
        budget_max=12,
        held_by=Hold.BUDGET,
        hpa_wanted=12,
    ),
    ActionCase(
        "a new target alone is an update",
        Envelope(4, 40, 19.2),
        Action.ENVELOPE_UPDATED,
        "HPA envelope 4..40; target 24 → 19.2",
    ),
    ActionCase("nothing changed", Envelope(4, 40, 24.0), Action.NO_CHANGE, "HPA envelope 4..40"),
]


@pytest.mark.parametrize("case", ACTION_CASES, ids=lambda case: case.name)
def test_action(case: ActionCase) -> None:
    floor, kind = case.min_floor if case.min_floor is not None else (None, None)
    memory = AFTER_SCALE_DOWN if kind is MinFloor.AFTER_SCALE_DOWN else learned()
    plan = EnvelopePlan(
        case.envelope,
        case.budget_max,
        case.held_by,
        case.slo_guard,
        memory,
        slo_needed=case.slo_needed,
        min_floor=floor,
        min_floor_kind=kind,
    )
    assert action(snapshot(), plan, case.batch, case.hpa_wanted) == (case.reason, case.words)
