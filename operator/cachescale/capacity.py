"""KV-cache capacity arithmetic shared by the simulator and the decision layer.

Pure integer/float functions, no I/O and no dependencies, so the decide layer can size
``--max-num-seqs`` from the same formulas the simulated engine uses to size its block
pool. The cache-friendly batch ceiling ``B_max`` is:

* ``KV_bytes_per_token = layers × 2 × kv_heads × head_dim × dtype_bytes`` (K and V);
* ``M_free = gpu_mem × gpu_memory_utilization − weights``;
* ``B_max = (M_free − cache_reserve) / (L_avg × KV_bytes_per_token)``.

Units: bytes everywhere. Where prose says "GB" this project means GiB (1024**3 bytes).
With tensor parallelism the caller passes *totals* over the replica's GPUs (memory and
weights); ``kv_bytes_per_token`` is then the total over all shards too, since the KV
heads are split across the GPUs and every GPU holds the same number of blocks.

A worked example: (56 GiB − 9 GiB) / (2,048 × 128 KiB) is 188 sequences at 128 KiB per
token (Llama-3-8B with grouped-query attention), and 47 at 512 KiB per token (a multi-head
model such as Llama-2-7B: 32·2·32·128·2 bytes); the tests pin both.
"""

from __future__ import annotations

GIB = 1024**3
"""One GiB in bytes: the project's meaning of "GB"."""


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of KV cache one token occupies: ``layers × 2 × kv_heads × head_dim × dtype``.

    The factor 2 is the key and the value tensor. Llama-3-8B in fp16/bf16 (32 layers,
    8 KV heads, head_dim 128) gives 131,072 B = 128 KiB.
    """
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return layers * 2 * kv_heads * head_dim * dtype_bytes


def free_kv_bytes(gpu_memory_bytes: int, gpu_memory_utilization: float, weight_bytes: int) -> int:
    """Memory left for the KV cache: ``gpu_mem × gpu_memory_utilization − weights``.

    Per GPU group: with tensor parallelism pass the total memory and total weights of
    the replica. Activations and CUDA-graph memory, which vLLM also subtracts after its
    profiling run, are ignored (a few percent). Returns 0 when the weights do not fit,
    never a negative number.
    """
    if gpu_memory_bytes <= 0:
        raise ValueError(f"gpu_memory_bytes must be positive, got {gpu_memory_bytes}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if weight_bytes < 0:
        raise ValueError(f"weight_bytes must be >= 0, got {weight_bytes}")
    return max(0, int(gpu_memory_bytes * gpu_memory_utilization) - weight_bytes)


def num_kv_blocks(free_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    """Number of whole KV blocks (``block_size`` tokens each) that fit in ``free_bytes``."""
    if free_bytes < 0:
        raise ValueError(f"free_bytes must be >= 0, got {free_bytes}")
    if kv_bytes_per_token <= 0 or block_size <= 0:
        raise ValueError("kv_bytes_per_token and block_size must be positive")
    return free_bytes // (kv_bytes_per_token * block_size)


def cache_friendly_batch_ceiling(
    free_bytes: int,
    cache_reserve_bytes: int,
    avg_context_tokens: float,
    kv_bytes_per_token: int,
) -> int:
    """Largest batch whose KV fits beside a protected prefix-cache reserve (``B_max``).

    ``floor((M_free − cache_reserve) / (L_avg × KV_bytes_per_token))``. Above this batch
    size every admitted request evicts a cached block. The result is clamped to at
    least 1: a batch ceiling of 0 would stop the engine, and a reserve at or above the
    free memory means "the cache cannot be protected at any batch size", which the
    caller should read from the inputs rather than from a 0 here.
    """
    if avg_context_tokens <= 0:
        raise ValueError(f"avg_context_tokens must be positive, got {avg_context_tokens}")
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be positive, got {kv_bytes_per_token}")
    if free_bytes < 0 or cache_reserve_bytes < 0:
        raise ValueError("free_bytes and cache_reserve_bytes must be >= 0")
    usable = free_bytes - cache_reserve_bytes
    if usable <= 0:
        return 1
    return max(1, int(usable // (avg_context_tokens * kv_bytes_per_token)))
