"""An active collapse's hit-rate trend, and the alert clearing by itself when it heals."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cachescale.api.reasons import Diagnosis
from cachescale.decide import Decision
from cachescale.decide.healing import Trend, hit_rate_trend
from cachescale.decide.learned import CollapseEvidence, RateSample
from cachescale.decide.thresholds import RECOVERY_EVALUATIONS, TREND_POINTS, TREND_SECONDS
from cachescale.snapshot import HumanRequests
from tests.decide.decide_builders import INTERVAL, T0, run, signals, snapshot, spec


def collapse_run(hits: Sequence[float]) -> list[Decision]:
    return run(
        spec(), [snapshot(signals(hit=hit, prefill_tokens_per_request=2000)) for hit in hits]
    )


def evidence(onset: float, low: float, recent: Sequence[float]) -> CollapseEvidence:
    """Evidence of a collapse whose last ``TREND_SECONDS`` of rates were ``recent``."""
    return CollapseEvidence(
        started_at=T0,
        onset_hit_rate=onset,
        low_hit_rate=low,
        recent_hit_rates=[RateSample(at=T0 + i * INTERVAL, value=v) for i, v in enumerate(recent)],
    )


@pytest.mark.parametrize(
    ("recent", "low", "trend"),
    [
        ((0.19, 0.10, 0.04), 0.04, Trend.FALLING),  # still taking in the drop
        ((0.10, 0.06), 0.04, Trend.FLAT),  # 0.04 below five minutes ago: not yet falling
        ((0.05, 0.04, 0.05), 0.04, Trend.FLAT),  # wobbling at the bottom
        ((0.05, 0.095), 0.04, Trend.RECOVERING),  # five points over the low
        ((0.05, 0.085), 0.04, Trend.FLAT),
        ((0.40, 0.30, 0.34), 0.04, Trend.FALLING),  # rose, then fell back: not recovering
    ],
)
def test_trend_rule(recent: Sequence[float], low: float, trend: Trend) -> None:
    assert TREND_POINTS == 0.05
    assert hit_rate_trend(evidence(0.19, low, recent), recent[-1]) is trend


def test_falling_looks_back_only_trend_seconds() -> None:
    # A collapse that fell long ago and settled is flat, not falling since the onset.
    steps = int(TREND_SECONDS / INTERVAL.total_seconds())
    hits = [0.30] * 3 + [0.04] * (steps + 2)
    decisions = collapse_run(hits)
    assert "hit rate falling since the onset at 12:00 (0.30 then" in decisions[4].alerts[0].message
    last = decisions[-1].alerts[0].message
    assert "hit rate flat since the onset at 12:00 (0.30 then, lowest 0.04, 0.04 now)" in last


def test_the_trend_is_in_the_alert_and_the_condition() -> None:
    decisions = collapse_run([0.04] * 4 + [0.30])
    last = decisions[-1]
    recovering = "hit rate recovering since the onset at 12:00 (0.04 then, lowest 0.04, 0.30 now)"
    assert recovering in last.alerts[0].message
    cache = next(c for c in last.conditions if c.reason is Diagnosis.PREFIX_COLLAPSE)
    assert recovering in cache.message


def test_a_collapse_that_heals_clears_itself_and_says_how_long_it_took() -> None:
    # Onset at 12:00, raised at 12:01, recovering from 12:02, back above the clearing
    # threshold (0.6375) at 12:05:30 and 12:06: healed at the second, 6 min after the onset.
    hits = [0.04] * 4 + [0.30, 0.45, 0.55, 0.60, 0.62, 0.62, 0.62, 0.66, 0.80]
    decisions = collapse_run(hits)
    assert [d.alert_active(Diagnosis.PREFIX_COLLAPSE) for d in decisions[2:]] == (
        [True] * 10 + [False]
    )
    assert RECOVERY_EVALUATIONS == 2
    (cleared,) = decisions[-1].cleared
    assert cleared.reason is Diagnosis.PREFIX_COLLAPSE
    assert cleared.message.startswith("healed after 6 min (onset 12:00) with no human action: ")
    assert "back to 0.80 from a low of 0.04" in cleared.message
    assert "clearing threshold 0.64 for 2 evaluations" in cleared.message
    assert decisions[-1].memory.collapse_evidence is None


def test_a_rebaseline_is_not_healing() -> None:
    collapsed = collapse_run([0.04] * 3)
    human = HumanRequests(rebaseline_at=T0 + 3 * INTERVAL)
    (after,) = run(
        spec(),
        [snapshot(signals(hit=0.04), human=human)],
        collapsed[-1].memory,
        start=T0 + 3 * INTERVAL,
    )
    (cleared,) = after.cleared
    assert cleared.message.startswith("cleared: ")
