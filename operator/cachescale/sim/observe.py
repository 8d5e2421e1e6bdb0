"""A simulated Prometheus scraping the simulated pods, read the way the gather layer reads one.

Why: in closed-loop simulation the policy engine must see what it would see in production —
windowed rates of scraped counters, quantiles interpolated inside histogram buckets, window
means of gauges, and an *unknown* wherever Prometheus would have no answer — not the
simulator's ground truth. ``ScrapedFleet`` stores what a Prometheus would store (per pod,
:mod:`cachescale.sim.scrape`) and ``signals`` answers with the definitions of
``cachescale.gather.signals`` for the ``vllm>=0.13`` profile, "unknown" reasons included:

* **Counters** are read as ``sum(rate(x[w]))``: each pod's ``rate()`` (Prometheus'
  ``extrapolatedRate``, see :mod:`cachescale.sim.scrape`), summed over pods.
* **Quantiles** are ``histogram_quantile`` (Prometheus' ``bucketQuantile``, in
  ``cachescale.histogram``) over the per-bucket rates summed over pods.
* **Gauges** are ``avg_over_time`` per pod (one sample suffices), averaged over pods.
* **Arrivals** are gather's estimate: ``sum(rate())`` of finished requests of every reason
  plus ``sum(delta())`` of waiting and running over the window, clamped at 0.
* **GPU-seconds** are what kube-state-metrics shows the gather layer: the GPUs of every pod
  that held them in the window (starting, ready or draining), each for the part of the
  window it existed. The gather query averages the GPU count over 30 s subquery steps;
  here each pod's lifetime is known exactly, so the cost is the fleet's true one.

Not modelled: per-target scrape offsets and jitter (every pod is scraped at the caller's
instants), staleness markers, and a failed scrape of a single pod. An outage of the metrics
pipeline is the caller's: it skips ``scrape`` while the outage lasts (rates later use the
samples that exist) and reports ``EngineSignals.all_unknown`` instead of calling ``signals``.

Pure: no I/O, no clock. Times are simulated seconds; the caller maps the evaluation time to
the ``datetime`` the snapshot carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from cachescale.api.engine_metrics import VLLM_PREFIX_CACHE_QUERIES
from cachescale.histogram import histogram_quantile
from cachescale.sim.fleet import Pod
from cachescale.sim.scrape import (
    ABORTED_AT,
    COMPUTED_SUM_AT,
    GENERATION_TOKENS_AT,
    HITS_AT,
    MIN_SAMPLES_FOR_RATE,
    PREEMPTIONS_AT,
    PROMPT_TOKENS_AT,
    QUERIES_AT,
    SUCCESS_AT,
    CounterLayout,
    HistogramColumns,
    PodSeries,
    PodWindow,
)
from cachescale.snapshot import (
    DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
    SIGNAL_UNITS,
    EngineSignals,
    Measured,
    MetricsGeneration,
    PodSignals,
    Unit,
)

# Series named in "unknown" reasons, as vLLM exports them.
_QUERIES = VLLM_PREFIX_CACHE_QUERIES
_RUNNING = "vllm:num_requests_running"
_COMPUTED = "vllm:request_prefill_kv_computed_tokens"
_TTFT = "vllm:time_to_first_token_seconds_bucket"
_ITL = "vllm:inter_token_latency_seconds_bucket"
_NO_REQUESTS = "no requests finished in the window"


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
        self._series: dict[str, PodSeries] = {}
        self._holding: dict[str, Pod] = {}
        """Every pod seen holding GPUs within the retention, by name."""
        self._layout: CounterLayout | None = None
        self._last_scrape_s = -math.inf

    def scrape(self, pods: Iterable[Pod], now_s: float) -> None:
        """Record one sample per pod that exports metrics: ready and not gone (a pod still
        loading weights exports nothing); every pod given, starting ones included, holds
        GPUs (kube-state-metrics lists it). Samples older than the retention are dropped."""
        if now_s <= self._last_scrape_s:
            raise ValueError(f"scrape at {now_s}s after one at {self._last_scrape_s}s")
        self._last_scrape_s = now_s
        for pod in pods:
            self._holding[pod.name] = pod
            if pod.ready_s <= now_s and pod.gone_s is None:
                self._series_of(pod).record(now_s)
        self._forget_before(now_s - self._retention_s)

    def _series_of(self, pod: Pod) -> PodSeries:
        series = self._series.get(pod.name)
        if series is None:
            layout = CounterLayout.of(pod)
            if self._layout is None:
                self._layout = layout
            elif layout != self._layout:
                raise ValueError(f"pod {pod.name} exports other histogram buckets than its peers")
            series = self._series[pod.name] = PodSeries(pod)
        return series

    def _forget_before(self, t: float) -> None:
        for name, series in list(self._series.items()):
            series.forget_before(t)
            if not series.samples:
                del self._series[name]
        for name, pod in list(self._holding.items()):
            if pod.gone_s is not None and pod.gone_s < t:
                del self._holding[name]

    def signals(
        self,
        now_s: float,
        window_s: float,
        *,
        observed_at: datetime,
    ) -> EngineSignals:
        """``EngineSignals`` over ``(now_s − window_s, now_s]``, as gather computes them."""
        if not 0 < window_s <= self._retention_s:
            raise ValueError(f"window must be in (0, {self._retention_s}] s, got {window_s}")
        windows = [
            window
            for series in self._series.values()
            if (window := PodWindow.read(series, now_s - window_s, now_s)) is not None
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
        held = math.fsum(
            pod.gpu_seconds_between(now_s - window_s, now_s) for pod in self._holding.values()
        )
        return evaluation.snapshot(observed_at, held)


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
        windows: Sequence[PodWindow],
        layout: CounterLayout,
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

    def snapshot(self, observed_at: datetime, gpu_seconds: float) -> EngineSignals:
        """The signals, with ``gpu_seconds`` the GPUs every pod held over the window."""
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
                lambda: self._gpu_seconds_per_1k(gpu_seconds),
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
        return self._rates[SUCCESS_AT] > 0

    def _requests_per_second(self) -> Measured:
        return Measured.known(self._rates[SUCCESS_AT], Unit.REQUESTS_PER_SECOND)

    def _arrivals_per_second(self) -> Measured:
        finished = self._rates[SUCCESS_AT] + self._rates[ABORTED_AT]
        arrivals = max(0.0, finished + self._growth / self._window_s)
        return Measured.known(arrivals, Unit.REQUESTS_PER_SECOND)

    def _preemptions_per_second(self) -> Measured:
        return Measured.known(self._rates[PREEMPTIONS_AT], Unit.PREEMPTIONS_PER_SECOND)

    def _hit_rate(self) -> Measured:
        no_lookups = (
            f"{_QUERIES} did not increase although requests finished: prefix caching is off, "
            "or lookups were skipped"
            if self._traffic
            else "no traffic: no prompt tokens were looked up in the window"
        )
        return _ratio(self._rates[HITS_AT], self._rates[QUERIES_AT], Unit.RATIO, no_lookups)

    def _hit_rate_with_external(self) -> Measured:
        """The local hit rate: the simulated pods have no KV connector, so they export
        ``vllm:external_prefix_cache_hits`` at 0, as vLLM does without one (the emulator
        serves it so), and local plus external hits are the local hits."""
        return self._hit_rate()

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
        return _ratio(self._rates[COMPUTED_SUM_AT], computed, Unit.TOKENS_PER_REQUEST, _NO_REQUESTS)

    def _quantile(self, q: float, histogram: HistogramColumns, reads: str) -> Measured:
        value = histogram_quantile(q, histogram.buckets(self._rates))
        if math.isnan(value):
            reason = (
                f"{reads} has no observations in the window although requests finished"
                if self._traffic
                else "no traffic: no observations in the window"
            )
            return Measured.unknown(reason, Unit.SECONDS)
        return Measured.known(value, Unit.SECONDS)

    def _gpu_seconds_per_1k(self, gpu_seconds: float) -> Measured:
        """GPU-seconds held over the window (every pod, starting ones included) per 1000
        finished requests."""
        thousands_finished = self._rates[SUCCESS_AT] * self._window_s / 1000
        return _ratio(
            gpu_seconds,
            thousands_finished,
            Unit.GPU_SECONDS_PER_1K_REQUESTS,
            "no requests finished in the window: cost per request is undefined",
        )

    def _context_tokens_per_request(self) -> Measured:
        tokens = self._rates[PROMPT_TOKENS_AT] + self._rates[GENERATION_TOKENS_AT]
        return _ratio(tokens, self._rates[SUCCESS_AT], Unit.TOKENS_PER_REQUEST, _NO_REQUESTS)

    # --- per pod ---------------------------------------------------------------------------

    def _pod(self, window: PodWindow) -> PodSignals:
        if window.rates is None:
            reason = (
                f"only {window.samples:g} sample(s) of this pod in the window (new pod?); a "
                f"rate needs {MIN_SAMPLES_FOR_RATE}"
            )
            hit_rate = Measured.unknown(reason, Unit.RATIO)
            looked_up = Measured.unknown(reason, Unit.TOKENS_PER_SECOND)
        else:
            looked_up = Measured.known(window.rates[QUERIES_AT], Unit.TOKENS_PER_SECOND)
            hit_rate = _ratio(
                window.rates[HITS_AT],
                window.rates[QUERIES_AT],
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
