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
The rules every signal shares (one series, finite, ratios) are ``gather.series_reader``'s,
the quantiles and the full-hit share ``gather.quantiles``', the per-pod signals and the
cache configuration ``gather.pod_signals``'; this module puts the snapshot together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.spec import Engine
from cachescale.gather.detection import Detection
from cachescale.gather.pod_signals import cache_config, mean_per_pod, pod_signals
from cachescale.gather.promql import Query, QueryKey
from cachescale.gather.quantiles import full_hit_share, quantile
from cachescale.gather.selector import ResultSeries, Selector
from cachescale.gather.series_reader import SeriesReader, label_text, no_traffic, ratio, unknown
from cachescale.snapshot import (
    DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
    EngineSignals,
    Measured,
    MetricsGeneration,
    Unit,
)

DEMAND_QUERY_FIELD = "metrics.demandQuery"
"""The policy field holding the user's arrival-rate query (named in unknown reasons)."""


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
    pods_holding_gpus: float | None = None
    """Pods holding GPUs, starting ones included: the Deployment's ``status.replicas`` at
    evaluation time, not the window's mean (``cachescale report``: the mean number of
    pods over the window, which may be fractional). Read only without
    ``kube_state_metrics``."""
    pod_ages_seconds: Mapping[str, float] | None = None
    """Pod name → seconds since it became ready, from the Kubernetes API."""
    kube_state_metrics: bool = False
    """Also read pod ages and GPU-seconds from kube-state-metrics (the GPU-seconds then
    come from there alone: the window's mean, where ``pods_holding_gpus`` is one count)."""
    ksm_step_seconds: float = 30.0
    """Subquery step for integrating GPU requests over the window."""
    demand_query: str | None = None
    """The policy's ``metrics.demandQuery``: PromQL for the arrival rate (e.g. a gateway's
    request counter) that replaces the engines' estimate."""


def demand_from_result(series: Sequence[ResultSeries]) -> Measured:
    """The arrival rate from a demand query's result: exactly one finite series ≥ 0."""
    unit = Unit.REQUESTS_PER_SECOND
    if len(series) != 1:
        shown = ", ".join(label_text(s.labels) for s in series[:3])
        more = f" and {len(series) - 3} more" if len(series) > 3 else ""
        found = f"{len(series)} series ({shown}{more})" if series else "no series"
        return unknown(
            f"{DEMAND_QUERY_FIELD} returned {found}; it must return exactly one "
            "(aggregate it, e.g. sum(rate(...)))",
            unit,
        )
    value = series[0].value
    if not math.isfinite(value) or value < 0:
        return unknown(f"{DEMAND_QUERY_FIELD} returned {value}, not an arrival rate", unit)
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


