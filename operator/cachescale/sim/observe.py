"""A simulated Prometheus scraping the simulated pods, read the way the gather layer reads one.

Why: in closed-loop simulation the policy engine must see what it would see in production —
windowed rates of scraped counters, quantiles interpolated inside histogram buckets, window
means of gauges, and an *unknown* wherever Prometheus would have no answer — not the
simulator's ground truth. ``ScrapedFleet`` stores what a Prometheus would store (one sample
per exporting pod per scrape: cumulative counters and bucket counts, and gauges; each pod
its own series) and ``signals`` answers with the definitions of ``cachescale.gather.signals``
for the ``vllm>=0.13`` profile, "unknown" reasons included:

* **Counters** are read as ``sum(rate(x[w]))``, with Prometheus' ``extrapolatedRate``: per
  pod, the samples in ``(now − w, now]`` (at least 2), resets corrected, the increase
  extrapolated to the window's edges — or by half a sample interval where the series starts
  or ends inside the window, and never back past the counter's zero — divided by ``w``;
  then summed over pods. This matters after a scale-out: a pod that became ready
  mid-window adds its share of the window's requests, not its current rate.
* **Quantiles** are ``histogram_quantile`` (Prometheus' ``bucketQuantile``, in
  ``cachescale.histogram``) over the per-bucket rates summed over pods.
* **Gauges** are ``avg_over_time`` per pod (one sample suffices), averaged over pods.
* **Arrivals** are gather's estimate: ``sum(rate())`` of finished requests of every reason
  plus ``sum(delta())`` of waiting and running (Prometheus' ``extrapolatedRate`` for
  gauges: the change from the first to the last sample, extended to the window's edges as
  for a rate, no reset or zero-point handling) over the window, clamped at 0.

Not modelled: per-target scrape offsets and jitter (every pod is scraped at the caller's
instants), staleness markers, and a failed scrape of a single pod. An outage of the metrics
pipeline is the caller's: it skips ``scrape`` while the outage lasts (rates later use the
samples that exist) and reports ``EngineSignals.all_unknown`` instead of calling ``signals``.

Pure: no I/O, no clock. Times are simulated seconds; the caller maps the evaluation time to
the ``datetime`` the snapshot carries.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate, compress, islice, repeat
from operator import add, attrgetter, lt, mul, sub
from typing import NamedTuple

from cachescale.api.engine_metrics import VLLM_EXTERNAL_PREFIX_CACHE_HITS, VLLM_PREFIX_CACHE_QUERIES
from cachescale.histogram import histogram_quantile
from cachescale.sim.fleet import Pod
from cachescale.snapshot import (
    DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
    SIGNAL_UNITS,
    EngineSignals,
    Measured,
    MetricsGeneration,
    PodSignals,
    Unit,
)

MIN_SAMPLES_FOR_RATE = 2
"""Samples a series needs in the window for ``rate()`` to return anything (Prometheus)."""
EXTRAPOLATION_THRESHOLD = 1.1
"""``rate()`` extrapolates to a window edge only if the sample nearest to it lies within
this many average sample intervals of it; otherwise by half an interval."""

# Series named in "unknown" reasons, as vLLM exports them.
_QUERIES = VLLM_PREFIX_CACHE_QUERIES
_EXTERNAL_HITS = VLLM_EXTERNAL_PREFIX_CACHE_HITS
_RUNNING = "vllm:num_requests_running"
_COMPUTED = "vllm:request_prefill_kv_computed_tokens"
_TTFT = "vllm:time_to_first_token_seconds_bucket"
_ITL = "vllm:inter_token_latency_seconds_bucket"
_NO_REQUESTS = "no requests finished in the window"


# --- what a scrape stores ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Histogram:
    """Where one histogram's cumulative bucket counts sit in a sample's counters."""

    bounds: tuple[float, ...]
    """Finite upper bounds; the ``+Inf`` bucket (the ``_count``) follows the last."""
    start: int

    @property
    def stop(self) -> int:
        return self.start + len(self.bounds) + 1

    def buckets(self, counters: Sequence[float]) -> list[tuple[float, float]]:
        """``(le, value)`` for every bucket, ``+Inf`` included."""
        return list(zip((*self.bounds, math.inf), counters[self.start : self.stop], strict=True))

    def observations(self, counters: Sequence[float]) -> float:
        """The ``+Inf`` bucket: the number of observations."""
        return counters[self.stop - 1]


# Positions in a sample's counters; the three histograms' buckets follow (``_Layout``).
_QUERIES_AT = 0
_HITS_AT = 1
_PREEMPTIONS_AT = 2
_SUCCESS_AT = 3
_PROMPT_TOKENS_AT = 4
_GENERATION_TOKENS_AT = 5
_COMPUTED_SUM_AT = 6
_ABORTED_AT = 7
_FIRST_BUCKET_AT = 8


@dataclass(frozen=True, slots=True)
class _Layout:
    """The counters of a sample, fixed by the pods' histogram bucket bounds."""

    computed: _Histogram
    ttft: _Histogram
    itl: _Histogram

    @classmethod
    def of(cls, pod: Pod) -> _Layout:
        series = pod.series
        computed = _Histogram(series.prefill_kv_computed.bounds, _FIRST_BUCKET_AT)
        ttft = _Histogram(series.ttft.bounds, computed.stop)
        itl = _Histogram(series.inter_token_latency.bounds, ttft.stop)
        return cls(computed, ttft, itl)


