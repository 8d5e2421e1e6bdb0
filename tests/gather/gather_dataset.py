"""Synthetic engine series with known rates, for a real Prometheus (see ``gather_tsdb``).

Each scenario lives under its own ``model_name`` in one TSDB; the evaluation time ``T`` is
the last sample. Rates are linear, so the expected signals are exact.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from tests.gather.gather_tsdb import Series, sample_times

T = (int(time.time()) // 60) * 60 - 600
"""Evaluation time: a whole minute, ten minutes ago (so 30 s subquery steps align)."""
AT = datetime.fromtimestamp(T, UTC)
START = T - 1800
WINDOW_S = 300.0
FULL = sample_times(START, T)
LAST = [float(T)]
TTFT_BUCKETS = {"0.1": 0.4, "0.5": 1.6, "1.0": 2.0, "+Inf": 2.0}
"""Per second: p50 = 0.3, p95 = 0.875, p99 = 0.975 by linear interpolation."""
ITL_BUCKETS = {"0.01": 0.0, "0.05": 50.0, "0.1": 100.0, "+Inf": 100.0}
"""Per second: p95 = 0.095."""
SGLANG_TTFT_PAST_LAST = {"100.0": 0.1, "200.0": 0.2, "400.0": 0.3, "+Inf": 3.0}
"""Per second, SGLang's top buckets: 90% of first tokens took over 400 s (its last finite
bound), so p50, p95 and p99 are all past it."""
VLLM_TTFT_WIDE = {"160.0": 0.0, "640.0": 1.0, "2560.0": 2.0, "+Inf": 2.0}
"""Per second, vLLM's top buckets: p50 = 640 in (160, 640], p95 = 2,368 in (640, 2560],
both interpolated in buckets four times as wide as their lower bound."""
COMPUTED_BUCKETS = {"20.0": 0.2, "200.0": 0.8, "2000.0": 1.8, "+Inf": 2.0}
"""Per second, as prometheus_client renders bounds: 40% of requests computed <= 200."""


def vllm_pod(
    s: Series,
    labels: dict[str, str],
    times: list[float],
    *,
    histogram: bool = True,
    itl_name: str = "vllm:inter_token_latency_seconds",
    reset_at: float | None = None,
    gauges: tuple[float, float, float] = (10, 2, 0.5),
    aborted: float = 1,
    queue_growth: float = 0,
    ttft: dict[str, float] = TTFT_BUCKETS,
) -> None:
    """A vLLM pod at 2 req/s, 1000 prompt tokens/s looked up, 80% local hits, 200 output
    tokens/s (600 context tokens per request); ``gauges``
    are running, waiting and KV usage; ``aborted`` req/s are aborted, and the waiting
    queue grows by ``queue_growth`` requests per second from its starting value."""
    s.counter("vllm:prefix_cache_queries_total", labels, 1000, times, reset_at)
    s.counter("vllm:prefix_cache_hits_total", labels, 800, times, reset_at)
    s.counter("vllm:external_prefix_cache_hits_total", labels, 100, times, reset_at)
    s.counter("vllm:prompt_tokens_total", labels, 1000, times, reset_at)
    s.counter("vllm:generation_tokens_total", labels, 200, times, reset_at)
    success = {**labels, "finished_reason": "stop"}
    s.counter("vllm:request_success_total", success, 2, times, reset_at)
    s.counter(
        "vllm:request_success_total",
        {**labels, "finished_reason": "abort"},
        aborted,
        times,
        reset_at,
    )
    s.counter("vllm:num_preemptions_total", labels, 0.5, times, reset_at)
    s.histogram("vllm:time_to_first_token_seconds", labels, ttft, 1.0, times)
    s.histogram(itl_name, labels, ITL_BUCKETS, 5.0, times)
    if histogram:
        s.histogram("vllm:request_prefill_kv_computed_tokens", labels, COMPUTED_BUCKETS, 400, times)
    running, waiting, kv_usage = gauges
    s.gauge("vllm:num_requests_running", labels, running, times)
    queue = [(t, waiting + queue_growth * (t - times[0])) for t in times]
    s.add("vllm:num_requests_waiting", labels, queue)
    s.gauge("vllm:kv_cache_usage_perc", labels, kv_usage, times)


def ksm_pod(s: Series, namespace: str, pod: str, ready_at: float, times: list[float]) -> None:
    """kube-state-metrics' view of a ready pod requesting 2 GPUs."""
    ids = {"namespace": namespace, "pod": pod}
    s.gauge("kube_pod_status_ready_time", {**ids, "uid": pod}, ready_at, times)
    s.gauge("kube_pod_status_ready", {**ids, "condition": "true"}, 1, times)
    ksm_scheduled(s, namespace, pod, times)