class _Computation:
    """One policy's results and the rules that turn them into its snapshot."""

    def __init__(
        self,
        request: SignalRequest,
        profile: MetricsGeneration,
        queries: Mapping[QueryKey, Query],
        results: Mapping[QueryKey, Sequence[ResultSeries]],
    ) -> None:
        self._request = request
        self._profile = profile
        self._read = SeriesReader(request.selector, request.window_seconds, queries, results)

    def snapshot(
        self, at: datetime, notes: tuple[str, ...], demand: Measured | None = None
    ) -> EngineSignals:
        read, request = self._read, self._request
        samples = read.per_pod(QueryKey.POD_SAMPLES, Unit.REQUESTS)
        if not samples:
            reason = read.absent(QueryKey.POD_SAMPLES)
            return EngineSignals.all_unknown(
                reason,
                observed_at=at,
                window_seconds=request.window_seconds,
                profile=self._profile,
                notes=notes,
            )
        rps = read.fleet(QueryKey.REQUESTS, Unit.REQUESTS_PER_SECOND)
        threshold = request.full_hit_max_computed_tokens
        full_hit, full_hit_bound = full_hit_share(read, self._profile, threshold, rps)
        pods, pod_note = pod_signals(
            read, samples, request.min_samples, request.pod_ages_seconds, request.kube_state_metrics
        )
        gate = self._rate_gate(samples)
        return EngineSignals(
            profile=self._profile,
            observed_at=at,
            window_seconds=request.window_seconds,
            token_hit_rate_local=gate(self._hit_rate(rps)),
            token_hit_rate_with_external=gate(self._hit_rate_with_external(rps)),
            request_full_hit_share=gate(full_hit),
            full_hit_max_computed_tokens=full_hit_bound,
            prefill_tokens_per_request=gate(self._prefill_per_request(rps)),
            ttft_p50_seconds=gate(quantile(read, 0.5, QueryKey.TTFT_BUCKETS, rps)),
            ttft_p95_seconds=gate(quantile(read, 0.95, QueryKey.TTFT_BUCKETS, rps)),
            ttft_p99_seconds=gate(quantile(read, 0.99, QueryKey.TTFT_BUCKETS, rps)),
            itl_p95_seconds=gate(quantile(read, 0.95, QueryKey.ITL_BUCKETS, rps)),
            requests_per_second=gate(rps),
            arrivals_per_second=(
                demand
                if demand is not None
                else gate(read.fleet(QueryKey.ARRIVALS, Unit.REQUESTS_PER_SECOND))
            ),
            preemptions_per_second=gate(
                read.fleet(QueryKey.PREEMPTIONS, Unit.PREEMPTIONS_PER_SECOND)
            ),
            waiting_requests_per_pod=mean_per_pod(pods, "waiting_requests", pod_note),
            running_requests_per_pod=mean_per_pod(pods, "running_requests", pod_note),
            kv_cache_usage_ratio=read.fleet(QueryKey.KV_USAGE, Unit.RATIO),
            gpu_seconds_per_1k_requests=gate(self._gpu_seconds_per_1k(rps)),
            context_tokens_per_request=gate(
                ratio(
                    read.fleet(QueryKey.CONTEXT_TOKENS, Unit.TOKENS_PER_SECOND),
                    rps,
                    Unit.TOKENS_PER_REQUEST,
                    "no requests finished in the window",
                )
            ),
            pods=pods,
            cache_config=cache_config(read),
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
                f"only {most:g} sample(s) per series in the {self._read.window} window; "
                f"{needs} (just started, or the window is shorter than two scrape intervals)"
            )
        return lambda measured: unknown(reason, measured.unit)

    def _no_lookups(self, rps: Measured) -> str:
        return no_traffic(rps, "no prompt tokens were looked up") or (
            f"{self._read.reads(QueryKey.LOOKED_UP)} did not increase although "
            f"{rps.value:.3g} requests/s finished: prefix caching is off, or lookups were "
            "skipped"
        )

    def _hit_rate(self, rps: Measured) -> Measured:
        return ratio(
            self._read.fleet(QueryKey.HITS_LOCAL, Unit.TOKENS_PER_SECOND),
            self._read.fleet(QueryKey.LOOKED_UP, Unit.TOKENS_PER_SECOND),
            Unit.RATIO,
            self._no_lookups(rps),
        )

    def _hit_rate_with_external(self, rps: Measured) -> Measured:
        local = self._read.fleet(QueryKey.HITS_LOCAL, Unit.TOKENS_PER_SECOND)
        external = self._read.fleet(QueryKey.HITS_EXTERNAL, Unit.TOKENS_PER_SECOND)
        if local.value is None or external.value is None:
            return unknown(str(local.reason or external.reason), Unit.RATIO)
        both = Measured.known(local.value + external.value, Unit.TOKENS_PER_SECOND)
        looked_up = self._read.fleet(QueryKey.LOOKED_UP, Unit.TOKENS_PER_SECOND)
        return ratio(both, looked_up, Unit.RATIO, self._no_lookups(rps))

    def _prefill_per_request(self, rps: Measured) -> Measured:
        computed = self._read.fleet(QueryKey.PREFILL_COMPUTED, Unit.TOKENS_PER_SECOND)
        if computed.value is not None and computed.value < 0:
            return unknown(
                f"{self._read.reads(QueryKey.PREFILL_COMPUTED)} is negative: vLLM up to 0.26 "
                "counts a blocked request's cache lookups again at every step",
                Unit.TOKENS_PER_REQUEST,
            )
        requests = (
            self._read.fleet(QueryKey.COMPUTED_COUNT, Unit.REQUESTS_PER_SECOND)
            if self._profile is MetricsGeneration.VLLM_0_13
            else rps
        )
        return ratio(
            computed, requests, Unit.TOKENS_PER_REQUEST, "no requests finished in the window"
        )

    def _gpu_seconds_per_1k(self, rps: Measured) -> Measured:
        """GPU-seconds every pod of the target held over the window (starting pods
        included), per 1000 requests finished in it. From kube-state-metrics when asked:
        the GPU requests of the scheduled pods, averaged over the window. Else the pods
        holding GPUs at evaluation time times GPUs per pod, over the whole window: it
        counts a pod started (or removed) inside the window for all of it (or none)."""
        unit = Unit.GPU_SECONDS_PER_1K_REQUESTS
        request = self._request
        if request.kube_state_metrics:
            gpu_seconds = self._read.fleet(QueryKey.GPU_SECONDS, unit)
        elif request.gpus_per_pod is not None and request.pods_holding_gpus is not None:
            gpu_seconds = Measured.known(
                request.gpus_per_pod * request.pods_holding_gpus * request.window_seconds, unit
            )
        else:
            return unknown(
                "needs GPUs per pod and the pods holding them (from the Deployment) or "
                "kube-state-metrics",
                unit,
            )
        if rps.value is None:
            return unknown(str(rps.reason), unit)
        finished = Measured.known(rps.value * request.window_seconds / 1000, unit)
        return ratio(
            gpu_seconds,
            finished,
            unit,
            "no requests finished in the window: cost per request is undefined",
        )
