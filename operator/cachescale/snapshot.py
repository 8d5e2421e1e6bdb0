"""What the gather layer hands the decision layer: one frozen snapshot of engine signals.

``decide(spec, snapshot, memory, now)`` must be able to tell "measured 0" from "could not
measure", because freezing on missing data is the operator's safety rule.
So every signal here is a ``Measured``: a finite number with its unit, or *unknown* with
the reason why — never 0, never NaN. The snapshot also says which engine profile (vLLM
generation or SGLang) produced the numbers, because the formulas differ between them.

Pure values: no I/O, no clock, no Prometheus or Kubernetes types. The gather layer
(``cachescale.gather``) builds these from PromQL results; tests and the simulator can
build them by hand.

Beside the signals, a ``Snapshot`` carries the serving workload as the Kubernetes API shows
it (``WorkloadState``, ``HPAState``) and what a human asked for through annotations
(``HumanRequests``): together, everything one evaluation knows about the world.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum

DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS = 200.0
"""A request that computed at most this many prompt tokens counts as a full hit: a bucket
bound of vLLM's computed-tokens histogram, and the simulator's definition."""


class Unit(StrEnum):
    """The unit a signal is measured in (the value is printed next to it)."""

    RATIO = "ratio"
    TOKENS_PER_REQUEST = "tokens/request"
    TOKENS_PER_SECOND = "tokens/s"
    SECONDS = "s"
    REQUESTS = "requests"
    REQUESTS_PER_SECOND = "req/s"
    PREEMPTIONS_PER_SECOND = "preemptions/s"
    GPU_SECONDS_PER_1K_REQUESTS = "GPU-s/1k req"
    PODS = "pods"
    """A mean number of pods over a window (``cachescale report``'s replicas)."""


@dataclass(frozen=True, slots=True)
class Measured:
    """A signal's value with its unit, or unknown with the reason (exactly one of the two).

    Build with ``Measured.known(...)`` or ``Measured.unknown(...)``; ``value is None``
    means unknown, and then ``reason`` says why. A quantile read from a histogram
    (``Measured.quantile(...)``) may also say how far its value can be trusted.
    """

    unit: Unit
    value: float | None = None
    reason: str | None = None
    lower_bound: bool = False
    """The true value is above ``value``, not at it: a quantile past the histogram's last
    finite bucket, where ``histogram_quantile`` returns that bucket's bound (400 s for
    SGLang's TTFT, 2,560 s for vLLM's)."""
    bucket: tuple[float, float] | None = None
    """``(lower, upper]``: the histogram bucket a quantile was interpolated in, given when
    it is wider than twice its lower bound (the interpolated value may be far off)."""

    def __post_init__(self) -> None:
        if (self.value is None) == (self.reason is None):
            raise ValueError("a Measured is either a value or an unknown with a reason")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"{self.value} is not a measurement; use Measured.unknown")
        if self.value is None and (self.lower_bound or self.bucket is not None):
            raise ValueError("only a known value can be a lower bound or lie in a bucket")

    @classmethod
    def known(cls, value: float, unit: Unit) -> Measured:
        """A measured, finite value."""
        return cls(unit=unit, value=float(value))

    @classmethod
    def quantile(
        cls,
        value: float,
        unit: Unit,
        *,
        lower_bound: bool = False,
        bucket: tuple[float, float] | None = None,
    ) -> Measured:
        """A quantile read from a histogram: a value, or (``lower_bound``) the bound it is
        known to exceed; ``bucket`` when the bucket it lies in is wide."""
        return cls(unit=unit, value=float(value), lower_bound=lower_bound, bucket=bucket)

    @classmethod
    def unknown(cls, reason: str, unit: Unit) -> Measured:
        """A signal that could not be measured, and why."""
        return cls(unit=unit, reason=reason)

    @property
    def is_known(self) -> bool:
        """Whether a value was measured."""
        return self.value is not None


class MetricsGeneration(StrEnum):
    """Which metric generation the numbers came from (formulas differ between them)."""

    VLLM_0_13 = "vllm>=0.13"
    """Has ``vllm:request_prefill_kv_computed_tokens``: request-weighted signals are exact."""
    VLLM_0_9_2 = "vllm 0.9.2-0.12"
    """``vllm:prefix_cache_*`` counters only: prefill per request is approximated."""
    SGLANG_0_5_20 = "sglang>=0.5.20"
    """``sglang:prefill_effective_tokens_total{mode}`` gives a windowed hit rate."""