def ksm_scheduled(
    s: Series, namespace: str, pod: str, times: list[float], scheduled: bool = True
) -> None:
    """kube-state-metrics' view of a pod requesting 2 GPUs, scheduled to a node or pending
    (a pod starting, or loading weights, exports no engine series yet)."""
    ids = {"namespace": namespace, "pod": pod}
    gpu = {**ids, "container": "vllm", "resource": "nvidia_com_gpu", "unit": "integer"}
    s.gauge("kube_pod_container_resource_requests", gpu, 2, times)
    s.gauge("kube_pod_status_scheduled", {**ids, "condition": "true"}, float(scheduled), times)


def ksm_owned(s: Series, namespace: str, pod: str, owner: str, times: list[float]) -> None:
    """kube-state-metrics' owner series of ``pod``: ReplicaSet ``owner``."""
    labels = {"namespace": namespace, "pod": pod, "uid": pod, "owner_name": owner}
    s.gauge("kube_pod_owner", {**labels, "owner_kind": "ReplicaSet"}, 1, times)


def ksm_replicaset(
    s: Series, namespace: str, replicaset: str, deployment: str, times: list[float]
) -> None:
    """kube-state-metrics' owner series of ``replicaset``: Deployment ``deployment``."""
    labels = {"namespace": namespace, "replicaset": replicaset, "owner_name": deployment}
    s.gauge("kube_replicaset_owner", {**labels, "owner_kind": "Deployment"}, 1, times)


def scaling_out(s: Series) -> None:
    """A Deployment mid-rollout, as cost must count it: ``scaling-a`` (ReplicaSet
    ``scaling-1``) serves all along; ``scaling-b``, of the new ReplicaSet ``scaling-2``,
    was scheduled 10 minutes ago and still loads weights (no engine series yet); ``scaling-c``
    is pending (not scheduled: it holds no GPU); ``other-a``, of another Deployment in the
    namespace, is not the target's. Every pod requests 2 GPUs."""
    ns = "llm"
    vllm_pod(s, {"namespace": ns, "model_name": "scaling", "pod": "scaling-a"}, FULL)
    ksm_pod(s, ns, "scaling-a", T - 3600, FULL)
    ksm_owned(s, ns, "scaling-a", "scaling-1", FULL)
    ksm_replicaset(s, ns, "scaling-1", "scaling", FULL)
    loading = [t for t in FULL if t >= T - 600]
    ksm_replicaset(s, ns, "scaling-2", "scaling", loading)
    ksm_scheduled(s, ns, "scaling-b", loading)
    ksm_owned(s, ns, "scaling-b", "scaling-2", loading)
    ksm_scheduled(s, ns, "scaling-c", loading, scheduled=False)
    ksm_owned(s, ns, "scaling-c", "scaling-2", loading)
    ksm_pod(s, ns, "other-a", T - 3600, FULL)
    ksm_owned(s, ns, "other-a", "other-1", FULL)
    ksm_replicaset(s, ns, "other-1", "other", FULL)


def sglang_pod(
    s: Series, labels: dict[str, str], times: list[float], ttft: dict[str, float] = TTFT_BUCKETS
) -> None:
    """An SGLang pod: 1000 tokens/s, 60% local (device+host) and 10% storage hits, 300
    output tokens/s."""
    modes = {"input": 300, "device_hit": 500, "host_hit": 100, "storage_hit": 100}
    for mode, rate in modes.items():
        s.counter("sglang:prefill_effective_tokens_total", {**labels, "mode": mode}, rate, times)
    s.counter("sglang:num_requests_total", labels, 3, times)
    s.counter("sglang:prompt_tokens_total", labels, 1000, times)
    s.counter("sglang:generation_tokens_total", labels, 300, times)
    s.counter("sglang:num_retracted_requests_total", labels, 0.1, times)
    s.gauge("sglang:cache_hit_rate", labels, 0.99, times)
    s.histogram("sglang:time_to_first_token_seconds", labels, ttft, 1.0, times)
    s.histogram("sglang:inter_token_latency_seconds", labels, ITL_BUCKETS, 5.0, times)
    s.gauge("sglang:token_usage", labels, 0.4, times)
    s.gauge("sglang:num_queue_reqs", labels, 1, times)
    s.gauge("sglang:num_running_reqs", labels, 5, times)


