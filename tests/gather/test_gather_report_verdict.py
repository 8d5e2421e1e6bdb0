"""The report's pure parts: windows, replicas from sample counts, and the verdict's words."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from cachescale.gather.report import Row, Window, average_replicas, notes, verdict, windows
from cachescale.snapshot import Measured, Unit

AROUND = datetime(2026, 11, 20, 12, tzinfo=UTC)
HOUR = 3600.0


@dataclass(frozen=True)
class FakeSeries:
    labels: dict[str, str]
    value: float


def row(
    offset_h: float,
    *,
    hit: float | None = 0.8,
    replicas: float = 10,
    rps: float = 30,
    cost: float | None = 600,
    ttft: Measured | None = None,
) -> Row:
    start = AROUND + timedelta(hours=offset_h)
    window = Window(start, start + timedelta(hours=12), offset_h * HOUR, (offset_h + 12) * HOUR)

    def value(v: float | None, unit: Unit) -> Measured:
        return Measured.known(v, unit) if v is not None else Measured.unknown("not read", unit)

    return Row(
        window=window,
        token_hit_rate=value(hit, Unit.RATIO),
        request_hit_share=value(0.5, Unit.RATIO),
        ttft_p95_seconds=ttft or Measured.known(0.4, Unit.SECONDS),
        replicas=Measured.known(replicas, Unit.PODS),
        requests_per_second=Measured.known(rps, Unit.REQUESTS_PER_SECOND),
        gpu_seconds_per_1k=value(cost, Unit.GPU_SECONDS_PER_1K_REQUESTS),
        prefill_tokens_per_request=Measured.known(500, Unit.TOKENS_PER_REQUEST),
        preemptions_per_second=Measured.known(0, Unit.PREEMPTIONS_PER_SECOND),
    )


def test_windows_tile_the_span_and_leave_out_the_future() -> None:
    now = AROUND + timedelta(hours=13)
    spans, future = windows(AROUND, 12 * HOUR, 24 * HOUR, 24 * HOUR, now)
    assert [s.label for s in spans] == ["-24h..-12h", "-12h..+0h", "+0h..+12h"]
    assert future == 1
    assert spans[-1].end == AROUND + timedelta(hours=12)
    with pytest.raises(ValueError, match="--after 5h is not a whole number of --step 2h"):
        windows(AROUND, 2 * HOUR, 4 * HOUR, 5 * HOUR, now)


def test_replicas_are_the_mean_pod_count_over_the_window() -> None:
    # Two pods all along, a third for the last quarter: 2.25 pods on average.
    counts = [FakeSeries({"pod": p}, n) for p, n in (("a", 48), ("b", 48), ("c", 12))]
    assert average_replicas(counts) == Measured.known(2.25, Unit.PODS)
    assert average_replicas([FakeSeries({}, 48)]).reason == (
        "engine series carry no 'pod' label, so pods cannot be counted"
    )
    assert average_replicas([]).value is None


def test_cost_rising_with_demand_is_no_divergence() -> None:
    rows = [row(-12), row(0, replicas=20, rps=60, cost=620, hit=0.8)]
    cost, ttft, apart = verdict(rows)
    assert cost == (
        "Cost per request stayed flat (GPU-s/1k 600 → 620) while demand rose "
        "(30 → 60 req/s, +100%)."
    )
    assert ttft.startswith("TTFT p95 went 0.4 s → 0.4 s")
    assert apart == (
        "The token hit rate went 0.80 → 0.80 (+0.0%) and replicas 10 → 20 (+100%): 100 "
        "percentage points apart."
    )


def test_slo_broken_counts_lower_bounds_and_unknowns() -> None:
    past = Measured.quantile(2.5, Unit.SECONDS, lower_bound=True)
    unknown = Measured.unknown("no observations", Unit.SECONDS)
    rows = [row(-24), row(-12, ttft=unknown), row(0, ttft=past), row(12, cost=None)]
    cost, ttft, _ = verdict(rows, slo_ttft_p95_s=1.0)
    assert ttft == (
        "TTFT p95 broke the 1 s SLO in 1 of 4 windows (worst over 2.5 s, +0h..+12h; unknown "
        "in 1 window(s))."
    )
    assert cost.startswith("Cost per request stayed flat (GPU-s/1k 600 → 600)")
    assert notes(rows) == [
        "TTFT-p95 unknown in -12h..+0h: no observations",
        "GPU-s/1k unknown in +12h..+24h: not read",
    ]


def test_no_verdict_without_both_sides() -> None:
    assert verdict([row(-12)]) == ["No verdict: it needs windows both before and after the moment."]
    rows = [row(-12, cost=None, hit=None), row(0, cost=None, hit=None)]
    cost, _, apart = verdict(rows)
    assert cost.startswith("Cost per request cannot be compared")
    assert apart.startswith("How far the hit rate and the replicas moved apart is unknown")
