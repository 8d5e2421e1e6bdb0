"""Pin the vLLM V1 prefix-caching mechanics of the simulated replica, and its profiles."""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections.abc import Callable

import pytest

from cachescale.capacity import GIB, free_kv_bytes
from cachescale.sim.profiles import (
    H100_80GB,
    LLAMA3_70B,
    PROFILES,
    GpuProfile,
    ModelProfile,
    ReplicaProfile,
    StepTimeModel,
    get_profile,
)
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest

BS = 16
T_FIXED = 0.01
T_TOK = 0.001
T_SEQ = 0.0005


# --- helpers -------------------------------------------------------------------------


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
    assert e._in_use_unhashed == in_use_unhashed
    assert 0.0 <= e.kv_usage <= 1.0


# --- lookup ---------------------------------------------------------------------------


def test_first_miss_stops_lookup_even_if_later_blocks_are_cached() -> None:
    e = engine(64)
    prompt = unique(1, 64)
    a = make_req(1, prompt, 1)
    serve(e, a, 0.0)
    assert e.has_prefix(a.block_hashes) == 4
    # Same later blocks (even the very same hashes), but block 0 differs.
    b = make_req(2, prompt, 1)
    b.block_hashes = [hashlib.sha256(b"other").digest(), *a.block_hashes[1:]]
    serve(e, b, 10.0)
    assert b.cached_tokens == 0
    assert b.ttft_s == pytest.approx(T_FIXED + T_TOK * 64)  # the whole prompt computed
    # One changed token in block 0 changes every chained hash after it.
    c_prompt = [999, *prompt[1:]]
    c = make_req(3, c_prompt, 1)
    assert not set(c.block_hashes) & set(a.block_hashes)
    serve(e, c, 20.0)
    assert c.cached_tokens == 0


def test_only_full_blocks_are_cached() -> None:
    e = engine(64)
    a = make_req(1, unique(1, 31), 1)  # KV of 31 tokens: one full block, one partial
    serve(e, a, 0.0)
    assert e.num_cached_blocks == 1
    b = make_req(2, unique(1, 31), 1)
    serve(e, b, 10.0)
    assert b.cached_tokens == 16


def test_hit_is_capped_at_num_tokens_minus_one() -> None:
    e = engine(64)
    prompt = unique(1, 32)
    serve(e, make_req(1, prompt, 1), 0.0)
    again = make_req(2, prompt, 1)
    serve(e, again, 10.0)
    assert again.cached_tokens == 16  # the last full block is recomputed
    longer = make_req(3, [*prompt, 5], 1)
    serve(e, longer, 20.0)
    assert longer.cached_tokens == 32


def test_output_blocks_are_cached_when_computed() -> None:
    """A follow-up turn hits the previous turn's output, but only its computed KV."""
    e = engine(64)
    prompt = unique(1, 20)
    output = unique(2, 28)  # 48 tokens, but the last sampled token never gets KV
    a = make_req(1, prompt, 28, output=output)
    assert len(a.block_hashes) == 3
    serve(e, a, 0.0)
    follow = make_req(2, prompt + output + unique(3, 16), 1)
    serve(e, follow, 10.0)
    assert follow.cached_tokens == 32


def test_cache_salt_isolates_tenants() -> None:
    e = engine(64)
    prompt = unique(1, 64)
    serve(e, make_req(1, prompt, 1, salt="tenant-a"), 0.0)
    other = make_req(2, prompt, 1, salt="tenant-b")
    serve(e, other, 10.0)
    assert other.cached_tokens == 0
    same = make_req(3, prompt, 1, salt="tenant-a")
    serve(e, same, 20.0)
    assert same.cached_tokens == 48


# --- pool: freeing order, LRU eviction, unhashed reuse ---------------------------------


def served_one(num_blocks: int) -> tuple[EngineReplica, SimRequest]:
    """An engine of ``num_blocks`` blocks that has served one 64-token request: its four
    full blocks are cached, and free."""
    e = engine(num_blocks)
    a = make_req(1, unique(1, 64), 1)
    serve(e, a, 0.0)
    return e, a