def dataset() -> Series:
    """Every scenario the gather tests read."""
    s = Series()
    llm = {"namespace": "llm"}
    vllm_pod(s, {**llm, "model_name": "steady", "pod": "steady-a"}, FULL)
    ksm_pod(s, "llm", "steady-a", T - 3600, FULL)
    young = {**llm, "model_name": "steady", "pod": "steady-b"}
    vllm_pod(s, young, LAST, gauges=(4, 0, 0.1))  # one sample so far: no rate yet
    ksm_pod(s, "llm", "steady-b", T - 10, LAST)
    vllm_pod(s, {**llm, "model_name": "reset", "pod": "reset-a"}, FULL, reset_at=T - 150)
    legacy = {**llm, "model_name": "legacy", "pod": "legacy-a"}
    vllm_pod(s, legacy, FULL, histogram=False, itl_name="vllm:time_per_output_token_seconds")
    nan = {**llm, "model_name": "nan", "pod": "nan-a"}
    s.counter("vllm:prefix_cache_queries_total", nan, 1000, FULL)
    s.counter("vllm:prefix_cache_hits_total", nan, 500, FULL)
    s.gauge("vllm:num_requests_running", nan, 1, FULL)
    s.gauge("vllm:kv_cache_usage_perc", nan, float("nan"), FULL)
    idle = {**llm, "model_name": "idle", "pod": "idle-a"}
    for name in ("queries", "hits"):
        s.counter(f"vllm:prefix_cache_{name}_total", idle, 0, FULL)
    s.counter("vllm:request_success_total", {**idle, "finished_reason": "stop"}, 0, FULL)
    s.counter("vllm:num_preemptions_total", idle, 0, FULL)
    s.histogram("vllm:time_to_first_token_seconds", idle, dict.fromkeys(TTFT_BUCKETS, 0), 0, FULL)
    s.gauge("vllm:num_requests_running", idle, 0, FULL)
    off = {**llm, "model_name": "nolookups", "pod": "off-a"}
    for name in ("queries", "hits"):
        s.counter(f"vllm:prefix_cache_{name}_total", off, 0, FULL)
    s.counter("vllm:request_success_total", {**off, "finished_reason": "stop"}, 2, FULL)
    s.gauge("vllm:num_requests_running", off, 3, FULL)
    for model in ("x", "y"):
        vllm_pod(s, {"namespace": "twins", "model_name": model, "pod": f"{model}-a"}, FULL)
    vllm_pod(s, {**llm, "model_name": "nopod"}, FULL)
    sglang_pod(s, {**llm, "model_name": "sg", "pod": "sg-a", "tp_rank": "0"}, FULL)
    slow = {**llm, "model_name": "sgslow", "pod": "sgslow-a"}
    sglang_pod(s, slow, FULL, ttft=SGLANG_TTFT_PAST_LAST)
    vllm_pod(s, {**llm, "model_name": "wide", "pod": "wide-a"}, FULL, ttft=VLLM_TTFT_WIDE)
    saturated = {**llm, "model_name": "saturated", "pod": "sat-a"}
    vllm_pod(s, saturated, FULL, gauges=(32, 0, 1.0), aborted=0.5, queue_growth=0.1)
    scaling_out(s)
    grouping_scenarios(s)
    quantile_scenarios(s)
    return s


SPECIAL_MODELS = ("dot.model", "dotXmodel", "a+b", "m(1)|x", "br[ack]et", "star*", "q?{2}")
"""Model names full of RE2 metacharacters (``dotXmodel`` is what an unescaped ``.``
would also match), for the grouped-gathering differential test."""


