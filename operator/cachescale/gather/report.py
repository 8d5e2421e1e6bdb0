"""``cachescale report``'s data: one row of signals per window around a moment, and a verdict.

On-call, after a prefix-cache collapse, the first question is what the cost did around the
change, and a fleet that scaled out on cache misses looks healthy on every latency graph.
So the report reads the same signals the operator reads, window by window: each row is
exactly one signals evaluation (``gather.reading.read_queries`` then ``compute_signals``,
the same PromQL and formulas) at the window's end, with the window as its rate and
quantile range. Nothing here writes PromQL.

Replicas come from those same answers. With kube-state-metrics (``--kube-state-metrics``)
they are the pods holding GPUs, starting ones included, averaged over the window
(``QueryKey.PODS_HOLDING_GPUS``), and GPU-s/1k is the signals layer's kube-state-metrics
cost: both count every pod that cost GPUs. Without it they are the per-pod sample counts
the signals batch already reads (``QueryKey.POD_SAMPLES``), summed over pods and divided by
the largest one: the mean number of pods exporting metrics over the window. That leaves out
pods still starting (they export nothing until ready), so after a scale-out both the
replicas and, with ``--gpus-per-pod``, GPU-s/1k read low (``SCRAPED_ONLY`` says so under the
report); it also assumes one pod lived through the whole window (true unless every pod was
replaced inside it; ``docs/signals.md`` says so).

The verdict compares the median of the windows before the moment with the median of those
after it: whether cost per request rose while demand stayed flat, whether TTFT p95 stayed
within an SLO, and how far apart the hit rate and the replicas moved. The verdict and the
rows are pure (``verdict``, ``average_replicas``); only ``read_window`` and
``read_report`` talk to Prometheus.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from cachescale.gather.promql import QueryKey
from cachescale.gather.reading import read_queries
from cachescale.gather.selector import POD_LABEL, ResultSeries
from cachescale.gather.series_reader import SeriesReader
from cachescale.gather.signals import SignalRequest, compute_signals
from cachescale.snapshot import EngineSignals, Measured, Unit

if TYPE_CHECKING:
    from cachescale.gather.prometheus import PrometheusClient

MAX_WINDOWS = 100
"""At most this many windows (each is one signals evaluation, about twenty queries)."""
FLAT = 0.10
"""A relative change at most this large (either way) is "flat"."""


@dataclass(frozen=True)
class Window:
    """One row's time range; offsets are seconds from the moment the report is centred on."""

    start: datetime
    end: datetime
    start_offset_s: float
    end_offset_s: float

    @property
    def label(self) -> str:
        """``-48h..-36h``, ``+0h..+12h``, ``-5m..+0m``: both ends in one unit."""
        return "..".join(signed_duration(self.start_offset_s, self.end_offset_s))


def signed_duration(*seconds: float) -> list[str]:
    """Each of ``seconds`` as ``-12h``, ``+0h``, ``+90m`` or ``-45s``, all in the largest
    unit that divides every one."""
    units = (("h", 3600), ("m", 60))
    unit, size = next(
        ((u, n) for u, n in units if all(value % n == 0 for value in seconds)), ("s", 1)
    )
    return [f"{'-' if value < 0 else '+'}{abs(value) / size:g}{unit}" for value in seconds]


def positive_duration(seconds: float) -> str:
    """A positive duration as ``12h``, ``90m`` or ``45s``."""
    return signed_duration(seconds)[0][1:]


