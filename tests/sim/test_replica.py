"""Pin the vLLM V1 scheduler and step clock of the simulated replica: TTFT, batching,
head-of-line blocking, preemption, counters, and the pool's invariant under load."""

from __future__ import annotations

import random

import pytest

from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest
from tests.sim.engines import (
    BS,
    T_FIXED,
    T_SEQ,
    T_TOK,
    check_pool,
    engine,
    first_miss,
    make_req,
    serve,
    step_until,
    tiny_profile,
    unique,
)

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
