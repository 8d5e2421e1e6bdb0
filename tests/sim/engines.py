"""A tiny engine for the replica's tests: hand-made requests, a toy profile, pool checks."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

from cachescale.sim.profiles import GpuProfile, ModelProfile, ReplicaProfile, StepTimeModel
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest

BS = 16
T_FIXED = 0.01
T_TOK = 0.001
T_SEQ = 0.0005


def chain_hashes(tokens: list[int], salt: str | None = None) -> list[bytes]:
    """vLLM-style chained hashes of every full block; ``cache_salt`` in block 0 only."""
    out: list[bytes] = []
    parent = b"vllm-none-hash"
    for i in range(len(tokens) // BS):
        m = hashlib.sha256(parent)
        m.update(struct.pack(f"<{BS}q", *tokens[i * BS : (i + 1) * BS]))
        if i == 0 and salt is not None:
            m.update(b"cache_salt" + salt.encode())
        parent = m.digest()
        out.append(parent)
    return out


def make_req(
    rid: int,
    prompt: list[int],
    output_tokens: int,
    *,
    salt: str | None = None,
    output: list[int] | None = None,
) -> SimRequest:
    out = (
        output
        if output is not None
        else [1_000_000 + rid * 10_000 + j for j in range(output_tokens)]
    )
    assert len(out) == output_tokens
    return SimRequest(
        request_id=rid,
        arrival_s=0.0,
        tenant=salt or "default",
        prefix_group=0,
        prompt_tokens=len(prompt),
        output_tokens=output_tokens,
        block_hashes=chain_hashes(prompt + out, salt),
    )


def unique(tag: int, n: int) -> list[int]:
    return [tag * 100_000 + j for j in range(n)]


def tiny_profile(num_blocks: int, budget: int = 64, t_kv: float = 0.0) -> ReplicaProfile:
    # 2 bytes of KV per token, so a 16-token block is 32 bytes: memory = blocks × 32.
    model = ModelProfile(
        "tiny", layers=1, kv_heads=1, head_dim=1, kv_dtype_bytes=1, weight_bytes=0, params=1
    )
    gpu = GpuProfile(
        "toy", memory_bytes=num_blocks * BS * 2, hbm_bytes_per_s=1.0, bf16_flops=1.0, fp8_flops=None
    )
    return ReplicaProfile(
        name="tiny",
        model=model,
        gpu=gpu,
        gpus_per_replica=1,
        gpu_memory_utilization=1.0,
        block_size=BS,
        max_num_batched_tokens=budget,
        step=StepTimeModel(T_FIXED, T_TOK, T_SEQ, t_kv),
    )


def engine(num_blocks: int, max_num_seqs: int = 8, budget: int = 64) -> EngineReplica:
    return EngineReplica(tiny_profile(num_blocks, budget), max_num_seqs, replica_id=7, start_s=0.0)


def serve(e: EngineReplica, req: SimRequest, t: float) -> list[SimRequest]:
    """Submit at ``t`` and run to completion; return everything that finished."""
    done = e.advance_to(t)
    req.arrival_s = t
    e.submit(req, t)
    return done + e.drain()


def step_until(e: EngineReplica, t: float, done: Callable[[], bool], *, dt: float = 0.005) -> float:
    """Advance in small hops (checking the pool each time) until ``done()``; bounded."""
    for _ in range(100_000):
        if done():
            return t
        t += dt
        e.advance_to(t)
        check_pool(e)
    raise AssertionError("condition never reached")


def first_miss(e: EngineReplica, hashes: list[bytes]) -> int:
    """vLLM's lookup walk: leading hashes present, stopping at the first miss."""
    n = 0
    for h in hashes:
        if h not in e._cached:
            break
        n += 1
    return n


def check_pool(e: EngineReplica) -> None:
    """The block-pool invariant plus full consistency with the running sequences."""
    assert len(e._cached) + e._unhashed_free + e._in_use_unhashed == e.num_blocks
    refs: dict[bytes, int] = {}
    in_use_unhashed = 0
    for seq in e._running.values():
        for h in seq.req.block_hashes[: seq.held]:
            refs[h] = refs.get(h, 0) + 1
        decoding = seq.state == 1
        blocks = -(-(seq.c + e._alloc_step) // BS) if decoding else -(-seq.tokens // BS)
        in_use_unhashed += blocks - seq.held
    assert {h: c for h, c in e._cached.items() if c} == refs
    assert set(e._lru) == {h for h, c in e._cached.items() if c == 0}
    check_lru_segments(e)
    assert e._in_use_unhashed == in_use_unhashed
    assert 0.0 <= e.kv_usage <= 1.0


def check_lru_segments(e: EngineReplica) -> None:
    """The LRU queue's bookkeeping: its entry count, and every segment whose mark is not
    in ``_stale`` all valid (eviction deletes those unchecked)."""
    segments = list(e._lru_segments)
    assert e._lru_entries == sum(len(hashes) for hashes, _ in segments) - e._lru_pos
    assert e._stale <= {id(mark) for _, mark in segments}
    pos = e._lru_pos
    for hashes, mark in segments:
        assert pos < len(hashes)
        if id(mark) not in e._stale:
            assert all(e._cached.get(h) is mark for h in hashes[pos:])
        pos = 0
    assert len(e._lru) == e._free_cached
