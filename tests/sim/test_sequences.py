"""The sequences a replica holds: decoding blocks in aggregate, clients that give up."""

from __future__ import annotations

import math
import random

from tests.sim.engines import BS, check_pool, engine, make_req, unique


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