def _counters(pod: Pod) -> tuple[float, ...]:
    """Every counter the pod exports, in ``_Layout`` order (bucket counts cumulative)."""
    engine, series = pod.engine, pod.series
    return (
        engine.prefix_cache_queries_tokens,
        engine.prefix_cache_hits_tokens,
        engine.num_preemptions_total,
        series.success_total,
        engine.prompt_tokens_total,
        engine.generation_tokens_total,
        series.prefill_kv_computed.total,
        series.aborted_total,
        *accumulate(series.prefill_kv_computed.counts),
        *accumulate(series.ttft.counts),
        *accumulate(series.inter_token_latency.counts),
    )


class _Gauges(NamedTuple):
    waiting: float
    running: float
    kv_usage: float


class _Sample(NamedTuple):
    """One scrape of one pod."""

    t: float
    counters: tuple[float, ...]
    reset_offsets: tuple[float, ...]
    """Per counter, the values it had before each decrease (reset) so far, summed: what
    ``rate()`` adds back. The same tuple object from one sample to the next until a reset."""
    gauges: _Gauges


_sample_time = attrgetter("t")


class _PodSeries:
    """The samples a Prometheus holds for one pod, oldest first."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.samples: deque[_Sample] = deque()

    def record(self, now_s: float) -> None:
        pod = self.pod
        counters = _counters(pod)
        engine = pod.engine
        gauges = _Gauges(engine.num_waiting, engine.num_running, engine.kv_usage)
        if not self.samples:
            self.samples.append(_Sample(now_s, counters, (0.0,) * len(counters), gauges))
            return
        previous = self.samples[-1]
        offsets = previous.reset_offsets
        if any(map(lt, counters, previous.counters)):
            offsets = tuple(
                offset + before if value < before else offset
                for offset, value, before in zip(offsets, counters, previous.counters, strict=True)
            )
        self.samples.append(_Sample(now_s, counters, offsets, gauges))

    def forget_before(self, t: float) -> None:
        while self.samples and self.samples[0].t < t:
            self.samples.popleft()

    def in_window(self, start_s: float, end_s: float) -> list[_Sample]:
        """The samples with ``start_s < t <= end_s`` (what a range selector returns)."""
        first = bisect.bisect_right(self.samples, start_s, key=_sample_time)
        last = bisect.bisect_right(self.samples, end_s, key=_sample_time)
        return list(islice(self.samples, first, last))


# --- reading one pod over a window -----------------------------------------------------------


class _Extension(NamedTuple):
    """The sampled span of a window and how far ``rate()`` extends it at each edge (s)."""

    sampled: float
    to_start: float
    to_end: float


def _extension(samples: Sequence[_Sample], start_s: float, end_s: float) -> _Extension:
    """How far Prometheus' ``extrapolatedRate`` extends the first-to-last-sample change
    toward the edges of ``(start_s, end_s]`` (≥ 2 samples): to an edge when it is within
    ``EXTRAPOLATION_THRESHOLD`` average sample intervals, else half an interval."""
    first, last = samples[0], samples[-1]
    sampled = last.t - first.t
    average = sampled / (len(samples) - 1)
    to_start = first.t - start_s
    if to_start >= average * EXTRAPOLATION_THRESHOLD:
        to_start = average / 2
    to_end = end_s - last.t
    if to_end >= average * EXTRAPOLATION_THRESHOLD:
        to_end = average / 2
    return _Extension(sampled, to_start, to_end)


def _extrapolated_growth(samples: Sequence[_Sample], start_s: float, end_s: float) -> float:
    """``delta(waiting) + delta(running)`` of one pod over ``(start_s, end_s]`` (≥ 2 samples).

    Prometheus' ``extrapolatedRate`` for a gauge: the change from the first to the last
    sample, extended toward the window edges as ``rate()`` is (``_extension``), without
    reset or zero-point handling.
    """
    first, last = samples[0], samples[-1]
    sampled, to_start, to_end = _extension(samples, start_s, end_s)
    change = (last.gauges.waiting + last.gauges.running) - (
        first.gauges.waiting + first.gauges.running
    )
    return change * (sampled + to_start + to_end) / sampled


def _extrapolated_rates(samples: Sequence[_Sample], start_s: float, end_s: float) -> list[float]:
    """``rate()`` of every counter of one pod over ``(start_s, end_s]`` (≥ 2 samples).

    Prometheus' ``extrapolatedRate``: the reset-corrected increase from the first to the
    last sample, extended toward the window edges (``_extension``) — at the start never
    past the point where the counter would have been 0 — per window second.
    """
    first, last = samples[0], samples[-1]
    sampled, to_start, to_end = _extension(samples, start_s, end_s)
    window = end_s - start_s
    increases = list(map(sub, last.counters, first.counters))
    if last.reset_offsets is not first.reset_offsets:
        increases = list(map(add, increases, map(sub, last.reset_offsets, first.reset_offsets)))
    rates = list(map(mul, increases, repeat((sampled + to_start + to_end) / sampled / window)))
    # A counter whose zero point lies less than to_start before the first sample (one that
    # started counting recently) is extended back to that point only. The candidates are
    # found at C speed, so the loop body runs for them alone.
    zero_point_closer = map(lt, first.counters, map(mul, increases, repeat(to_start / sampled)))
    for i in compress(range(len(rates)), zero_point_closer):
        increase, value_first = increases[i], first.counters[i]
        if increase > 0 and value_first >= 0:
            to_zero = sampled * (value_first / increase)
            extend_start = min(to_start, to_zero)
            rates[i] = increase * ((sampled + extend_start + to_end) / sampled / window)
    return rates


@dataclass(frozen=True, slots=True)
class _PodWindow:
    """One pod's series read over the window."""

    pod: Pod
    samples: int
    rates: list[float] | None
    """Every counter's ``rate()``; None with fewer than ``MIN_SAMPLES_FOR_RATE`` samples."""
    growth: float | None
    """``delta()`` of waiting + running; None when ``rates`` is."""
    means: _Gauges
    """Every gauge's ``avg_over_time``."""

    @classmethod
    def read(cls, series: _PodSeries, start_s: float, end_s: float) -> _PodWindow | None:
        """None when the pod has no sample in the window (Prometheus shows no series)."""
        samples = series.in_window(start_s, end_s)
        if not samples:
            return None
        rates = growth = None
        if len(samples) >= MIN_SAMPLES_FOR_RATE:
            rates = _extrapolated_rates(samples, start_s, end_s)
            growth = _extrapolated_growth(samples, start_s, end_s)
        columns = zip(*(sample.gauges for sample in samples), strict=True)
        means = _Gauges(*(sum(column) / len(samples) for column in columns))
        return cls(series.pod, len(samples), rates, growth, means)


