"""Token-level divergence: the common prefix and the reordering test behind the causes."""

from __future__ import annotations

import numpy as np

from cachescale.audit.divergence import Tokens, common_prefix, diff, realign, reordered_until
from cachescale.audit.replay import replay
from cachescale.audit.result import build_result
from tests.audit.helpers import corpus


def ids(*values: int) -> Tokens:
    return np.asarray(values, dtype=np.int32)


def test_common_prefix() -> None:
    assert common_prefix(ids(1, 2, 3), ids(1, 2, 4)) == 2
    assert common_prefix(ids(1, 2), ids(1, 2, 4)) == 2
    assert common_prefix(ids(9), ids(1)) == 0
    assert common_prefix(ids(1, 2, 3, 4), ids(1, 2, 3, 5), start=2) == 3


def test_a_reordering_is_the_same_tokens_then_agreement() -> None:
    tools_a, tools_b = [10, 11, 12, 13, 20, 21, 22, 23], [20, 21, 22, 23, 10, 11, 12, 13]
    tail = list(range(100, 120))
    a, b = ids(1, 2, *tools_a, *tail), ids(1, 2, *tools_b, *tail)
    assert reordered_until(a, b, 2, agree=16) == 10
    # Different tokens in the region: not a reordering.
    c = ids(1, 2, *[30, 31, 32, 33, 20, 21, 22, 23], *tail)
    assert reordered_until(a, c, 2, agree=16) is None
    # The same tokens, but the prompts never agree again: not a reordering either.
    d = ids(1, 2, *tools_b, *range(200, 220))
    assert reordered_until(a, d, 2, agree=16) is None


def test_the_causes_of_a_follow_up_turn() -> None:
    system = list(range(1000, 1100))  # 100 tokens: past block 1
    tools = [list(range(k * 100 + 2000, k * 100 + 2040)) for k in range(3)]
    history = list(range(5000, 5300))

    def prompt(order: list[int], extra: list[int]) -> list[int]:
        return system + [t for k in order for t in tools[k]] + history + extra

    records = [{"conversation_id": "w", "turn": 0, "prompt_token_ids": prompt([0, 1, 2], [])}]
    records += [
        {"conversation_id": "a", "turn": 0, "prompt_token_ids": prompt([0, 1, 2], [7] * 50)},
        {"conversation_id": "a", "turn": 1, "prompt_token_ids": prompt([2, 0, 1], [7] * 60)},
        {"conversation_id": "a", "turn": 2, "prompt_token_ids": [3, *prompt([2, 0, 1], [8])]},
        {"conversation_id": "a", "turn": 3, "prompt_token_ids": [3, *system, *[9] * 400]},
    ]
    outcomes = replay(corpus(*records)).outcomes
    assert [o.cause for o in outcomes] == [
        "boundary-shift",  # cold, and the next request reuses it: it heals
        None,  # a hit: it extends the warm-up prompt
        "unstable-ordering",
        "variable-span",  # one token inserted at the top
        "not-append-only",
    ]
    assert outcomes[2].divergence is not None
    assert outcomes[2].divergence.position == 100
    assert outcomes[2].divergence.block == 6
    assert outcomes[2].divergence.against == "previous turn"


def test_tenants_without_a_salt_are_named() -> None:
    records = [
        {"conversation_id": c, "turn": 0, "prompt_token_ids": [1] * 40, "tenant": c}
        for c in ("a", "b")
    ]
    data = corpus(*records)
    assert "without cache_salt" in build_result(data, "x", replay(data))["notes"][0]
    salted = corpus(*[{**r, "cache_salt": r["tenant"]} for r in records])
    assert build_result(salted, "x", replay(salted))["notes"] == []


def _reordered_reference(a: list[int], b: list[int], start: int, agree: int) -> int | None:
    """The rule, one token at a time: the first end where both regions hold the same
    multiset (at least 4 tokens, ending on a differing pair), then ``agree`` equal tokens
    or both prompts end."""
    for end in range(start + 4, min(len(a), len(b)) + 1):
        if a[end - 1] == b[end - 1] or sorted(a[start:end]) != sorted(b[start:end]):
            continue
        tail = min(agree, len(a) - end, len(b) - end)
        if (len(a) == end == len(b)) or (tail > 0 and a[end : end + tail] == b[end : end + tail]):
            return end
    return None


def test_the_reordering_test_agrees_with_the_rule_on_random_prompts() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        head = rng.integers(0, 6, 3).tolist()
        parts = [rng.integers(0, 6, int(rng.integers(1, 5))).tolist() for _ in range(3)]
        tail = rng.integers(0, 6, int(rng.integers(0, 8))).tolist()
        order = rng.permutation(3).tolist()
        a = head + [t for k in range(3) for t in parts[k]] + tail
        b = (
            head
            + [t for k in order for t in parts[k]]
            + rng.integers(0, 6, 2).tolist() * int(rng.integers(0, 2))
        )
        b += tail
        got = reordered_until(ids(*a), ids(*b), 3, agree=4)
        assert got == _reordered_reference(a, b, 3, 4), (a, b)


def test_prompts_rejoin_at_the_closest_equal_run() -> None:
    common = list(range(100, 140))
    a = ids(1, 2, *range(500, 510), *common)  # 10 tokens in place of 3
    b = ids(1, 2, 7, 8, 9, *common)
    assert realign(a, b, 2) == (12, 5)
    change = diff(a, b, 0, 16)
    assert (change.position, change.inserted, change.removed) == (2, 10, 3)
    assert change.keeps_rest
    # Far apart: found past the first window too.
    far = ids(*range(20000, 23000), *common)
    assert realign(far, ids(*common), 0) == (3000, 0)
