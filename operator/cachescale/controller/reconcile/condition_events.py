"""The Events a condition's transition posts: a Warning when it turns bad, a Normal
``<Condition>Recovered`` when it returns to its good state, nothing while it stays.

Pure: the previous and the new conditions in, the Events out. The rules:

- A condition with a good state (``GOOD``) turns bad when it turns False: a Warning named
  by its reason (``SLOAtRisk``, ``OverBudget``, ``KEDAFallback``...), its message the
  condition's evidence. A reason counted by a streak (``SUSTAINED``: an SLO breach, a
  budget overrun, eviction pressure) turns it bad only once the streak reaches the policy's
  ``collapseWindows``, so one slow window is no Warning.
- It recovers when it is back in its good state after being bad: a Normal
  ``<Condition>Recovered`` whose message quotes the reading that is good again and says
  what it recovered from, since when.
- Unknown is neither: a condition that goes False → Unknown → True posts no Recovered.
- An alert of the same reason speaks for the condition (``decide/alerts.py`` posts its
  raise and its clearing): no Warning while that alert is active or raised now, and no
  Recovered for a reason whose alert was active (its ``…Cleared`` Event says so). Two
  conditions that recover from the same reason at once post one Recovered.

A condition that does not change posts nothing, so a steady policy posts no Events at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from cachescale.api.reasons import ConditionRecovered, Diagnosis
from cachescale.api.status import Condition, ConditionStatus, ConditionType
from cachescale.decide.learned import Streaks

GOOD: Final[Mapping[ConditionType, ConditionStatus]] = {
    ConditionType.READY: ConditionStatus.TRUE,
    ConditionType.CACHE_HEALTHY: ConditionStatus.TRUE,
    ConditionType.SLO_MET: ConditionStatus.TRUE,
    ConditionType.WITHIN_BUDGET: ConditionStatus.TRUE,
    ConditionType.METRICS_AVAILABLE: ConditionStatus.TRUE,
    ConditionType.CACHE_ISOLATION: ConditionStatus.TRUE,
}
"""The conditions with a good state, in the order their Events go out. ``ScalingHeld``
has none: a hold is a decision, announced by the decision's own Event."""

SUSTAINED: Final[Mapping[str, Callable[[Streaks], int]]] = {
    Diagnosis.SLO_AT_RISK: lambda streaks: streaks.slo_breach,
    Diagnosis.OVER_BUDGET: lambda streaks: streaks.over_budget,
    Diagnosis.EVICTION_PRESSURE: lambda streaks: streaks.eviction,
}
"""Failing reasons that turn a condition bad only once sustained: the streak (evaluations
in a row) that counts them, which must reach ``collapseWindows``."""


def recovered(kind: ConditionType) -> ConditionRecovered:
    """The reason of the Event posted when ``kind`` returns to its good state."""
    return ConditionRecovered[kind.name]


@dataclass(frozen=True)
class Episode:
    """What the transition rules need besides the conditions."""

    windows: int
    """The policy's ``cache.collapseWindows``: how long a ``SUSTAINED`` reason must hold."""
    streaks_before: Streaks
    """The streaks the evaluation started from."""
    streaks_after: Streaks
    """The streaks it left."""
    alerts: frozenset[str]
    """Alerts active before the evaluation or raised by it: their reasons have Events of
    their own."""


@dataclass(frozen=True)
class ConditionEvent:
    """One Event to post about the policy."""

    kind: str
    """``Warning`` or ``Normal``."""
    reason: str
    message: str


def condition_events(
    before: Sequence[Condition], after: Sequence[Condition], episode: Episode, now: datetime
) -> list[ConditionEvent]:
    """The Events of the conditions that turned bad or recovered between ``before`` (the
    previous status) and ``after`` (this evaluation's), by the module's rules."""
    old = {c.type: c for c in before}
    new = {c.type: c for c in after}
    out: list[ConditionEvent] = []
    recovered_from: set[str] = set()
    for kind, good in GOOD.items():
        was, now_is = old.get(kind), new.get(kind)
        was_bad = _bad(was, episode.streaks_before, episode.windows)
        if now_is is None:
            continue
        if _bad(now_is, episode.streaks_after, episode.windows) and not was_bad:
            if now_is.reason not in episode.alerts:
                out.append(_warning(now_is, episode.streaks_after))
        elif was_bad and was is not None and now_is.status is good:
            if was.reason not in episode.alerts and was.reason not in recovered_from:
                out.append(_recovery(was, now_is, now))
            recovered_from.add(was.reason)
    return out


def _bad(condition: Condition | None, streaks: Streaks, windows: int) -> bool:
    """False, and for a ``SUSTAINED`` reason held for ``windows`` evaluations."""
    if condition is None or condition.status is not ConditionStatus.FALSE:
        return False
    streak = SUSTAINED.get(condition.reason)
    return streak is None or streak(streaks) >= windows


def _warning(condition: Condition, streaks: Streaks) -> ConditionEvent:
    streak = SUSTAINED.get(condition.reason)
    held = f", {_evaluations(streak(streaks))} in a row" if streak is not None else ""
    message = f"{condition.type.value}=False: {condition.message}{held}"
    return ConditionEvent("Warning", condition.reason, message)


def _evaluations(count: int) -> str:
    """``1 evaluation``, ``3 evaluations``."""
    return f"{count} evaluation" + ("" if count == 1 else "s")


def _recovery(was: Condition, now_is: Condition, now: datetime) -> ConditionEvent:
    since = was.last_transition_time.astimezone(UTC)
    message = (
        f"{now_is.type.value}={now_is.status.value}: {now_is.message}; it was False "
        f"({was.reason}) for {_duration((now - since).total_seconds())} from {since:%H:%M} UTC"
    )
    return ConditionEvent("Normal", recovered(now_is.type), message)


def _duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{max(0.0, seconds):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