# --- the fleet -------------------------------------------------------------------------------


class ScrapedFleet:
    """What a Prometheus scraping the fleet's pods holds, and the signals read from it.

    Call ``scrape`` at every scrape instant, after the fleet was advanced to it (skip it
    while metrics are out), and ``signals`` at every evaluation.
    """

    def __init__(
        self,
        retention_s: float = 1800.0,
        full_hit_max_computed_tokens: float = DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
    ) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention must be positive, got {retention_s}")
        self._retention_s = retention_s
        self._full_hit_max_computed_tokens = full_hit_max_computed_tokens
        self._series: dict[str, _PodSeries] = {}
        self._layout: _Layout | None = None
        self._last_scrape_s = -math.inf

    def scrape(self, pods: Iterable[Pod], now_s: float) -> None:
        """Record one sample per pod that exports metrics: ready and not gone (a pod still
        loading weights exports nothing). Samples older than the retention are dropped."""
        if now_s <= self._last_scrape_s:
            raise ValueError(f"scrape at {now_s}s after one at {self._last_scrape_s}s")
        self._last_scrape_s = now_s
        for pod in pods:
            if pod.ready_s <= now_s and pod.gone_s is None:
                self._series_of(pod).record(now_s)
        self._forget_before(now_s - self._retention_s)

    def _series_of(self, pod: Pod) -> _PodSeries:
        series = self._series.get(pod.name)
        if series is None:
            layout = _Layout.of(pod)
            if self._layout is None:
                self._layout = layout
            elif layout != self._layout:
                raise ValueError(f"pod {pod.name} exports other histogram buckets than its peers")
            series = self._series[pod.name] = _PodSeries(pod)
        return series

    def _forget_before(self, t: float) -> None:
        for name, series in list(self._series.items()):
            series.forget_before(t)
            if not series.samples:
                del self._series[name]

    def signals(
        self,
        now_s: float,
        window_s: float,
        *,
        gpus_per_pod: float,
        ready_replicas: int,
        observed_at: datetime,
    ) -> EngineSignals:
        """``EngineSignals`` over ``(now_s − window_s, now_s]``, as gather computes them.

        ``gpus_per_pod`` and ``ready_replicas`` are the Deployment's, at ``now_s``.
        """
        if not 0 < window_s <= self._retention_s:
            raise ValueError(f"window must be in (0, {self._retention_s}] s, got {window_s}")
        windows = [
            window
            for series in self._series.values()
            if (window := _PodWindow.read(series, now_s - window_s, now_s)) is not None
        ]
        if not windows or self._layout is None:
            return EngineSignals.all_unknown(
                f"{_RUNNING} has no data over the {_duration(window_s)} window (no pod was ready "
                "and scraped in it)",
                observed_at=observed_at,
                window_seconds=window_s,
            )
        evaluation = _Evaluation(
            windows, self._layout, now_s, window_s, self._full_hit_max_computed_tokens
        )
        return evaluation.snapshot(observed_at, gpus_per_pod, ready_replicas)


