"""KV capacity arithmetic: bytes per token, free memory, block count, B_max."""

from __future__ import annotations

import pytest

from cachescale.capacity import (
    GIB,
    cache_friendly_batch_ceiling,
    free_kv_bytes,
    kv_bytes_per_token,
    num_kv_blocks,
)

KIB = 1024
LLAMA3_8B_KV = kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
LLAMA2_7B_KV = kv_bytes_per_token(layers=32, kv_heads=32, head_dim=128, dtype_bytes=2)


def test_kv_bytes_per_token_known_models() -> None:
    assert LLAMA3_8B_KV == 131_072 == 128 * KIB  # GQA, 8 KV heads
    assert LLAMA2_7B_KV == 524_288 == 512 * KIB  # MHA, 32 KV heads
    assert kv_bytes_per_token(80, 8, 128, 2) == 327_680  # Llama-3-70B
    assert kv_bytes_per_token(32, 8, 128, 1) == 64 * KIB  # fp8 KV cache halves it


@pytest.mark.parametrize("bad", [(0, 8, 128, 2), (32, 0, 128, 2), (32, 8, -1, 2), (32, 8, 128, 0)])
def test_kv_bytes_per_token_rejects_non_positive(bad: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        kv_bytes_per_token(*bad)


def test_free_kv_bytes() -> None:
    # The brief's 56 GB: 80 GiB at 0.9 utilisation minus 16 GiB of weights.
    assert free_kv_bytes(80 * GIB, 0.9, 16 * GIB) == 56 * GIB
    assert free_kv_bytes(80 * GIB, 1.0, 0) == 80 * GIB
    assert free_kv_bytes(80 * GIB, 0.5, 40 * GIB) == 0
    assert free_kv_bytes(80 * GIB, 0.5, 50 * GIB) == 0  # weights do not fit: 0, not negative


@pytest.mark.parametrize(
    ("mem", "util", "weights"),
    [(0, 0.9, 0), (80 * GIB, 0.0, 0), (80 * GIB, 1.2, 0), (80 * GIB, 0.9, -1)],
)
def test_free_kv_bytes_rejects_bad_inputs(mem: int, util: float, weights: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        free_kv_bytes(mem, util, weights)


def test_num_kv_blocks() -> None:
    block = LLAMA3_8B_KV * 16  # 2 MiB
    assert num_kv_blocks(56 * GIB, LLAMA3_8B_KV, 16) == 28_672
    assert num_kv_blocks(block - 1, LLAMA3_8B_KV, 16) == 0
    assert num_kv_blocks(block, LLAMA3_8B_KV, 16) == 1
    assert num_kv_blocks(0, LLAMA3_8B_KV, 16) == 0
    with pytest.raises(ValueError, match="free_bytes"):
        num_kv_blocks(-1, LLAMA3_8B_KV, 16)
    with pytest.raises(ValueError, match="positive"):
        num_kv_blocks(GIB, LLAMA3_8B_KV, 0)


def test_batch_ceiling_published_example_holds_at_512_kib_per_token() -> None:
    """(56 GB − 9 GB) / (2,048 × KV/token) ≈ 47 is true for an MHA 7B, not for 128 KiB."""
    assert cache_friendly_batch_ceiling(56 * GIB, 9 * GIB, 2048, LLAMA2_7B_KV) == 47


def test_batch_ceiling_llama3_8b_gqa_is_188() -> None:
    assert cache_friendly_batch_ceiling(56 * GIB, 9 * GIB, 2048, LLAMA3_8B_KV) == 188


def test_batch_ceiling_floors_at_exact_boundaries() -> None:
    per_seq = 1000 * LLAMA3_8B_KV
    assert cache_friendly_batch_ceiling(10 * per_seq + 5, 5, 1000, LLAMA3_8B_KV) == 10
    assert cache_friendly_batch_ceiling(10 * per_seq + 4, 5, 1000, LLAMA3_8B_KV) == 9
    assert cache_friendly_batch_ceiling(10 * per_seq, 0, 1000.0, LLAMA3_8B_KV) == 10


def test_batch_ceiling_is_clamped_to_one() -> None:
    assert (
        cache_friendly_batch_ceiling(10 * GIB, 10 * GIB, 2048, LLAMA3_8B_KV) == 1
    )  # reserve == free
    assert (
        cache_friendly_batch_ceiling(10 * GIB, 20 * GIB, 2048, LLAMA3_8B_KV) == 1
    )  # reserve > free
    assert cache_friendly_batch_ceiling(10 * GIB, 0, 10**9, LLAMA3_8B_KV) == 1  # one seq > memory
    assert cache_friendly_batch_ceiling(0, 0, 2048, LLAMA3_8B_KV) == 1


def test_batch_ceiling_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="avg_context_tokens"):
        cache_friendly_batch_ceiling(GIB, 0, 0, LLAMA3_8B_KV)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        cache_friendly_batch_ceiling(GIB, 0, 2048, 0)
    with pytest.raises(ValueError, match=">= 0"):
        cache_friendly_batch_ceiling(GIB, -1, 2048, LLAMA3_8B_KV)


def test_ceiling_shrinks_as_the_reserve_grows() -> None:
    ceilings = [
        cache_friendly_batch_ceiling(56 * GIB, r * GIB, 2048, LLAMA3_8B_KV) for r in range(0, 57, 7)
    ]
    assert ceilings == sorted(ceilings, reverse=True)
    assert ceilings[0] == 224  # 56 GiB / 256 MiB