def test_tail_first_free_and_lru_evicts_the_older_chain_tail_first() -> None:
    e = engine(8)
    a = make_req(1, unique(1, 64), 1)
    b = make_req(2, unique(2, 64), 1)
    serve(e, a, 0.0)
    serve(e, b, 10.0)
    assert e.num_cached_blocks == 8
    assert list(e._lru) == a.block_hashes[::-1] + b.block_hashes[::-1]
    assert e.kv_usage == 0.0  # cached blocks nobody uses count as free
    serve(e, make_req(3, unique(3, 31), 1), 20.0)  # needs two fresh blocks
    assert e.evictions_total == 2
    assert e.has_prefix(a.block_hashes) == 2  # a's tail (blocks 3, 2) went first
    assert e.has_prefix(b.block_hashes) == 4
    check_pool(e)


def test_unhashed_free_blocks_are_reused_before_cached_ones() -> None:
    e, a = served_one(10)
    serve(e, make_req(2, unique(2, 95), 1), 10.0)  # six blocks: exactly the unhashed ones
    assert e.evictions_total == 0
    assert e.has_prefix(a.block_hashes) == 4
    check_pool(e)


def test_has_prefix_does_not_touch_the_lru() -> None:
    e, a = served_one(8)
    before = list(e._lru)
    assert e.has_prefix(a.block_hashes[:2]) == 2
    assert list(e._lru) == before


def test_hits_are_touched_out_of_the_lru_and_not_evicted_by_their_own_request() -> None:
    e, _ = served_one(8)
    # Shares the served request's first three blocks and needs two more: the pool is 4
    # cached + 4 free.
    shared = make_req(2, unique(1, 48) + unique(5, 40), 1)
    serve(e, shared, 10.0)
    assert shared.cached_tokens == 48
    assert e.evictions_total == 0
    check_pool(e)


# --- scheduler ---------------------------------------------------------------------------


def test_lone_request_takes_one_prefill_step_then_one_step_per_token() -> None:
    e = engine(64)
    r = make_req(1, unique(1, 40), 5)
    serve(e, r, 0.0)
    ttft = T_FIXED + T_TOK * 40
    assert r.ttft_s == pytest.approx(ttft)
    assert r.finished_s == pytest.approx(ttft + 4 * (T_FIXED + T_SEQ))
    assert e.busy_seconds == pytest.approx(r.finished_s)
    assert r.replica == 7


def test_ttft_grows_with_queueing() -> None:
    e = engine(256)
    reqs = [make_req(i, unique(i, 60), 20) for i in range(8)]
    for r in reqs:
        e.submit(r, 0.0)
    assert e.num_running == 1
    assert e.num_waiting == 7
    e.drain()
    ttfts: list[float] = []
    for r in reqs:
        assert r.ttft_s is not None
        ttfts.append(r.ttft_s)
    assert ttfts == sorted(ttfts)
    assert ttfts[-1] > 4 * ttfts[0]


def test_cache_hit_shortens_ttft() -> None:
    e = engine(64)
    prompt = unique(1, 60)
    miss = make_req(1, prompt, 1)
    hit = make_req(2, prompt, 1)
    serve(e, miss, 0.0)
    serve(e, hit, 10.0)
    assert hit.cached_tokens == 48
    assert hit.ttft_s == pytest.approx(T_FIXED + T_TOK * 12)
    assert miss.ttft_s == pytest.approx(T_FIXED + T_TOK * 60)


def test_max_num_seqs_is_respected() -> None:
    e = engine(256, max_num_seqs=2)
    reqs = [make_req(i, unique(i, 16), 50) for i in range(5)]
    for r in reqs:
        e.submit(r, 0.0)
    seen: list[tuple[int, int]] = []

    def idle() -> bool:
        seen.append((e.num_running, e.num_waiting))
        return not (e.num_running or e.num_waiting)

    step_until(e, 0.0, idle, dt=0.003)
    assert max(running for running, _ in seen) == 2
    assert (2, 3) in seen
    assert all(r.finished_s is not None for r in reqs)