class FetchFailure(StrEnum):
    """Why no signal could be read at all (CamelCase, usable as a condition reason)."""

    UNREACHABLE = "PrometheusUnreachable"
    TIMEOUT = "PrometheusTimeout"
    BAD_RESPONSE = "PrometheusBadResponse"
    QUERY_ERROR = "PrometheusQueryError"
    CREDENTIALS_UNREADABLE = "PrometheusCredentialsUnreadable"
    """A Secret named in ``spec.metrics.auth`` could not be read or has no usable value."""
    TOO_LARGE = "PrometheusResponseTooLarge"
    """An answer over the operator's byte cap (``--prometheus-max-response-bytes``)."""


@dataclass(frozen=True, slots=True)
class PodSignals:
    """One pod's signals over the window; its age lets the decision skip warming pods."""

    pod: str
    age_seconds: Measured
    """Time since the pod became ready (or started), at the evaluation time."""
    token_hit_rate: Measured
    """Local prefix-cache hits / prompt tokens looked up on this pod."""
    prompt_tokens_looked_up_per_second: Measured
    """The hit rate's denominator: weights this pod when pods are pooled."""
    waiting_requests: Measured
    """Mean waiting (queued) requests over the window."""
    running_requests: Measured
    """Mean running (batched) requests over the window."""
    kv_cache_usage_ratio: Measured
    """Mean KV-cache usage, 0 to 1 (cached but idle blocks count as free)."""


