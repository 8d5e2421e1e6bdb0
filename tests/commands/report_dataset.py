"""The incident as Prometheus history: four days of a vLLM fleet around a prompt change.

Shaped like the incident's own table: at a flat ~32 req/s on 2-GPU replicas, the token hit
rate is 0.85 for two days; at ``AROUND`` a change in the prompt builder drops it to 0.04,
every request computes six times as many prefill tokens, and 20 minutes later the HPA adds
8 replicas to the 10 (GPU-s/1k ~630 → ~1,140). TTFT p95 rises from ~0.47 s to ~0.89 s,
still under a 1 s SLO. Samples are 10 minutes apart (enough for 12 h windows, and small
enough for ``promtool`` to backfill in seconds); rates are piecewise constant, so each
window's signals are known in advance.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from tests.gather.gather_tsdb import Series

SAMPLE_S = 600
HOUR = 3600
AROUND = (int(time.time()) // HOUR) * HOUR - 49 * HOUR
"""The change: a whole hour, so the last 12 h window (ending 48 h later) is in the past."""
START = AROUND - 48 * HOUR
END = AROUND + 48 * HOUR
SCALE_UP = AROUND + 1200
"""When the 8 new pods start (their first sample)."""
RPS_BEFORE, RPS_AFTER = 31.7, 31.6
PROMPT_TOKENS = 6000
HIT_BEFORE, HIT_AFTER = 0.85, 0.04
FULL_HITS_BEFORE = 0.6
"""Share of requests computing at most 200 prompt tokens, before (none after)."""
TTFT_BEFORE = {"0.25": 0.70, "0.5": 0.98, "1.0": 1.0, "2.5": 1.0, "+Inf": 1.0}
"""Cumulative shares of requests per TTFT bucket: p95 = 0.25 + 0.25 * 0.25 / 0.28."""
TTFT_AFTER = {"0.25": 0.30, "0.5": 0.80, "1.0": 0.99, "2.5": 1.0, "+Inf": 1.0}
"""p95 = 0.5 + 0.5 * 0.15 / 0.19."""
TTFT_P95_BEFORE = 0.25 + 0.25 * 0.25 / 0.28
TTFT_P95_AFTER = 0.5 + 0.5 * 0.15 / 0.19
LABELS = {"namespace": "rag", "model_name": "llama-3-8b"}
SELECTOR = 'namespace="rag",model_name="llama-3-8b"'

Rate = Callable[[float], float]
"""Per-second rate of one pod's counter at a time."""


def _live_pods(t: float) -> int:
    return 18 if t >= SCALE_UP else 10


def _per_pod_rps(t: float) -> float:
    return (RPS_AFTER if t >= AROUND else RPS_BEFORE) / _live_pods(t)


def _after(t: float) -> bool:
    return t >= AROUND


def _counter(s: Series, name: str, labels: dict[str, str], rate: Rate, times: list[int]) -> None:
    """A counter from 0 at the pod's first sample, rising at ``rate`` over each interval
    (the rate in force at the interval's start)."""
    value, points = 0.0, [(float(times[0]), 0.0)]
    for previous, t in itertools.pairwise(times):
        value += rate(previous) * (t - previous)
        points.append((float(t), value))
    s.add(name, labels, points)


def _gauge(s: Series, name: str, labels: dict[str, str], value: Rate, times: list[int]) -> None:
    s.add(name, labels, [(float(t), value(t)) for t in times])