def test_head_of_line_blocking_when_the_head_does_not_fit() -> None:
    e = engine(12)
    running = make_req(1, unique(1, 96), 40)  # 6 blocks, grows to 9
    e.submit(running, 0.0)
    e.advance_to(0.2)
    big = make_req(2, unique(2, 96), 1)  # needs 6 blocks: does not fit beside it
    small = make_req(3, unique(3, 16), 1)  # would fit
    e.submit(big, 0.2)
    e.submit(small, 0.2)
    e.advance_to(0.3)
    assert e.num_running == 1
    assert e.num_waiting == 2
    e.drain()
    assert running.finished_s is not None
    assert big.first_token_s is not None
    assert small.first_token_s is not None
    assert running.finished_s <= big.first_token_s <= small.first_token_s


def test_preemption_frees_all_blocks_and_the_request_resumes() -> None:
    e = engine(16)
    a = make_req(1, unique(1, 16), 120)  # grows to 9 blocks
    b = make_req(2, unique(2, 16), 120)  # grows to 9 blocks: 18 > 16
    e.submit(a, 0.0)
    e.submit(b, 0.0)
    step_until(e, 0.0, lambda: e.num_preemptions_total > 0)
    # b (the most recently admitted) was preempted and holds nothing any more.
    assert b.num_preemptions == 1
    assert a.num_preemptions == 0
    assert e.num_waiting == 1
    assert next(iter(e._running.values())).req is a
    done = e.drain()
    assert {r.request_id for r in done} == {1, 2}
    assert b.finished_s is not None
    assert a.finished_s is not None
    assert b.finished_s > a.finished_s
    assert e.num_preemptions_total == 1
    # Resumed, not restarted: exactly the requested output, no double counting.
    assert e.generation_tokens_total == 240
    # Recorded once, at first admission: a readmission is not a new query.
    assert e.prefix_cache_queries_tokens == 32
    assert b.cached_tokens == 0
    assert e.kv_usage == 0.0
    check_pool(e)


def test_preempted_prefill_keeps_only_computed_blocks_cached() -> None:
    e = engine(18, max_num_seqs=2, budget=4)
    dec = make_req(1, unique(1, 16), 200)  # grows to 14 blocks
    e.submit(dec, 0.0)
    e.advance_to(1.0)  # dec now holds 7 blocks
    long = make_req(2, unique(2, 160), 1)  # 10 blocks, prefilled 3 tokens per step
    e.submit(long, 1.0)
    step_until(e, 1.0, lambda: e.num_preemptions_total > 0)
    assert long.num_preemptions == 1
    # Registered at admission, but only the computed blocks keep their hash: the rest
    # came back as unhashed free blocks, which the decode growth reuses without evicting.
    kept = e.has_prefix(long.block_hashes)
    assert 1 <= kept < 10
    assert e.evictions_total == 0
    e.drain()
    assert dec.num_preemptions == 0
    assert dec.finished_s is not None
    assert long.finished_s is not None
    assert long.finished_s > dec.finished_s
    check_pool(e)


# --- counters and invariants ---------------------------------------------------------------


def test_prefix_cache_counters_are_in_tokens() -> None:
    e = engine(64)
    a = make_req(1, unique(1, 40), 3)
    b = make_req(2, unique(1, 32) + unique(2, 8), 4)
    serve(e, a, 0.0)
    serve(e, b, 10.0)
    assert a.cached_tokens == 0
    assert b.cached_tokens == 32
    assert e.prefix_cache_queries_tokens == 80
    assert e.prefix_cache_hits_tokens == 32
    assert e.prompt_tokens_total == 80
    assert e.generation_tokens_total == 7
    assert b.prefill_computed_tokens == 8


