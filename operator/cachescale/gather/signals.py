"""Turn one evaluation's PromQL results into an ``EngineSignals`` snapshot, honestly.

Why this layer exists: Prometheus answers "nothing" in many ways (an empty vector, NaN
from 0/0, a rate over one sample, a counter that never moved), and an autoscaler that
reads any of them as 0 scales on fiction. Here every signal becomes a known number or an
unknown with the reason, by these rules:

* an absent series, NaN or ±Inf → unknown, naming the series;
* a latency quantile is computed here from its histogram's bucket rates, exactly as
  Prometheus's ``histogram_quantile`` would (``cachescale.histogram``), and is unknown
  where that would be NaN (no observations, no ``+Inf`` bucket or no other), with the
  reason; it is marked a lower bound past the last finite bucket, and given its bucket
  when that is wide;
* fewer than ``min_samples`` samples per series in the window → rate-based signals unknown
  (gauges need one sample);
* a ratio whose denominator did not increase → unknown, and the reason says whether that
  is "no traffic" or "a counter that should move with traffic did not";
* more than one series where one is expected → ``AmbiguousSeriesError`` naming the label
  sets: the selector matches more than one deployment, and summing them would be wrong;
* the policy's own ``demandQuery`` (a user's PromQL, sent verbatim in its own request) that
  fails, or returns anything but one finite, non-negative series → the arrival rate alone
  is unknown, with the reason; the other signals are unaffected.

Counter resets need no handling here: every counter is read through ``rate()``, which
Prometheus corrects for resets. Everything here is pure (results in, snapshot out), so it
is tested without HTTP; the round trips that fetch the results are ``gather.reading``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.spec import Engine
from cachescale.gather.promql import (
    VLLM_CACHE_CONFIG,
    Detection,
    Query,
    QueryKey,
    duration,
)
from cachescale.gather.selector import POD_LABEL, ResultSeries, Selector
from cachescale.histogram import BucketQuantile, NoQuantile, locate_quantile
from cachescale.snapshot import (
    DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
    CacheConfig,
    EngineCacheConfig,
    EngineSignals,
    Measured,
    MetricsGeneration,
    PodSignals,
    Unit,
)

_ABSENT_HINTS = {
    QueryKey.HITS_EXTERNAL: " (no KV connector or storage tier configured?)",
    QueryKey.POD_AGE: " (is kube-state-metrics scraped?)",
    QueryKey.GPU_SECONDS: " (is kube-state-metrics scraped, with GPU requests on the pods?)",
}
_NO_FULL_HIT_HISTOGRAM = {
    MetricsGeneration.VLLM_0_9_2: (
        "needs vllm:request_prefill_kv_computed_tokens (vLLM 0.13 or newer, on every pod)"
    ),
    MetricsGeneration.SGLANG_0_5_20: "SGLang exports no per-request computed-token histogram",
}


DEMAND_QUERY_FIELD = "metrics.demandQuery"
"""The policy field holding the user's arrival-rate query (named in unknown reasons)."""


