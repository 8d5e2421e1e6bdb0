"""``vllm:cache_config_info`` for a simulated replica: the labels vLLM 0.32 writes.

vLLM exports its whole ``CacheConfig`` as the labels of one info gauge. The emulator writes
the same labels in the same order, from the simulated replica where it has the value and
vLLM's own defaults where it has none, so a dashboard or ``cachescale audit --live`` reads
the engine's settings from the emulator as from vLLM.
"""

from __future__ import annotations

from cachescale.sim.profiles import NULL_BLOCKS
from cachescale.sim.replica import EngineReplica

VLLM_DEFAULT_BLOCK_SIZE = 16
"""vLLM's ``CacheConfig.DEFAULT_BLOCK_SIZE``: another block size was set on purpose."""


def cache_config_labels(
    engine: EngineReplica, max_model_len: int, hash_algo: str
) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels: the 37 of vLLM 0.32 (every ``CacheConfig``
    field, as ``str()`` writes it, and ``engine``), in its exposition's order. The block
    size, the pool (with the null block, as vLLM counts it), the memory fraction, the KV
    dtype and the hash come from the simulated replica; the capacity fields are vLLM's
    arithmetic on them; the rest are vLLM's values for a dense model on a GPU with no
    ``--num-gpu-blocks-override`` or KV offloading."""
    profile = engine.profile
    # vLLM's num_gpu_blocks counts the null block its pool reserves; the replica's pool
    # is the blocks that hold KV.
    block_size, blocks = engine.block_size, engine.num_blocks + NULL_BLOCKS
    concurrency = blocks / -(-max_model_len // block_size)
    return {
        "_block_size_resolved": "True",
        "block_size": str(block_size),
        "cache_dtype": "fp8" if profile.model.kv_dtype_bytes == 1 else "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "engine": "0",
        "gpu_memory_utilization": str(profile.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(concurrency),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(int(concurrency * max_model_len)),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": hash_algo,
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(block_size != VLLM_DEFAULT_BLOCK_SIZE),
    }