def test_kv_usage_counts_running_blocks_only() -> None:
    e = engine(10)
    r = make_req(1, unique(1, 40), 100)
    e.submit(r, 0.0)
    e.advance_to(0.1)
    assert e.kv_usage == pytest.approx(3 / 10)
    e.drain()
    assert e.kv_usage == 0.0
    assert e.num_cached_blocks == (40 + 100 - 1) // BS


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pool_invariant_under_random_load(seed: int) -> None:
    rng = random.Random(seed)
    e = engine(48, max_num_seqs=6, budget=96)
    shared = [unique(900 + g, 80) for g in range(3)]
    reqs: list[SimRequest] = []
    t = 0.0
    for i in range(300):
        t += rng.expovariate(8.0)
        done = e.advance_to(t)
        check_pool(e)
        for r in done:
            assert r.finished_s is not None
            assert r.finished_s <= t
        prefix = shared[rng.randrange(3)][: rng.randrange(0, 80)]
        prompt = prefix + unique(i, rng.randrange(1, 60))
        r = make_req(i, prompt, rng.randrange(1, 120), salt=rng.choice([None, "x"]))
        r.arrival_s = t
        e.submit(r, t)
        reqs.append(r)
        check_pool(e)
        for other in reqs[-30:]:  # cached blocks of a chain always form a prefix
            assert e.has_prefix(other.block_hashes) == first_miss(e, other.block_hashes)
    e.drain()
    check_pool(e)
    assert all(r.finished_s is not None for r in reqs)
    assert e.kv_usage == 0.0
    assert e.prefix_cache_queries_tokens == sum(r.prompt_tokens for r in reqs)
    assert e.prefix_cache_hits_tokens == sum(r.cached_tokens or 0 for r in reqs)
    assert e.generation_tokens_total == sum(r.output_tokens for r in reqs)
    assert e.prompt_tokens_total == sum(r.prompt_tokens for r in reqs)
    assert e.num_preemptions_total == sum(r.num_preemptions for r in reqs)
    for r in reqs:
        assert r.first_token_s is not None
        assert r.finished_s is not None
        assert r.arrival_s < r.first_token_s <= r.finished_s
        assert r.cached_tokens is not None
        assert r.cached_tokens % BS == 0
        assert r.cached_tokens < r.prompt_tokens


def test_decode_block_formula_matches_brute_force() -> None:
    rng = random.Random(5)
    e = engine(64)
    cs = [rng.randrange(-300, 300) for _ in range(40)]
    for c in cs:
        a, x = divmod(c, BS)
        e._d_n += 1
        e._d_a += a
        e._d_phase[x] += 1
    for n in range(300, 340):
        assert e._decode_need(n) == sum(math.ceil((c + n) / BS) for c in cs)


# --- API guards -----------------------------------------------------------------------------


def test_submit_requires_advance_to_first() -> None:
    e = engine(64)
    with pytest.raises(ValueError, match="advance_to"):
        e.submit(make_req(1, unique(1, 16), 1), 1.0)
    e.advance_to(1.0)
    with pytest.raises(ValueError, match="time runs forward"):
        e.advance_to(0.5)


def test_request_larger_than_the_pool_is_rejected() -> None:
    e = engine(4)
    with pytest.raises(ValueError, match="KV blocks"):
        e.submit(make_req(1, unique(1, 60), 10), 0.0)


def test_max_num_seqs_bounds() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineReplica(tiny_profile(8, budget=64), 65, 0, 0.0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineReplica(tiny_profile(8), 0, 0, 0.0)


# --- profiles -------------------------------------------------------------------------------


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


def test_clients_that_give_up_leave_the_queue_and_hold_nothing() -> None:
    # max_num_seqs 1: the first request runs, the other three queue behind it.
    e = engine(num_blocks=64, max_num_seqs=1)
    requests = [make_req(i, unique(i, 40), 50) for i in range(4)]
    for i, req in enumerate(requests):
        t = 0.001 * i
        e.advance_to(t)
        req.arrival_s = t
        e.submit(req, t)
    assert e.num_waiting == 3
    assert e.abort_waiting(arrived_by_s=0.0015) == [requests[1]]  # the oldest queued one
    assert e.num_waiting == 2
    assert e.abort_waiting(arrived_by_s=-1.0) == []
    check_pool(e)
    finished = e.drain()
    assert [r.request_id for r in finished] == [0, 2, 3]
    assert requests[1].first_token_s is None
    check_pool(e)