@dataclass(frozen=True, slots=True)
class EngineCacheConfig:
    """One engine's prefix-cache settings as it exports them (vLLM's
    ``vllm:cache_config_info`` labels); a label it does not export is None, never a default."""

    pod: str
    """The pod the engine runs in ("" when the series carry no ``pod`` label)."""
    hash_algo: str | None
    """``prefix_caching_hash_algo``: how block hashes are computed (``sha256``, ``xxhash``...)."""
    prefix_caching: bool | None
    """``enable_prefix_caching``."""
    block_size: int | None
    """``block_size``: tokens per KV block."""


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The fleet's prefix-cache configuration: each engine's, or unknown with the reason
    (exactly one of the two). It says whether prompts of different tenants can share or
    collide in the cache (``decide.isolation``); it is read each evaluation because a
    rollout can change it."""

    engines: tuple[EngineCacheConfig, ...] = ()
    reason: str | None = None
    """Why it is unknown (no series, SGLang, Prometheus failed); None when known."""

    def __post_init__(self) -> None:
        if bool(self.engines) == (self.reason is not None):
            raise ValueError("a CacheConfig is either engines or an unknown with a reason")

    @classmethod
    def unknown(cls, reason: str) -> CacheConfig:
        """A configuration that could not be read, and why."""
        return cls(reason=reason)

    @property
    def is_known(self) -> bool:
        """Whether at least one engine reported its configuration."""
        return self.reason is None


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """Every engine signal of one policy over one window, each known or unknown.

    ``token_hit_rate_*`` are token-weighted (what the engines' counters measure);
    ``request_full_hit_share`` and ``prefill_tokens_per_request`` are the
    request-weighted view that predicts p99. Fleet-level values cover every
    pod, warm or cold; ``pods`` carries per-pod values with ages, and
    ``warm_token_hit_rate`` pools the warm ones.
    """

    profile: MetricsGeneration | None
    """The metric generation used; None when no engine series were found."""
    observed_at: datetime
    """The evaluation time the queries were answered at."""
    window_seconds: float
    """The window every rate and quantile covers."""
    token_hit_rate_local: Measured
    token_hit_rate_with_external: Measured
    """Local plus KV-connector (vLLM) or storage-tier (SGLang) hits, over the same tokens."""
    request_full_hit_share: Measured
    """Share of requests that computed at most ``full_hit_max_computed_tokens`` tokens."""
    full_hit_max_computed_tokens: float | None
    """The histogram bucket bound (in tokens) the full-hit share was read at."""
    prefill_tokens_per_request: Measured
    ttft_p50_seconds: Measured
    ttft_p95_seconds: Measured
    ttft_p99_seconds: Measured
    itl_p95_seconds: Measured
    requests_per_second: Measured
    """Successfully finished requests per second (aborts and errors excluded): the load the
    fleet *served*."""
    arrivals_per_second: Measured = field(
        default=Measured.unknown("no arrival estimate was made", Unit.REQUESTS_PER_SECOND),
        kw_only=True,
    )
    """Requests arriving per second: the load *offered*. Estimated as every finished
    request (aborts and errors included) plus the growth of the requests in the system
    (waiting + running) over the window, or read from the policy's ``demandQuery``.
    Under saturation or client timeouts it exceeds ``requests_per_second``. Keyword-only
    with an unknown default so snapshots built without an estimate stay honest."""
    preemptions_per_second: Measured
    waiting_requests_per_pod: Measured
    running_requests_per_pod: Measured
    kv_cache_usage_ratio: Measured
    gpu_seconds_per_1k_requests: Measured
    context_tokens_per_request: Measured
    """Mean prompt plus generated tokens per finished request: the ``L_avg`` of the
    cache-friendly batch ceiling."""
    pods: tuple[PodSignals, ...] = ()
    cache_config: CacheConfig = field(
        default=CacheConfig.unknown("the cache configuration was not read"), kw_only=True
    )
    """Each engine's prefix-cache settings (hash algorithm, prefix caching on or off, block
    size); unknown for SGLang, which exports no equivalent. Keyword-only with an unknown
    default, like ``arrivals_per_second``."""
    failure: FetchFailure | None = None
    """Set when Prometheus could not be read at all; every signal is then unknown."""
    notes: tuple[str, ...] = ()
    """Facts about how the numbers were obtained (e.g. a mixed-version fleet)."""

    def signals(self) -> dict[str, Measured]:
        """The fleet-level signals by field name, in declaration order."""
        return {
            f.name: value
            for f in fields(self)
            if isinstance(value := getattr(self, f.name), Measured)
        }

    def unknown_signals(self) -> list[tuple[str, str]]:
        """``(signal name, reason)`` for every fleet-level signal that is unknown."""
        return [(name, m.reason) for name, m in self.signals().items() if m.reason is not None]

    def warm_token_hit_rate(self, min_age_seconds: float) -> Measured:
        """Token-weighted local hit rate pooled over pods at least ``min_age_seconds`` old.

        A pod whose age or rates are unknown is left out (it cannot be shown to be warm);
        unknown when no warm pod looked any token up.
        """
        hits = looked_up = 0.0
        warm = 0
        for pod in self.pods:
            age, rate = pod.age_seconds.value, pod.token_hit_rate.value
            volume = pod.prompt_tokens_looked_up_per_second.value
            if age is None or age < min_age_seconds:
                continue
            warm += 1
            if rate is not None and volume is not None:
                hits += rate * volume
                looked_up += volume
        if looked_up > 0:
            return Measured.known(hits / looked_up, Unit.RATIO)
        reason = (
            f"no pod is known to be older than {min_age_seconds:g}s"
            if warm == 0
            else f"{warm} warm pod(s) but none looked up a prompt token in the window"
        )
        return Measured.unknown(reason, Unit.RATIO)

    @classmethod
    def all_unknown(
        cls,
        reason: str,
        *,
        observed_at: datetime,
        window_seconds: float,
        profile: MetricsGeneration | None = None,
        failure: FetchFailure | None = None,
        notes: tuple[str, ...] = (),
    ) -> EngineSignals:
        """A snapshot where nothing could be measured, every signal carrying ``reason``."""

        def unknown(name: str) -> Measured:
            return Measured.unknown(reason, SIGNAL_UNITS[name])

        return cls(
            profile=profile,
            observed_at=observed_at,
            window_seconds=window_seconds,
            token_hit_rate_local=unknown("token_hit_rate_local"),
            token_hit_rate_with_external=unknown("token_hit_rate_with_external"),
            request_full_hit_share=unknown("request_full_hit_share"),
            full_hit_max_computed_tokens=None,
            prefill_tokens_per_request=unknown("prefill_tokens_per_request"),
            ttft_p50_seconds=unknown("ttft_p50_seconds"),
            ttft_p95_seconds=unknown("ttft_p95_seconds"),
            ttft_p99_seconds=unknown("ttft_p99_seconds"),
            itl_p95_seconds=unknown("itl_p95_seconds"),
            requests_per_second=unknown("requests_per_second"),
            arrivals_per_second=unknown("arrivals_per_second"),
            preemptions_per_second=unknown("preemptions_per_second"),
            waiting_requests_per_pod=unknown("waiting_requests_per_pod"),
            running_requests_per_pod=unknown("running_requests_per_pod"),
            kv_cache_usage_ratio=unknown("kv_cache_usage_ratio"),
            gpu_seconds_per_1k_requests=unknown("gpu_seconds_per_1k_requests"),
            context_tokens_per_request=unknown("context_tokens_per_request"),
            cache_config=CacheConfig.unknown(reason),
            failure=failure,
            notes=notes,
        )


SIGNAL_UNITS: dict[str, Unit] = {
    "token_hit_rate_local": Unit.RATIO,
    "token_hit_rate_with_external": Unit.RATIO,
    "request_full_hit_share": Unit.RATIO,
    "prefill_tokens_per_request": Unit.TOKENS_PER_REQUEST,
    "ttft_p50_seconds": Unit.SECONDS,
    "ttft_p95_seconds": Unit.SECONDS,
    "ttft_p99_seconds": Unit.SECONDS,
    "itl_p95_seconds": Unit.SECONDS,
    "requests_per_second": Unit.REQUESTS_PER_SECOND,
    "arrivals_per_second": Unit.REQUESTS_PER_SECOND,
    "preemptions_per_second": Unit.PREEMPTIONS_PER_SECOND,
    "waiting_requests_per_pod": Unit.REQUESTS,
    "running_requests_per_pod": Unit.REQUESTS,
    "kv_cache_usage_ratio": Unit.RATIO,
    "gpu_seconds_per_1k_requests": Unit.GPU_SECONDS_PER_1K_REQUESTS,
    "context_tokens_per_request": Unit.TOKENS_PER_REQUEST,
}
"""The unit of every fleet-level signal of ``EngineSignals``."""


@dataclass(frozen=True, slots=True)
class HPAState:
    """The HorizontalPodAutoscaler as it is now (``spec`` and ``status``)."""

    min_replicas: int
    max_replicas: int
    target_average_value: float | None
    """Target of its per-pod queue metric; None when it has no such metric."""
    metric_name: str | None = None
    """That metric, e.g. ``vllm:num_requests_waiting``."""


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """The serving Deployment and its HPA, as read at the evaluation."""

    replicas: int
    """``spec.replicas`` (what the HPA last set)."""
    ready_replicas: int
    pod_ages_seconds: tuple[float, ...]
    """Seconds since each ready pod became ready."""
    gpus_per_pod: float
    """GPUs one pod requests (``nvidia.com/gpu`` in the engine container's requests)."""
    hpa: HPAState
    max_num_seqs: int | None = None
    """The engine's current batch ceiling from its args; None when the flag is absent."""
    generation: int = 0
    rollout_in_progress: bool = False
    """Pods of an older revision still exist (a rollout, or a restart we caused)."""

    def warm_replicas(self, warmup_seconds: float) -> int:
        """Ready pods at least ``warmup_seconds`` old (their caches had time to fill)."""
        return sum(1 for age in self.pod_ages_seconds if age >= warmup_seconds)

    def serving_pods(self, window_seconds: float) -> float:
        """The pods that served over the last ``window_seconds``, on average: each ready
        pod for the share of the window it has been ready (what a windowed rate of served
        requests was served by)."""
        return sum(min(age, window_seconds) for age in self.pod_ages_seconds) / window_seconds


@dataclass(frozen=True, slots=True)
class HumanRequests:
    """What a human asked for through annotations on the policy (times they were set)."""

    acknowledge_at: datetime | None = None
    """Acknowledge the active collapse alert: stop holding, keep the alert visible."""
    rebaseline_at: datetime | None = None
    """Accept the current hit rate and costs as the new baseline."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one evaluation knows about the world: what ``decide`` reads besides the
    policy and its memory. Anything the reader could not establish is ``None`` (or an
    unknown ``Measured`` inside the signals), never a made-up 0."""

    signals: EngineSignals
    workload: WorkloadState
    human: HumanRequests = HumanRequests()