def windows(
    around: datetime, step_s: float, before_s: float, after_s: float, now: datetime
) -> tuple[list[Window], int]:
    """The windows from ``around - before`` to ``around + after``, ``step`` each, and how
    many were left out for ending after ``now``. Raises ``ValueError`` when ``before`` or
    ``after`` is not a multiple of ``step`` or there would be more than ``MAX_WINDOWS``."""
    for flag, seconds in (("--before", before_s), ("--after", after_s)):
        if seconds % step_s != 0:
            raise ValueError(
                f"{flag} {positive_duration(seconds)} is not a whole number of --step "
                f"{positive_duration(step_s)}"
            )
    count = int((before_s + after_s) // step_s)
    if count > MAX_WINDOWS:
        raise ValueError(
            f"{count} windows of --step {positive_duration(step_s)}: at most {MAX_WINDOWS}; "
            "use a longer --step or shorter --before/--after"
        )
    out = []
    for index in range(count):
        start_offset = -before_s + index * step_s
        end_offset = start_offset + step_s
        out.append(
            Window(
                start=around + timedelta(seconds=start_offset),
                end=around + timedelta(seconds=end_offset),
                start_offset_s=start_offset,
                end_offset_s=end_offset,
            )
        )
    kept = [window for window in out if window.end <= now]
    return kept, len(out) - len(kept)


SCRAPED_ONLY = (
    "replicas and GPU-s/1k count the pods exporting engine metrics (ready ones): pods "
    "starting in a window hold GPUs but are left out, so both read low after a scale-out; "
    "give --kube-state-metrics to count every pod holding GPUs"
)
"""The gap of the report without kube-state-metrics, stated under it."""


def caveats(request: SignalRequest) -> list[str]:
    """What the report's replicas and cost leave out, given where they come from."""
    return [] if request.kube_state_metrics else [SCRAPED_ONLY]


def average_replicas(samples: Sequence[ResultSeries]) -> Measured:
    """Mean pods over a window from per-pod sample counts: their sum over the largest."""
    if not samples:
        return Measured.unknown("no engine pod exported metrics in the window", Unit.PODS)
    if any(POD_LABEL not in series.labels for series in samples):
        return Measured.unknown(
            f"engine series carry no '{POD_LABEL}' label, so pods cannot be counted",
            Unit.PODS,
        )
    longest = max(series.value for series in samples)
    return Measured.known(sum(series.value for series in samples) / longest, Unit.PODS)


@dataclass(frozen=True)
class Row:
    """One window's signals, in the report's column order."""

    window: Window
    token_hit_rate: Measured
    request_hit_share: Measured
    ttft_p95_seconds: Measured
    replicas: Measured
    requests_per_second: Measured
    gpu_seconds_per_1k: Measured
    prefill_tokens_per_request: Measured
    preemptions_per_second: Measured

    @classmethod
    def of(cls, window: Window, snapshot: EngineSignals, replicas: Measured) -> Row:
        """The report's columns of one signals snapshot."""
        return cls(
            window=window,
            token_hit_rate=snapshot.token_hit_rate_local,
            request_hit_share=snapshot.request_full_hit_share,
            ttft_p95_seconds=snapshot.ttft_p95_seconds,
            replicas=replicas,
            requests_per_second=snapshot.requests_per_second,
            gpu_seconds_per_1k=snapshot.gpu_seconds_per_1k_requests,
            prefill_tokens_per_request=snapshot.prefill_tokens_per_request,
            preemptions_per_second=snapshot.preemptions_per_second,
        )

    def columns(self) -> dict[str, Measured]:
        """Column name → value, in order (the window excluded)."""
        return {name: getattr(self, name) for name in COLUMNS}


COLUMNS = {
    "token_hit_rate": "tok-hit",
    "request_hit_share": "req-hit",
    "ttft_p95_seconds": "TTFT-p95",
    "replicas": "replicas",
    "requests_per_second": "req/s",
    "gpu_seconds_per_1k": "GPU-s/1k",
    "prefill_tokens_per_request": "prefill/req",
    "preemptions_per_second": "preempt/s",
}
"""Each column's field and its short header."""


def read_window(client: PrometheusClient, request: SignalRequest, window: Window) -> Row:
    """One window's row: a signals evaluation at its end over its length."""
    windowed = replace(request, window_seconds=window.end_offset_s - window.start_offset_s)
    reading = read_queries(client, windowed, window.end)
    if reading.detection.profile is None:
        reason = reading.detection.reason
        snapshot = EngineSignals.all_unknown(
            reason, observed_at=window.end, window_seconds=windowed.window_seconds
        )
        return Row.of(window, snapshot, Measured.unknown(reason, Unit.PODS))
    if request.kube_state_metrics:
        read = SeriesReader(
            request.selector, windowed.window_seconds, reading.queries, reading.results
        )
        replicas = read.fleet(QueryKey.PODS_HOLDING_GPUS, Unit.PODS)
    else:
        replicas = average_replicas(reading.results.get(QueryKey.POD_SAMPLES, ()))
        if replicas.value is not None:
            windowed = replace(windowed, pods_holding_gpus=replicas.value)
    snapshot = compute_signals(
        windowed,
        reading.detection,
        reading.queries,
        reading.results,
        window.end,
        demand=reading.demand,
    )
    row = Row.of(window, snapshot, replicas)
    if request.gpus_per_pod is None and not request.kube_state_metrics:
        # the signals layer's reason names operator inputs
        needs = "give --gpus-per-pod N (the GPUs each pod requests) or --kube-state-metrics"
        row = replace(
            row, gpu_seconds_per_1k=Measured.unknown(needs, Unit.GPU_SECONDS_PER_1K_REQUESTS)
        )
    return row


def read_report(
    client: PrometheusClient, request: SignalRequest, spans: Sequence[Window]
) -> list[Row]:
    """Every window's row, in the order given (each within its own deadline)."""
    return [read_window(client, request, window) for window in spans]


# --- the verdict -------------------------------------------------------------------------


@dataclass(frozen=True)
class Shift:
    """A column's median before and after the moment (None when no window knows it)."""

    before: float | None
    after: float | None

    @classmethod
    def of(cls, rows: Sequence[Row], column: str) -> Shift:
        """The medians of ``column`` over the windows ending by 0 and starting from 0."""

        def median(side: Sequence[Row]) -> float | None:
            known = [v for row in side if (v := getattr(row, column).value) is not None]
            return statistics.median(known) if known else None

        return cls(
            median([r for r in rows if r.window.end_offset_s <= 0]),
            median([r for r in rows if r.window.start_offset_s >= 0]),
        )

    @property
    def known(self) -> tuple[float, float, float] | None:
        """``(before, after, after / before - 1)``, or None when either is unknown or
        ``before`` is 0."""
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.before, self.after, self.after / self.before - 1


def _percent(change: float) -> str:
    return f"{change:+.1%}" if abs(change) < FLAT else f"{change:+.0%}"


def _cost_sentence(cost: Shift, demand: Shift) -> str:
    if (costs := cost.known) is None:
        return (
            "Cost per request cannot be compared: GPU-s/1k is unknown on one side of the "
            "change (give --gpus-per-pod or --kube-state-metrics, and see the notes)."
        )
    before, after, change = costs
    if abs(change) <= FLAT:
        moved = "stayed flat"
    else:
        moved = f"{'rose' if change > 0 else 'fell'} {abs(change):.0%}"
    text = f"Cost per request {moved} (GPU-s/1k {before:,.0f} → {after:,.0f})"
    if (rates := demand.known) is None:
        return text + "; demand cannot be compared (req/s unknown on one side)."
    shown = f"{rates[0]:.3g} → {rates[1]:.3g} req/s, {_percent(rates[2])}"
    if abs(rates[2]) <= FLAT:
        return f"{text} while demand stayed flat ({shown})."
    return f"{text} while demand {'rose' if rates[2] > 0 else 'fell'} ({shown})."


def _ttft_sentence(rows: Sequence[Row], ttft: Shift, slo_s: float | None) -> str:
    known = [(row.ttft_p95_seconds, row.window) for row in rows]
    known = [(m, w) for m, w in known if m.value is not None]
    if not known:
        return "TTFT p95 is unknown in every window."
    if slo_s is None:
        if ttft.before is None or ttft.after is None:
            return "TTFT p95 is unknown on one side of the change."
        return (
            f"TTFT p95 went {ttft.before:.3g} s → {ttft.after:.3g} s (median of the windows; "
            "give --slo-ttft-p95 to judge it against an SLO)."
        )
    worst, where = max(known, key=lambda pair: pair[0].value or 0.0)
    bound = "over " if worst.lower_bound else ""
    over = [w for m, w in known if (m.value or 0.0) > slo_s or m.lower_bound]
    unknown = len(rows) - len(known)
    missing = f"; unknown in {unknown} window(s)" if unknown else ""
    if not over:
        return (
            f"TTFT p95 stayed within the {slo_s:g} s SLO in every window it is known "
            f"(worst {worst.value:.3g} s, {where.label}{missing})."
        )
    return (
        f"TTFT p95 broke the {slo_s:g} s SLO in {len(over)} of {len(rows)} windows (worst "
        f"{bound}{worst.value:.3g} s, {where.label}{missing})."
    )


def _divergence_sentence(hits: Shift, replicas: Shift, demand: Shift) -> str:
    if (hit := hits.known) is None or (pods := replicas.known) is None:
        return "How far the hit rate and the replicas moved apart is unknown (see the notes)."
    text = (
        f"the token hit rate went {hit[0]:.2f} → {hit[1]:.2f} ({_percent(hit[2])}) and "
        f"replicas {pods[0]:.3g} → {pods[1]:.3g} ({_percent(pods[2])}): "
        f"{abs(hit[2] - pods[2]) * 100:.0f} percentage points apart"
    )
    opposite = hit[2] < -FLAT and pods[2] > FLAT
    flat_demand = (rates := demand.known) is not None and abs(rates[2]) <= FLAT
    if opposite and flat_demand:
        return (
            f"Divergence: {text}, in opposite directions at flat demand. The fleet scaled "
            "out on prefill work the cache used to absorb, not on traffic: look for what "
            "changed the prompts just before the drop."
        )
    if opposite:
        return f"Divergence: {text}, in opposite directions."
    return f"{text[0].upper()}{text[1:]}."


def verdict(rows: Sequence[Row], slo_ttft_p95_s: float | None = None) -> list[str]:
    """The verdict in words: cost against demand, TTFT against the SLO, hit rate against
    replicas; each compares the median before the moment with the median after it."""
    if not any(r.window.end_offset_s <= 0 for r in rows) or not any(
        r.window.start_offset_s >= 0 for r in rows
    ):
        return ["No verdict: it needs windows both before and after the moment."]
    demand = Shift.of(rows, "requests_per_second")
    return [
        _cost_sentence(Shift.of(rows, "gpu_seconds_per_1k"), demand),
        _ttft_sentence(rows, Shift.of(rows, "ttft_p95_seconds"), slo_ttft_p95_s),
        _divergence_sentence(Shift.of(rows, "token_hit_rate"), Shift.of(rows, "replicas"), demand),
    ]


def notes(rows: Sequence[Row]) -> list[str]:
    """Why cells are unknown: one line per reason, naming its columns and windows."""
    where: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        for name, measured in row.columns().items():
            if measured.reason is not None:
                windows_of = where.setdefault(measured.reason, {})
                windows_of.setdefault(COLUMNS[name], []).append(row.window.label)
    lines = []
    for reason, columns in where.items():
        spans = {tuple(labels) for labels in columns.values()}
        if len(spans) == 1:
            (span,) = spans
            shown = "every window" if len(span) == len(rows) else ", ".join(span)
            names = "every column" if len(columns) == len(COLUMNS) else ", ".join(columns)
            lines.append(f"{names} unknown in {shown}: {reason}")
        else:
            lines += [
                f"{column} unknown in {', '.join(labels)}: {reason}"
                for column, labels in columns.items()
            ]
    return lines
