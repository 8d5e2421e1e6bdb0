"""Every reason cachescale writes is documented: users' alert rules match these strings."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import pytest

from cachescale.api import reasons
from cachescale.api.reasons import AlertCleared, Diagnosis, cleared
from cachescale.snapshot import FetchFailure

DOCS = Path(__file__).resolve().parents[2] / "docs"
FAMILIES: tuple[type[StrEnum], ...] = (
    reasons.Diagnosis,
    reasons.AlertCleared,
    reasons.ConditionRecovered,
    reasons.Action,
    reasons.Hold,
    reasons.ConditionReason,
    reasons.Problem,
    FetchFailure,
)
MEMBERS = [member for family in FAMILIES for member in family]


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_every_reason_is_documented(member: StrEnum) -> None:
    pages = ("decisions.md", "conditions.md", "max-num-seqs.md", "runbook.md")
    text = "".join((DOCS / page).read_text() for page in pages)
    assert f"`{member.value}`" in text, member.value


def test_no_reason_string_means_two_things() -> None:
    values = [member.value for member in MEMBERS]
    assert len(values) == len(set(values))


def test_every_condition_with_a_good_state_has_a_recovered_event() -> None:
    from cachescale.controller.reconcile.condition_events import GOOD, recovered

    assert [recovered(kind) for kind in GOOD] == list(reasons.ConditionRecovered)
    assert all(recovered(kind) == f"{kind.value}Recovered" for kind in GOOD)


def test_every_alerting_diagnosis_has_a_cleared_event() -> None:
    alerting = [d for d in Diagnosis if d.name in AlertCleared.__members__]
    assert [cleared(d) for d in alerting] == list(AlertCleared)
    assert all(cleared(d) == f"{d.value}Cleared" for d in alerting)