def grouping_scenarios(s: Series) -> None:
    """Deployments that shared (grouped) queries must tell apart: values with regex
    metacharacters, the same model and deployment names in two namespaces (so a shared
    query's per-label regexes also select deployments no policy asked for), a third
    label (``deployment``), legacy vLLM and SGLang next to vLLM 0.13, and a namespace of
    one deployment."""
    for number, model in enumerate(SPECIAL_MODELS):
        labels = {"namespace": "sp", "model_name": model, "deployment": f"d{number}"}
        pod = {**labels, "pod": f"sp-{number}-a"}
        if model == "star*":
            vllm_pod(s, pod, FULL, histogram=False, itl_name="vllm:time_per_output_token_seconds")
        else:
            vllm_pod(s, pod, FULL, gauges=(number + 1.0, number / 2, 0.1 * number))
        if model == "a+b":  # a second pod, young: per-pod signals differ
            vllm_pod(s, {**labels, "pod": f"sp-{number}-b"}, LAST, gauges=(2, 1, 0.2))
    sglang_pod(
        s, {"namespace": "sp", "model_name": "^caret$", "deployment": "d9", "pod": "c-a"}, FULL
    )
    for number, model in ((0, "dot.model"), (2, "a+b")):  # same names, another namespace
        labels = {"namespace": "sp.alt", "model_name": model, "deployment": f"d{number}"}
        vllm_pod(s, {**labels, "pod": f"alt-{number}-a"}, FULL, aborted=3, gauges=(6, 6, 0.6))
    vllm_pod(s, {"namespace": "solo", "model_name": "only", "pod": "solo-a"}, FULL)


QUANTILE_NAMESPACE = "quantiles"


@dataclass(frozen=True)
class QuantileShape:
    """One deployment's latency histograms (TTFT and ITL alike), for comparing the
    operator's quantiles with Prometheus's ``histogram_quantile``."""

    pods: tuple[Mapping[str, float], ...]
    """Per pod: ``le`` → observations per second (cumulative, as exported)."""
    reset_le: str | None = None
    """A bucket whose counter alone restarts from 0 mid-window (a restart caught half-way
    by a scrape): ``rate`` loses one interval of it, and the bucket rates stop being
    monotonic."""


QUANTILE_SHAPES = {
    "first": QuantileShape(({"0.1": 2.0, "0.5": 2.0, "1.0": 2.0, "+Inf": 2.0},)),
    "past": QuantileShape(({"0.1": 0.0, "0.5": 0.0, "1.0": 0.0, "+Inf": 2.0},)),
    "empty": QuantileShape(({"0.1": 0.0, "0.5": 0.0, "+Inf": 0.0},)),
    # Rates in powers of two stay in exact ratios: p50's rank is le=0.5's count exactly.
    "boundary": QuantileShape(({"0.1": 1.0, "0.5": 2.0, "1.0": 4.0, "+Inf": 4.0},)),
    "single": QuantileShape(({"0.5": 1.5, "+Inf": 2.0},)),
    "spread": QuantileShape(
        (
            {
                "0.005": 0.01,
                "0.02": 0.3,
                "0.08": 0.9,
                "0.32": 1.5,
                "1.28": 1.9,
                "5.12": 1.97,
                "+Inf": 2.0,
            },
        )
    ),
    "reset": QuantileShape(({"0.1": 1.6, "0.5": 1.6, "1.0": 2.0, "+Inf": 2.0},), "0.5"),
    "inconsistent": QuantileShape(({"0.1": 1.0, "0.5": 0.8, "1.0": 2.0, "+Inf": 2.0},)),
    "spellings": QuantileShape(  # two pods' clients render le=1 differently
        ({"0.5": 1.0, "1": 2.0, "+Inf": 2.0}, {"0.5": 0.5, "1.0": 1.5, "+Inf": 2.0})
    ),
    "no-inf": QuantileShape(({"0.1": 1.0, "0.5": 2.0},)),
    "only-inf": QuantileShape(({"+Inf": 2.0},)),
}
"""Bucket-rate shapes at the edges of ``histogram_quantile``, one deployment each."""


def quantile_scenarios(s: Series) -> None:
    """A vLLM (0.9.2-0.12) deployment per ``QUANTILE_SHAPES`` entry: enough series to be
    detected and rated (2 req/s), and its TTFT and ITL buckets in that shape."""
    for model, shape in QUANTILE_SHAPES.items():
        for number, rates in enumerate(shape.pods):
            labels = {
                "namespace": QUANTILE_NAMESPACE,
                "model_name": model,
                "pod": f"{model}-{number}",
            }
            s.counter("vllm:prefix_cache_queries_total", labels, 1000, FULL)
            s.counter("vllm:request_success_total", {**labels, "finished_reason": "stop"}, 2, FULL)
            s.gauge("vllm:num_requests_running", labels, 1, FULL)
            for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
                for le, rate in rates.items():
                    reset_at = T - 150 if le == shape.reset_le else None
                    s.counter(f"{name}_bucket", {**labels, "le": le}, rate, FULL, reset_at)
