"""The engine profiles: names, KV shapes, why the 70B profiles use FP8 or 4 GPUs, step times."""

from __future__ import annotations

import pytest

from cachescale.capacity import GIB, free_kv_bytes
from cachescale.sim.profiles import H100_80GB, LLAMA3_70B, PROFILES, get_profile


def test_get_profile_lists_valid_names() -> None:
    assert get_profile("llama3-8b-a100").gpus_per_replica == 1
    with pytest.raises(KeyError, match="llama3-8b-a100"):
        get_profile("gpt-5")


def test_profile_shapes() -> None:
    assert get_profile("llama3-8b-a100").kv_bytes_per_token == 131_072
    assert get_profile("llama2-7b-a100").kv_bytes_per_token == 512 * 1024
    assert get_profile("llama3-70b-h100-tp4").kv_bytes_per_token == 327_680
    assert {p.gpus_per_replica for p in PROFILES.values()} >= {1, 2, 4}
    for p in PROFILES.values():
        assert p.num_blocks > 1000, p.name


def test_70b_bf16_does_not_leave_room_for_kv_on_two_gpus() -> None:
    """Why the bf16 70B profile uses 4 GPUs and the 2-GPU one uses FP8 weights."""
    two = free_kv_bytes(2 * H100_80GB.memory_bytes, 0.92, LLAMA3_70B.weight_bytes)
    assert two < 16 * GIB  # ~50k tokens of KV for the whole replica
    fp8 = get_profile("llama3-70b-fp8-h100-tp2").free_kv_bytes
    assert fp8 > 4 * two
    assert get_profile("llama3-70b-h100-tp4").free_kv_bytes > 8 * two


def test_step_model_calibration_ballparks() -> None:
    step = get_profile("llama3-8b-a100").step
    prefill_tok_s = 1 / step.t_prefill_token_s
    assert 8_000 <= prefill_tok_s <= 12_000
    batch32 = step.step_seconds(prefill_tokens=0, decode_seqs=32, context_tokens=32 * 2048)
    assert 0.015 <= batch32 <= 0.030
    single = step.step_seconds(prefill_tokens=0, decode_seqs=1, context_tokens=1024)
    assert 0.008 <= single <= 0.014  # ~70-125 tok/s single-stream decode
