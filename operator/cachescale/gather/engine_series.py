"""Which series each engine exports for each signal, by engine and version.

One table per engine (``VLLM``, ``SGLANG``): the counters, histograms and gauges every
signal is computed from, with the matchers that pick the right part of a shared counter
(SGLang's prefill tokens by ``mode``, vLLM's finished requests without aborts). The
queries (``gather.promql``) and the generation detection (``gather.detection``) both read
these names, so a renamed metric is changed in one place. The prefix-cache counters the
audit and the simulator read too are ``api/engine_metrics.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachescale.api.engine_metrics import (
    SGLANG_PREFILL_EFFECTIVE_TOKENS,
    VLLM_EXTERNAL_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
)


@dataclass(frozen=True)
class EngineCounter:
    """A counter and the matchers that select the part of it a signal counts."""

    metric: str
    matchers: str = ""


@dataclass(frozen=True)
class Family:
    """An engine's series for each signal."""

    hits_local: EngineCounter
    hits_external: EngineCounter
    looked_up: EngineCounter
    requests: EngineCounter
    finished: EngineCounter
    """Every finished request, whatever the finish reason (aborts included)."""
    preemptions: EngineCounter
    ttft: str
    itl: tuple[str, ...]
    """Histogram names, first present wins (vLLM renamed its ITL histogram)."""
    kv_usage: str
    waiting: str
    running: str
    prompt_tokens: EngineCounter
    generation_tokens: EngineCounter


VLLM = Family(
    hits_local=EngineCounter(VLLM_PREFIX_CACHE_HITS),
    hits_external=EngineCounter(VLLM_EXTERNAL_PREFIX_CACHE_HITS),
    looked_up=EngineCounter(VLLM_PREFIX_CACHE_QUERIES),
    requests=EngineCounter("vllm:request_success_total", 'finished_reason!~"abort|error"'),
    finished=EngineCounter("vllm:request_success_total"),
    preemptions=EngineCounter("vllm:num_preemptions_total"),
    ttft="vllm:time_to_first_token_seconds",
    itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    kv_usage="vllm:kv_cache_usage_perc",
    waiting="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    prompt_tokens=EngineCounter("vllm:prompt_tokens_total"),
    generation_tokens=EngineCounter("vllm:generation_tokens_total"),
)
SGLANG = Family(
    hits_local=EngineCounter(SGLANG_PREFILL_EFFECTIVE_TOKENS, 'mode=~"device_hit|host_hit"'),
    hits_external=EngineCounter(SGLANG_PREFILL_EFFECTIVE_TOKENS, 'mode="storage_hit"'),
    looked_up=EngineCounter(
        SGLANG_PREFILL_EFFECTIVE_TOKENS, 'mode=~"input|device_hit|host_hit|storage_hit"'
    ),
    requests=EngineCounter("sglang:num_requests_total"),
    finished=EngineCounter("sglang:num_requests_total"),
    preemptions=EngineCounter("sglang:num_retracted_requests_total"),
    ttft="sglang:time_to_first_token_seconds",
    itl=("sglang:inter_token_latency_seconds",),
    kv_usage="sglang:token_usage",
    waiting="sglang:num_queue_reqs",
    running="sglang:num_running_reqs",
    prompt_tokens=EngineCounter("sglang:prompt_tokens_total"),
    generation_tokens=EngineCounter("sglang:generation_tokens_total"),
)
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
"""vLLM's info gauge (value 1) with every CacheConfig field as a label; it carries the
``engine`` label but no ``model_name``, so it is joined to the selected pods."""
CACHE_CONFIG_LABELS = ("prefix_caching_hash_algo", "enable_prefix_caching", "block_size")
"""The labels of ``VLLM_CACHE_CONFIG`` the cache isolation check reads."""
VLLM_COMPUTED = "vllm:request_prefill_kv_computed_tokens"
"""vLLM's per-request histogram of prefill tokens computed (vLLM 0.13 or newer)."""
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
"""vLLM's prompt tokens: minus the cache hits, the prefill computed before vLLM 0.13."""
SGLANG_COMPUTED = EngineCounter(SGLANG_PREFILL_EFFECTIVE_TOKENS, 'mode="input"')
"""SGLang's prefill tokens computed (not found in any cache)."""