def _label_text(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class AmbiguousSeriesError(Exception):
    """More than one series where one is expected: the selector is not specific enough."""

    def __init__(self, selector: Selector, reads: str, label_sets: Sequence[Mapping[str, str]]):
        self.label_sets = [dict(labels) for labels in label_sets]
        shown = ", ".join(_label_text(labels) for labels in self.label_sets)
        super().__init__(
            f"selector {selector} matches {len(label_sets)} series of {reads} where one is "
            f"expected: {shown}; add labels to the selector so it picks one deployment"
        )


@dataclass(frozen=True)
class SignalRequest:
    """What to read for one policy, and the Kubernetes-side facts the formulas need."""

    engine: Engine
    selector: Selector
    window_seconds: float
    full_hit_max_computed_tokens: float = DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS
    min_samples: int = 2
    """Samples per series a rate needs in the window (Prometheus' own minimum is 2)."""
    gpus_per_pod: float | None = None
    """GPUs one pod requests (from the Deployment's resource requests)."""
    ready_replicas: float | None = None
    """Ready replicas of the Deployment at evaluation time (``cachescale report``: the
    mean number of pods over the window, which may be fractional)."""
    pod_ages_seconds: Mapping[str, float] | None = None
    """Pod name → seconds since it became ready, from the Kubernetes API."""
    kube_state_metrics: bool = False
    """Also read pod ages and GPU-seconds from kube-state-metrics."""
    ksm_step_seconds: float = 30.0
    """Subquery step for integrating GPU requests over the window."""
    demand_query: str | None = None
    """The policy's ``metrics.demandQuery``: PromQL for the arrival rate (e.g. a gateway's
    request counter) that replaces the engines' estimate."""


def demand_from_result(series: Sequence[ResultSeries]) -> Measured:
    """The arrival rate from a demand query's result: exactly one finite series ≥ 0."""
    unit = Unit.REQUESTS_PER_SECOND
    if len(series) != 1:
        shown = ", ".join(_label_text(s.labels) for s in series[:3])
        more = f" and {len(series) - 3} more" if len(series) > 3 else ""
        found = f"{len(series)} series ({shown}{more})" if series else "no series"
        return _unknown(
            f"{DEMAND_QUERY_FIELD} returned {found}; it must return exactly one "
            "(aggregate it, e.g. sum(rate(...)))",
            unit,
        )
    value = series[0].value
    if not math.isfinite(value) or value < 0:
        return _unknown(f"{DEMAND_QUERY_FIELD} returned {value}, not an arrival rate", unit)
    return Measured.known(value, unit)


def compute_signals(
    request: SignalRequest,
    detection: Detection,
    queries: Mapping[QueryKey, Query],
    results: Mapping[QueryKey, Sequence[ResultSeries]],
    at: datetime,
    *,
    demand: Measured | None = None,
) -> EngineSignals:
    """The snapshot for one policy from its (already split) query results; ``demand``
    (the answer to the policy's demand query) replaces the arrival estimate."""
    if detection.profile is None:
        raise ValueError("compute_signals needs a detected profile")
    computation = _Computation(request, detection.profile, queries, results)
    return computation.snapshot(at, detection.notes, demand)


def _unknown(reason: str, unit: Unit) -> Measured:
    return Measured.unknown(reason, unit)


def _ratio(numerator: Measured, denominator: Measured, unit: Unit, zero_reason: str) -> Measured:
    """numerator / denominator, unknown if either is, or if the denominator is 0."""
    if numerator.value is None or denominator.value is None:
        return _unknown(str(numerator.reason or denominator.reason), unit)
    if denominator.value == 0:
        return _unknown(zero_reason, unit)
    return Measured.known(numerator.value / denominator.value, unit)


class _Computation:
    """One policy's results and the rules that turn them into measurements."""

    def __init__(
        self,
        request: SignalRequest,
        profile: MetricsGeneration,
        queries: Mapping[QueryKey, Query],
        results: Mapping[QueryKey, Sequence[ResultSeries]],
    ) -> None:
        self._request = request
        self._profile = profile
        self._queries = queries
        self._results = results
        self._window = duration(request.window_seconds)
        self._parsed_buckets: dict[QueryKey, dict[float, Measured]] = {}

    # --- reading results -------------------------------------------------------------

    def _reads(self, key: QueryKey) -> str:
        return self._queries[key].reads

    def _absent(self, key: QueryKey) -> str:
        return (
            f"{self._reads(key)} has no data for {self._request.selector} over the "
            f"{self._window} window{_ABSENT_HINTS.get(key, '')}"
        )

    def _finite(self, key: QueryKey, value: float, unit: Unit) -> Measured:
        if math.isfinite(value):
            return Measured.known(value, unit)
        return _unknown(f"Prometheus returned {value} for {self._reads(key)}", unit)

    def fleet(self, key: QueryKey, unit: Unit) -> Measured:
        """The single series a fleet-level query must return."""
        series = self._results.get(key, ())
        if len(series) > 1:
            raise AmbiguousSeriesError(
                self._request.selector, self._reads(key), [s.labels for s in series]
            )
        if not series:
            return _unknown(self._absent(key), unit)
        return self._finite(key, series[0].value, unit)

    def per_pod(self, key: QueryKey, unit: Unit) -> dict[str, Measured]:
        """One value per pod (pods missing from the result are left out)."""
        by_pod: dict[str, Measured] = {}
        for s in self._results.get(key, ()):
            pod = s.labels.get(POD_LABEL, "")
            if pod in by_pod:
                duplicates = [
                    x.labels for x in self._results[key] if x.labels.get(POD_LABEL, "") == pod
                ]
                raise AmbiguousSeriesError(self._request.selector, self._reads(key), duplicates)
            by_pod[pod] = self._finite(key, s.value, unit)
        return by_pod

    # --- signals ---------------------------------------------------------------------

    def snapshot(
        self, at: datetime, notes: tuple[str, ...], demand: Measured | None = None
    ) -> EngineSignals:
        samples = self.per_pod(QueryKey.POD_SAMPLES, Unit.REQUESTS)
        if not samples:
            reason = self._absent(QueryKey.POD_SAMPLES)
            return EngineSignals.all_unknown(
                reason,
                observed_at=at,
                window_seconds=self._request.window_seconds,
                profile=self._profile,
                notes=notes,
            )
        rps = self.fleet(QueryKey.REQUESTS, Unit.REQUESTS_PER_SECOND)
        full_hit_share, full_hit_bound = self._full_hit_share(rps)
        pods, pod_note = self._pods(samples)
        gate = self._rate_gate(samples)
        return EngineSignals(
            profile=self._profile,
            observed_at=at,
            window_seconds=self._request.window_seconds,
            token_hit_rate_local=gate(self._hit_rate(rps)),
            token_hit_rate_with_external=gate(self._hit_rate_with_external(rps)),
            request_full_hit_share=gate(full_hit_share),
            full_hit_max_computed_tokens=full_hit_bound,
            prefill_tokens_per_request=gate(self._prefill_per_request(rps)),
            ttft_p50_seconds=gate(self._quantile(0.5, QueryKey.TTFT_BUCKETS, rps)),
            ttft_p95_seconds=gate(self._quantile(0.95, QueryKey.TTFT_BUCKETS, rps)),
            ttft_p99_seconds=gate(self._quantile(0.99, QueryKey.TTFT_BUCKETS, rps)),
            itl_p95_seconds=gate(self._quantile(0.95, QueryKey.ITL_BUCKETS, rps)),
            requests_per_second=gate(rps),
            arrivals_per_second=(
                demand
                if demand is not None
                else gate(self.fleet(QueryKey.ARRIVALS, Unit.REQUESTS_PER_SECOND))
            ),
            preemptions_per_second=gate(
                self.fleet(QueryKey.PREEMPTIONS, Unit.PREEMPTIONS_PER_SECOND)
            ),
            waiting_requests_per_pod=self._mean_per_pod(pods, "waiting_requests", pod_note),
            running_requests_per_pod=self._mean_per_pod(pods, "running_requests", pod_note),
            kv_cache_usage_ratio=self.fleet(QueryKey.KV_USAGE, Unit.RATIO),
            gpu_seconds_per_1k_requests=gate(self._gpu_seconds_per_1k(rps)),
            context_tokens_per_request=gate(
                _ratio(
                    self.fleet(QueryKey.CONTEXT_TOKENS, Unit.TOKENS_PER_SECOND),
                    rps,
                    Unit.TOKENS_PER_REQUEST,
                    "no requests finished in the window",
                )
            ),
            pods=pods,
            cache_config=self._cache_config(),
            notes=notes + ((pod_note,) if pod_note else ()),
        )

    def _rate_gate(self, samples: Mapping[str, Measured]) -> Callable[[Measured], Measured]:
        """Identity, or (too few samples for a rate) a function making a signal unknown.

        The reason says what was seen: the largest sample count, or that no count could be
        read at all (never "0 samples" for a count Prometheus did not give)."""
        counts = [s.value for s in samples.values() if s.value is not None]
        most = max(counts, default=None)
        if most is not None and most >= self._request.min_samples:
            return lambda measured: measured
        needs = f"rates need at least {self._request.min_samples}"
        if most is None:
            unread = next(s.reason for s in samples.values() if s.reason is not None)
            reason = f"the sample count per series could not be read ({unread}); {needs}"
        else:
            reason = (
                f"only {most:g} sample(s) per series in the {self._window} window; {needs} "
                "(just started, or the window is shorter than two scrape intervals)"
            )
        return lambda measured: _unknown(reason, measured.unit)

    def _no_traffic(self, rps: Measured, nothing: str) -> str | None:
        """Why ``nothing`` happened when the request rate is zero or unknown; None when
        requests did finish (the caller then names the series that should have moved).

        Zero finished requests is "no traffic"; an unknown rate is not, and the reason
        carries why it is unknown."""
        if rps.value is None:
            return f"{nothing} in the window, and the request rate is unknown: {rps.reason}"
        if rps.value == 0:
            return f"no traffic: {nothing} in the window"
        return None

    def _no_lookups(self, rps: Measured) -> str:
        return self._no_traffic(rps, "no prompt tokens were looked up") or (
            f"{self._reads(QueryKey.LOOKED_UP)} did not increase although {rps.value:.3g} "
            "requests/s finished: prefix caching is off, or lookups were skipped"
        )

    def _hit_rate(self, rps: Measured) -> Measured:
        return _ratio(
            self.fleet(QueryKey.HITS_LOCAL, Unit.TOKENS_PER_SECOND),
            self.fleet(QueryKey.LOOKED_UP, Unit.TOKENS_PER_SECOND),
            Unit.RATIO,
            self._no_lookups(rps),
        )

    def _hit_rate_with_external(self, rps: Measured) -> Measured:
        local = self.fleet(QueryKey.HITS_LOCAL, Unit.TOKENS_PER_SECOND)
        external = self.fleet(QueryKey.HITS_EXTERNAL, Unit.TOKENS_PER_SECOND)
        if local.value is None or external.value is None:
            return _unknown(str(local.reason or external.reason), Unit.RATIO)
        both = Measured.known(local.value + external.value, Unit.TOKENS_PER_SECOND)
        looked_up = self.fleet(QueryKey.LOOKED_UP, Unit.TOKENS_PER_SECOND)
        return _ratio(both, looked_up, Unit.RATIO, self._no_lookups(rps))

    def _full_hit_share(self, rps: Measured) -> tuple[Measured, float | None]:
        """Share of requests at or under the threshold, read at the highest bucket bound
        not above it; also returns that bound."""
        if self._profile in _NO_FULL_HIT_HISTOGRAM:
            return _unknown(_NO_FULL_HIT_HISTOGRAM[self._profile], Unit.RATIO), None
        threshold = self._request.full_hit_max_computed_tokens
        buckets = self._buckets(QueryKey.COMPUTED_BUCKETS)
        bounds = [bound for bound in buckets if bound <= threshold]
        if not bounds:
            reason = (
                self._absent(QueryKey.COMPUTED_BUCKETS)
                if not buckets
                else f"no bucket bound of {self._reads(QueryKey.COMPUTED_BUCKETS)} is at or "
                f"below {threshold:g} tokens"
            )
            return _unknown(reason, Unit.RATIO), None
        bound = max(bounds)
        zero = self._no_traffic(rps, "no requests finished") or (
            f"{self._reads(QueryKey.COMPUTED_COUNT)} did not increase although "
            f"{rps.value:.3g} requests/s finished"
        )
        share = _ratio(
            buckets[bound],
            self.fleet(QueryKey.COMPUTED_COUNT, Unit.REQUESTS_PER_SECOND),
            Unit.RATIO,
            zero,
        )
        if share.value is not None and share.value > 1:  # float rounding of two rates
            share = Measured.known(1.0, Unit.RATIO)
        return share, bound

    def _buckets(self, key: QueryKey, *, with_inf: bool = False) -> dict[float, Measured]:
        """Bucket bound → rate, from a ``sum by (..., le)`` result of one group; finite
        bounds only unless ``with_inf``."""
        if key not in self._parsed_buckets:  # the TTFT buckets serve three quantiles
            self._parsed_buckets[key] = self._read_buckets(key)
        buckets = self._parsed_buckets[key]
        return buckets if with_inf else {b: m for b, m in buckets.items() if b != math.inf}

    def _read_buckets(self, key: QueryKey) -> dict[float, Measured]:
        """Every bound of ``key``'s buckets but NaN, -Inf and an ``le`` that is no number
        (``histogram_quantile`` skips it too), after checking they are one group's (the
        label sets compared without ``le``, as ``_label_text`` shows them). A bound written
        two ways (``1`` and ``1.0``, by two client versions) is one bucket: its rates are
        added, as ``histogram_quantile`` merges equal bounds."""
        series = self._results.get(key, ())
        groups = [{k: v for k, v in s.labels.items() if k != "le"} for s in series]
        if any(g != groups[0] for g in groups) and len(set(map(_label_text, groups))) > 1:
            raise AmbiguousSeriesError(
                self._request.selector,
                self._reads(key),
                [s.labels for s in series if s.labels.get("le") == "+Inf"],
            )
        buckets: dict[float, Measured] = {}
        for s in series:
            bound = _bound(s.labels.get("le", ""))
            if math.isfinite(bound) or bound == math.inf:
                rate = self._finite(key, s.value, Unit.REQUESTS_PER_SECOND)
                buckets[bound] = _sum(buckets[bound], rate) if bound in buckets else rate
        return buckets

    def _prefill_per_request(self, rps: Measured) -> Measured:
        computed = self.fleet(QueryKey.PREFILL_COMPUTED, Unit.TOKENS_PER_SECOND)
        if computed.value is not None and computed.value < 0:
            return _unknown(
                f"{self._reads(QueryKey.PREFILL_COMPUTED)} is negative: vLLM up to 0.26 counts "
                "a blocked request's cache lookups again at every step",
                Unit.TOKENS_PER_REQUEST,
            )
        requests = (
            self.fleet(QueryKey.COMPUTED_COUNT, Unit.REQUESTS_PER_SECOND)
            if self._profile is MetricsGeneration.VLLM_0_13
            else rps
        )
        return _ratio(
            computed, requests, Unit.TOKENS_PER_REQUEST, "no requests finished in the window"
        )

    def _quantile(self, q: float, key: QueryKey, rps: Measured) -> Measured:
        """The ``q``-quantile of ``key``'s buckets, as ``histogram_quantile(q, <key>)``
        would give it, qualified by the bucket it lies in; the reason when there is none."""
        buckets = self._buckets(key, with_inf=True)
        if not buckets:
            return _unknown(self._absent(key), Unit.SECONDS)
        rates = _known_rates(buckets)
        if isinstance(rates, Measured):
            return rates
        located = locate_quantile(q, rates.items())
        if isinstance(located, NoQuantile):
            return _unknown(self._no_quantile(key, located, rps), Unit.SECONDS)
        return _qualified(located)

    def _no_quantile(self, key: QueryKey, why: NoQuantile, rps: Measured) -> str:
        """Why ``key``'s buckets give no quantile (``histogram_quantile`` answers NaN)."""
        reads, selector = self._reads(key), self._request.selector
        if why is NoQuantile.NO_INF_BUCKET:
            return (
                f'{reads} has no le="+Inf" bucket for {selector} over the {self._window} '
                "window: without the count of every observation there is no quantile"
            )
        if why is NoQuantile.NO_FINITE_BUCKET:
            return (
                f'{reads} has only its le="+Inf" bucket for {selector}: no finite bound '
                "to place a quantile at"
            )
        return self._no_traffic(rps, f"no observations of {reads}") or (
            f"{reads} has no observations in the window although {rps.value:.3g} "
            "requests/s finished"
        )

    def _gpu_seconds_per_1k(self, rps: Measured) -> Measured:
        unit = Unit.GPU_SECONDS_PER_1K_REQUESTS
        request = self._request
        if request.gpus_per_pod is not None and request.ready_replicas is not None:
            gpu_seconds = Measured.known(
                request.gpus_per_pod * request.ready_replicas * request.window_seconds, unit
            )
        elif request.kube_state_metrics:
            gpu_seconds = self.fleet(QueryKey.GPU_SECONDS, unit)
        else:
            return _unknown(
                "needs GPUs per pod and ready replicas (from the Deployment) or kube-state-metrics",
                unit,
            )
        if rps.value is None:
            return _unknown(str(rps.reason), unit)
        finished = Measured.known(rps.value * request.window_seconds / 1000, unit)
        return _ratio(
            gpu_seconds,
            finished,
            unit,
            "no requests finished in the window: cost per request is undefined",
        )

    def _cache_config(self) -> CacheConfig:
        """Each engine's ``vllm:cache_config_info`` labels; a label that is absent or
        unreadable is None (an older vLLM exports no hash algorithm), never a default."""
        if QueryKey.POD_CACHE_CONFIG not in self._queries:
            return CacheConfig.unknown(
                "SGLang exports no cache configuration metric (no equivalent of "
                f"{VLLM_CACHE_CONFIG}): its hash algorithm cannot be read"
            )
        series = self._results.get(QueryKey.POD_CACHE_CONFIG, ())
        if not series:
            return CacheConfig.unknown(
                f"{VLLM_CACHE_CONFIG} has no data for {self._request.selector}"
            )
        engines = sorted(
            (_engine_cache_config(s.labels) for s in series),
            key=lambda e: (e.pod, str(e.hash_algo), str(e.prefix_caching), e.block_size or 0),
        )
        return CacheConfig(engines=tuple(engines))

    # --- pods ------------------------------------------------------------------------

    def _pods(self, samples: Mapping[str, Measured]) -> tuple[tuple[PodSignals, ...], str]:
        """Per-pod signals, or none and the reason when the series carry no pod label."""
        if "" in samples:
            return (), (
                f"engine series carry no '{POD_LABEL}' label, so per-pod signals are "
                "unavailable: add it in the scrape config (a PodMonitor does)"
            )
        hits = self.per_pod(QueryKey.POD_HITS, Unit.TOKENS_PER_SECOND)
        looked_up = self.per_pod(QueryKey.POD_LOOKED_UP, Unit.TOKENS_PER_SECOND)
        waiting = self.per_pod(QueryKey.POD_WAITING, Unit.REQUESTS)
        running = self.per_pod(QueryKey.POD_RUNNING, Unit.REQUESTS)
        kv_usage = self.per_pod(QueryKey.POD_KV_USAGE, Unit.RATIO)
        ages = self._ages(sorted(samples))
        pods = []
        for pod in sorted(samples):
            count = samples[pod].value
            if count is None or count < self._request.min_samples:
                reason = (
                    f"this pod's sample count could not be read ({samples[pod].reason}); a "
                    f"rate needs {self._request.min_samples}"
                    if count is None
                    else f"only {count:g} sample(s) of this pod in the window (new pod?); a "
                    f"rate needs {self._request.min_samples}"
                )
                hit_rate = _unknown(reason, Unit.RATIO)
                volume = _unknown(reason, Unit.TOKENS_PER_SECOND)
            else:
                missing = _unknown(
                    f"{self._reads(QueryKey.POD_HITS)} has no data for pod {pod}",
                    Unit.TOKENS_PER_SECOND,
                )
                volume = looked_up.get(pod, missing)
                hit_rate = _ratio(
                    hits.get(pod, missing),
                    volume,
                    Unit.RATIO,
                    "no prompt tokens were looked up on this pod in the window",
                )
            absent = f"no samples for pod {pod} in the window"
            pods.append(
                PodSignals(
                    pod=pod,
                    age_seconds=ages[pod],
                    token_hit_rate=hit_rate,
                    prompt_tokens_looked_up_per_second=volume,
                    waiting_requests=waiting.get(pod, _unknown(absent, Unit.REQUESTS)),
                    running_requests=running.get(pod, _unknown(absent, Unit.REQUESTS)),
                    kv_cache_usage_ratio=kv_usage.get(pod, _unknown(absent, Unit.RATIO)),
                )
            )
        return tuple(pods), ""

    def _ages(self, pods: Sequence[str]) -> dict[str, Measured]:
        """Pod ages from the Kubernetes API if given, else from kube-state-metrics."""
        given = self._request.pod_ages_seconds
        if given is not None:
            missing = "not among the pods the Kubernetes API listed (terminated?)"
            return {
                pod: Measured.known(given[pod], Unit.SECONDS)
                if pod in given
                else _unknown(missing, Unit.SECONDS)
                for pod in pods
            }
        if self._request.kube_state_metrics:
            found = self.per_pod(QueryKey.POD_AGE, Unit.SECONDS)
            absent = self._absent(QueryKey.POD_AGE)
            return {pod: found.get(pod, _unknown(absent, Unit.SECONDS)) for pod in pods}
        reason = "pod ages not given (from the Kubernetes API) and kube-state-metrics not used"
        return {pod: _unknown(reason, Unit.SECONDS) for pod in pods}

    @staticmethod
    def _mean_per_pod(pods: Sequence[PodSignals], attribute: str, pod_note: str) -> Measured:
        """Mean of a per-pod gauge; unknown if any pod's value is."""
        if not pods:
            return _unknown(pod_note or "no pods", Unit.REQUESTS)
        values = []
        for pod in pods:
            measured: Measured = getattr(pod, attribute)
            if measured.value is None:
                return _unknown(f"pod {pod.pod}: {measured.reason}", Unit.REQUESTS)
            values.append(measured.value)
        return Measured.known(sum(values) / len(values), Unit.REQUESTS)


def _bound(le: str) -> float:
    """A bucket's ``le`` label as a number; NaN when it is none."""
    try:
        return float(le)
    except ValueError:
        return math.nan


def _sum(first: Measured, second: Measured) -> Measured:
    """Two rates added; the first unknown one if either is."""
    if first.value is None or second.value is None:
        return first if first.value is None else second
    return Measured.known(first.value + second.value, first.unit)


def _known_rates(buckets: Mapping[float, Measured]) -> dict[float, float] | Measured:
    """Bound → rate of every bucket, or the first unknown rate (a quantile needs all)."""
    rates: dict[float, float] = {}
    for bound, rate in buckets.items():
        if rate.value is None:
            return _unknown(str(rate.reason), Unit.SECONDS)
        rates[bound] = rate.value
    return rates


def _qualified(located: BucketQuantile) -> Measured:
    """The quantile as far as its bucket allows: a lower bound when its rank is past the
    last finite bucket (the value is then that bucket's bound), the value with its bucket
    when that bucket is wider than twice its lower edge, else the value."""
    if located.upper == math.inf:
        return Measured.quantile(located.value, Unit.SECONDS, lower_bound=True)
    if located.upper > 2 * located.lower:
        bucket = (located.lower, located.upper)
        return Measured.quantile(located.value, Unit.SECONDS, bucket=bucket)
    return Measured.known(located.value, Unit.SECONDS)


def _engine_cache_config(labels: Mapping[str, str]) -> EngineCacheConfig:
    """One ``vllm:cache_config_info`` series as settings (Python's ``str`` of the values:
    ``True``/``False``, ``16``)."""
    caching = {"True": True, "False": False}.get(labels.get("enable_prefix_caching", ""))
    size = labels.get("block_size", "")
    return EngineCacheConfig(
        pod=labels.get(POD_LABEL, ""),
        hash_algo=labels.get("prefix_caching_hash_algo") or None,
        prefix_caching=caching,
        block_size=int(size) if size.isdigit() else None,
    )
