"""The engines' prefix-cache counters, by name and version: one home for them.

Three parts of cachescale read the same counters and must never disagree on a name: the
operator's PromQL (``gather/promql.py``), the live audit reading an engine's own
``/metrics`` (``audit/live.py``), and the simulator, which exports them
(``sim/vllm_metrics.py``) and evaluates PromQL over them (``sim/observe.py``). Each constant is
the sample name Prometheus stores: a counter with its ``_total`` suffix. The versions are
those of the engines' release notes and source, as ``docs/signals.md`` lists them.
"""

from __future__ import annotations

from typing import Final

VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
"""Prompt tokens looked up in vLLM's local prefix cache (vLLM ≥0.9.2)."""
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
"""Tokens of those found in the local prefix cache (vLLM ≥0.9.2)."""
VLLM_EXTERNAL_PREFIX_CACHE_HITS: Final = "vllm:external_prefix_cache_hits_total"
"""Tokens found through the KV connector (vLLM ≥0.11.1)."""
VLLM_LEGACY_PREFIX_CACHE_QUERIES: Final = "vllm:gpu_prefix_cache_queries_total"
"""The older name of the queries counter: blocks in 0.8.5, tokens from 0.9.0; deprecated
in 0.9.2 and removed in 0.12.0."""
VLLM_LEGACY_PREFIX_CACHE_HITS: Final = "vllm:gpu_prefix_cache_hits_total"
"""The older name of the hits counter (as ``VLLM_LEGACY_PREFIX_CACHE_QUERIES``)."""
SGLANG_PREFILL_EFFECTIVE_TOKENS: Final = "sglang:prefill_effective_tokens_total"
"""SGLang's prefill tokens by ``mode`` (``SGLANG_INPUT_MODE`` and ``SGLANG_HIT_MODES``),
re-counts of retracted requests removed; added between 0.5.15 and 0.5.20."""
SGLANG_INPUT_MODE: Final = "input"
"""The ``mode`` of ``SGLANG_PREFILL_EFFECTIVE_TOKENS`` that counts tokens computed."""
SGLANG_HIT_MODES: Final = ("device_hit", "host_hit", "storage_hit")
"""Its ``mode`` values that count cache hits: GPU, host memory, and storage (external)."""