def _duration(seconds: float) -> str:
    """Seconds as a PromQL duration (``300s``; ``1500ms`` when not whole), as gather prints."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def _ratio(numerator: float, denominator: float, unit: Unit, zero_reason: str) -> Measured:
    if denominator == 0:
        return Measured.unknown(zero_reason, unit)
    return Measured.known(numerator / denominator, unit)


def _mean(values: Sequence[float], unit: Unit) -> Measured:
    return Measured.known(sum(values) / len(values), unit)


class _Evaluation:
    """The signals of one window, from the pods with samples in it (at least one)."""

    def __init__(
        self,
        windows: Sequence[_PodWindow],
        layout: _Layout,
        now_s: float,
        window_s: float,
        full_hit_max_computed_tokens: float,
    ) -> None:
        self._windows = sorted(windows, key=lambda w: w.pod.name)
        self._layout = layout
        self._now_s = now_s
        self._window_s = window_s
        self._threshold = full_hit_max_computed_tokens
        rated = [w.rates for w in self._windows if w.rates is not None]
        # sum(rate(...)) of every counter over the pods; empty when none has 2 samples.
        self._rates = [math.fsum(column) for column in zip(*rated, strict=True)]
        self._growth = math.fsum(w.growth for w in self._windows if w.growth is not None)

    def snapshot(
        self, observed_at: datetime, gpus_per_pod: float, ready_replicas: int
    ) -> EngineSignals:
        rated = self._rate_based
        ttft, itl = self._layout.ttft, self._layout.itl
        return EngineSignals(
            profile=MetricsGeneration.VLLM_0_13,
            observed_at=observed_at,
            window_seconds=self._window_s,
            token_hit_rate_local=rated("token_hit_rate_local", self._hit_rate),
            token_hit_rate_with_external=rated(
                "token_hit_rate_with_external", self._hit_rate_with_external
            ),
            request_full_hit_share=rated("request_full_hit_share", self._full_hit_share),
            full_hit_max_computed_tokens=self._full_hit_bound(),
            prefill_tokens_per_request=rated(
                "prefill_tokens_per_request", self._prefill_per_request
            ),
            ttft_p50_seconds=rated("ttft_p50_seconds", lambda: self._quantile(0.5, ttft, _TTFT)),
            ttft_p95_seconds=rated("ttft_p95_seconds", lambda: self._quantile(0.95, ttft, _TTFT)),
            ttft_p99_seconds=rated("ttft_p99_seconds", lambda: self._quantile(0.99, ttft, _TTFT)),
            itl_p95_seconds=rated("itl_p95_seconds", lambda: self._quantile(0.95, itl, _ITL)),
            requests_per_second=rated("requests_per_second", self._requests_per_second),
            arrivals_per_second=rated("arrivals_per_second", self._arrivals_per_second),
            preemptions_per_second=rated("preemptions_per_second", self._preemptions_per_second),
            waiting_requests_per_pod=_mean([w.means.waiting for w in self._windows], Unit.REQUESTS),
            running_requests_per_pod=_mean([w.means.running for w in self._windows], Unit.REQUESTS),
            kv_cache_usage_ratio=_mean([w.means.kv_usage for w in self._windows], Unit.RATIO),
            gpu_seconds_per_1k_requests=rated(
                "gpu_seconds_per_1k_requests",
                lambda: self._gpu_seconds_per_1k(gpus_per_pod, ready_replicas),
            ),
            context_tokens_per_request=rated(
                "context_tokens_per_request", self._context_tokens_per_request
            ),
            pods=tuple(self._pod(window) for window in self._windows),
        )

    def _rate_based(self, signal: str, compute: Callable[[], Measured]) -> Measured:
        """``compute()``, or unknown when no pod has the samples a rate needs."""
        if self._rates:
            return compute()
        most = max(window.samples for window in self._windows)
        reason = (
            f"only {most:g} sample(s) per series in the {_duration(self._window_s)} window; "
            f"rates need at least {MIN_SAMPLES_FOR_RATE} (just started, or the window is "
            "shorter than two scrape intervals)"
        )
        return Measured.unknown(reason, SIGNAL_UNITS[signal])

    # --- fleet signals from rates (only called when there are rates) ------------------------

    @property
    def _traffic(self) -> bool:
        return self._rates[_SUCCESS_AT] > 0

    def _requests_per_second(self) -> Measured:
        return Measured.known(self._rates[_SUCCESS_AT], Unit.REQUESTS_PER_SECOND)

    def _arrivals_per_second(self) -> Measured:
        finished = self._rates[_SUCCESS_AT] + self._rates[_ABORTED_AT]
        arrivals = max(0.0, finished + self._growth / self._window_s)
        return Measured.known(arrivals, Unit.REQUESTS_PER_SECOND)

    def _preemptions_per_second(self) -> Measured:
        return Measured.known(self._rates[_PREEMPTIONS_AT], Unit.PREEMPTIONS_PER_SECOND)

    def _hit_rate(self) -> Measured:
        no_lookups = (
            f"{_QUERIES} did not increase although requests finished: prefix caching is off, "
            "or lookups were skipped"
            if self._traffic
            else "no traffic: no prompt tokens were looked up in the window"
        )
        return _ratio(self._rates[_HITS_AT], self._rates[_QUERIES_AT], Unit.RATIO, no_lookups)

    def _hit_rate_with_external(self) -> Measured:
        return Measured.unknown(
            f"{_EXTERNAL_HITS} has no data over the {_duration(self._window_s)} window (no KV "
            "connector or storage tier configured? the simulated pods have none)",
            Unit.RATIO,
        )

    def _full_hit_bound(self) -> float | None:
        """The highest bucket bound of the computed-tokens histogram not above the
        full-hit threshold, if there is one."""
        bounds = [b for b in self._layout.computed.bounds if b <= self._threshold]
        return max(bounds, default=None)

    def _full_hit_share(self) -> Measured:
        bound = self._full_hit_bound()
        if bound is None:
            return Measured.unknown(
                f"no bucket bound of {_COMPUTED}_bucket is at or below {self._threshold:g} tokens",
                Unit.RATIO,
            )
        computed = self._layout.computed
        at_bound = self._rates[computed.start + computed.bounds.index(bound)]
        zero = (
            f"{_COMPUTED}_count did not increase although requests finished"
            if self._traffic
            else _NO_REQUESTS
        )
        share = _ratio(at_bound, computed.observations(self._rates), Unit.RATIO, zero)
        if share.value is not None and share.value > 1:  # float rounding of two rates
            return Measured.known(1.0, Unit.RATIO)
        return share

    def _prefill_per_request(self) -> Measured:
        computed = self._layout.computed.observations(self._rates)
        return _ratio(
            self._rates[_COMPUTED_SUM_AT], computed, Unit.TOKENS_PER_REQUEST, _NO_REQUESTS
        )

    def _quantile(self, q: float, histogram: _Histogram, reads: str) -> Measured:
        value = histogram_quantile(q, histogram.buckets(self._rates))
        if math.isnan(value):
            reason = (
                f"{reads} has no observations in the window although requests finished"
                if self._traffic
                else "no traffic: no observations in the window"
            )
            return Measured.unknown(reason, Unit.SECONDS)
        return Measured.known(value, Unit.SECONDS)

    def _gpu_seconds_per_1k(self, gpus_per_pod: float, ready_replicas: int) -> Measured:
        """GPUs held at evaluation time, over the whole window, per 1000 finished requests
        (gather's formula: it lags a scale change by up to one window)."""
        gpu_seconds = gpus_per_pod * ready_replicas * self._window_s
        thousands_finished = self._rates[_SUCCESS_AT] * self._window_s / 1000
        return _ratio(
            gpu_seconds,
            thousands_finished,
            Unit.GPU_SECONDS_PER_1K_REQUESTS,
            "no requests finished in the window: cost per request is undefined",
        )

    def _context_tokens_per_request(self) -> Measured:
        tokens = self._rates[_PROMPT_TOKENS_AT] + self._rates[_GENERATION_TOKENS_AT]
        return _ratio(tokens, self._rates[_SUCCESS_AT], Unit.TOKENS_PER_REQUEST, _NO_REQUESTS)

    # --- per pod ---------------------------------------------------------------------------

    def _pod(self, window: _PodWindow) -> PodSignals:
        if window.rates is None:
            reason = (
                f"only {window.samples:g} sample(s) of this pod in the window (new pod?); a "
                f"rate needs {MIN_SAMPLES_FOR_RATE}"
            )
            hit_rate = Measured.unknown(reason, Unit.RATIO)
            looked_up = Measured.unknown(reason, Unit.TOKENS_PER_SECOND)
        else:
            looked_up = Measured.known(window.rates[_QUERIES_AT], Unit.TOKENS_PER_SECOND)
            hit_rate = _ratio(
                window.rates[_HITS_AT],
                window.rates[_QUERIES_AT],
                Unit.RATIO,
                "no prompt tokens were looked up on this pod in the window",
            )
        return PodSignals(
            pod=window.pod.name,
            age_seconds=self._age(window.pod),
            token_hit_rate=hit_rate,
            prompt_tokens_looked_up_per_second=looked_up,
            waiting_requests=Measured.known(window.means.waiting, Unit.REQUESTS),
            running_requests=Measured.known(window.means.running, Unit.REQUESTS),
            kv_cache_usage_ratio=Measured.known(window.means.kv_usage, Unit.RATIO),
        )

    def _age(self, pod: Pod) -> Measured:
        """Seconds since the pod became ready, as the Kubernetes API tells the operator; a
        pod that is gone is no longer listed there."""
        if pod.gone_s is not None and pod.gone_s <= self._now_s:
            return Measured.unknown(
                "not among the pods the Kubernetes API listed (terminated?)", Unit.SECONDS
            )
        return Measured.known(pod.age_s(self._now_s), Unit.SECONDS)