def _pod(s: Series, pod: str, times: list[int]) -> None:
    labels = {**LABELS, "pod": pod}

    def requests(t: float) -> float:
        return _per_pod_rps(t)

    def looked_up(t: float) -> float:
        return requests(t) * PROMPT_TOKENS

    def hit(t: float) -> float:
        return HIT_AFTER if _after(t) else HIT_BEFORE

    _counter(s, "vllm:prefix_cache_queries_total", labels, looked_up, times)
    _counter(s, "vllm:prefix_cache_hits_total", labels, lambda t: looked_up(t) * hit(t), times)
    _counter(s, "vllm:prompt_tokens_total", labels, looked_up, times)
    _counter(s, "vllm:generation_tokens_total", labels, lambda t: requests(t) * 200, times)
    success = {**labels, "finished_reason": "stop"}
    _counter(s, "vllm:request_success_total", success, requests, times)
    preempt = {**labels}
    _counter(s, "vllm:num_preemptions_total", preempt, lambda t: 0.02 if _after(t) else 0, times)
    for le in TTFT_BEFORE:

        def bucket(t: float, le: str = le) -> float:
            return requests(t) * (TTFT_AFTER if _after(t) else TTFT_BEFORE)[le]

        ttft = {**labels, "le": le}
        _counter(s, "vllm:time_to_first_token_seconds_bucket", ttft, bucket, times)
    _counter(s, "vllm:time_to_first_token_seconds_count", labels, requests, times)
    _counter(s, "vllm:time_to_first_token_seconds_sum", labels, lambda t: requests(t) * 0.3, times)
    computed = "vllm:request_prefill_kv_computed_tokens"
    for le, before, after in (("200.0", FULL_HITS_BEFORE, 0.0), ("+Inf", 1.0, 1.0)):

        def share(t: float, before: float = before, after: float = after) -> float:
            return requests(t) * (after if _after(t) else before)

        _counter(s, f"{computed}_bucket", {**labels, "le": le}, share, times)
    _counter(s, f"{computed}_count", labels, requests, times)

    def computed_tokens(t: float) -> float:
        return looked_up(t) * (1 - hit(t))

    _counter(s, f"{computed}_sum", labels, computed_tokens, times)
    _gauge(s, "vllm:num_requests_running", labels, lambda t: 30 if _after(t) else 20, times)
    _gauge(s, "vllm:num_requests_waiting", labels, lambda t: 0, times)
    _gauge(s, "vllm:kv_cache_usage_perc", labels, lambda t: 0.95 if _after(t) else 0.6, times)


KSM_SAMPLE_S = 120
"""kube-state-metrics' sample spacing: within the 5 min lookback of each 30 s subquery step."""


def _ksm(s: Series, pod: str, times: list[int]) -> None:
    """kube-state-metrics' view of a scheduled pod of ReplicaSet ``vllm-7c9d`` requesting 2
    GPUs (from the moment it is scheduled, before it exports anything)."""
    ids = {"namespace": LABELS["namespace"], "pod": pod}
    gpu = {**ids, "container": "vllm", "resource": "nvidia_com_gpu", "unit": "integer"}
    _gauge(s, "kube_pod_container_resource_requests", gpu, lambda t: 2, times)
    _gauge(s, "kube_pod_status_scheduled", {**ids, "condition": "true"}, lambda t: 1, times)
    owner = {**ids, "owner_kind": "ReplicaSet", "owner_name": "vllm-7c9d"}
    _gauge(s, "kube_pod_owner", owner, lambda t: 1, times)


def incident() -> Series:
    """Ten pods for four days, eight more scheduled at the change and exporting from 20
    minutes after it (loading weights until then), with kube-state-metrics' view."""
    s = Series()
    every = list(range(START, END + 1, SAMPLE_S))
    held = list(range(START, END + 1, KSM_SAMPLE_S))
    for index in range(18):
        times = every if index < 10 else [t for t in every if t >= SCALE_UP]
        _pod(s, f"vllm-{index}", times)
        _ksm(s, f"vllm-{index}", held if index < 10 else [t for t in held if t >= AROUND])
    deployment = {"owner_kind": "Deployment", "owner_name": "vllm"}
    replicaset = {"namespace": LABELS["namespace"], "replicaset": "vllm-7c9d", **deployment}
    _gauge(s, "kube_replicaset_owner", replicaset, lambda t: 1, held)
    return s
