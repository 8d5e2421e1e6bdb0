"""Healing: where an active collapse is heading, and the words when it heals on its own.

Not every collapse needs a human. A boundary shift (documents re-chunked, a template
reordered once) misses every cached prefix once; the new prefixes are computed, cached,
and the hit rate climbs back. So while a ``PrefixCollapse`` lasts, its evidence carries
the warm-pod hit rate's trend since the onset (*recovering*, *flat* or *falling*, from the
rates ``learned.CollapseEvidence`` follows; thresholds in ``thresholds.py``), and when the
rate is back at the clearing threshold for ``RECOVERY_EVALUATIONS`` evaluations the alert
clears by itself with a message saying it healed and how long that took
(``docs/decisions.md``, "PrefixCollapse").
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from cachescale.decide import words
from cachescale.decide.checks import CollapseCheck
from cachescale.decide.learned import CollapseEvidence, LearnedAlert
from cachescale.decide.thresholds import RECOVERY_EVALUATIONS, TREND_POINTS


class Trend(StrEnum):
    """Where the warm-pod hit rate of an active collapse is heading."""

    RECOVERING = "recovering"
    """At least ``TREND_POINTS`` above its lowest since the onset (and not falling)."""
    FLAT = "flat"
    """Neither."""
    FALLING = "falling"
    """At least ``TREND_POINTS`` below where it was ``TREND_SECONDS`` ago (or at the onset,
    for a younger collapse)."""


def hit_rate_trend(evidence: CollapseEvidence, current: float) -> Trend:
    """The trend of ``current`` against the rates followed since the onset (falling wins:
    a rate that rose and fell again is not recovering)."""
    recent = evidence.recent_hit_rates
    past = recent[0].value if recent else evidence.onset_hit_rate
    if past is not None and current <= past - TREND_POINTS:
        return Trend.FALLING
    low = evidence.low_hit_rate
    if low is not None and current >= low + TREND_POINTS:
        return Trend.RECOVERING
    return Trend.FLAT


def trend_words(evidence: CollapseEvidence | None, current: float) -> str:
    """``hit rate recovering since the onset at 10:42 (0.19 then, lowest 0.04, 0.31 now)``;
    empty when nothing was followed yet."""
    if evidence is None or evidence.onset_hit_rate is None or evidence.low_hit_rate is None:
        return ""
    trend = hit_rate_trend(evidence, current)
    return (
        f"hit rate {trend} since the onset at {evidence.started_at:%H:%M} "
        f"({words.ratio(evidence.onset_hit_rate)} then, lowest "
        f"{words.ratio(evidence.low_hit_rate)}, {words.ratio(current)} now)"
    )


def onset(alert: LearnedAlert, evidence: CollapseEvidence | None) -> datetime:
    """When the collapse began: its streak's first evaluation, else the alert's raise."""
    return evidence.started_at if evidence is not None else alert.since


def healing_time(alert: LearnedAlert, evidence: CollapseEvidence | None, now: datetime) -> str:
    """From the onset to the evaluation that clears the alert: ``14 min`` (whole minutes,
    rounded), or ``70 s`` under two minutes, where whole minutes would say 1 or 0."""
    seconds = (now - onset(alert, evidence)).total_seconds()
    return f"{seconds:.0f} s" if seconds < 120 else f"{round(seconds / 60)} min"


def healed_words(
    alert: LearnedAlert, evidence: CollapseEvidence | None, check: CollapseCheck, now: datetime
) -> str:
    """The message of a collapse alert that clears because the hit rate came back."""
    current, clear = check.warm_hit_rate.value, check.clear_threshold
    assert current is not None  # a recovery counts only known rates
    assert clear is not None  # ...against a baseline
    low = evidence.low_hit_rate if evidence is not None else None
    lowest = f" from a low of {words.ratio(low)}" if low is not None else ""
    held = " (acknowledged earlier)" if alert.acknowledged else ""
    return (
        f"healed after {healing_time(alert, evidence, now)} (onset "
        f"{onset(alert, evidence):%H:%M}) with no human action{held}: warm-pod token hit "
        f"rate back to {words.ratio(current)}{lowest}, at or above the clearing threshold "
        f"{words.ratio(clear)} for {RECOVERY_EVALUATIONS} evaluations; the cache refilled on "
        "its own, as after a one-off change of the shared prefixes (a re-chunk)"
    )
