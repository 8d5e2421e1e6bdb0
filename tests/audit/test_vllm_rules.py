"""The audit's cache follows vLLM's prefix-caching rules (it is the simulator's engine).

Block size 16 throughout. Conversation "w" is the warm-up pass, "a" the audit pass.
"""

from __future__ import annotations

import pytest

from cachescale.audit.corpus import CorpusError
from cachescale.audit.replay import replay
from cachescale.sim.hashing import hash_blocks
from tests.audit.helpers import corpus, two_conversations

A32 = list(range(1, 33))


def cached(warm: list[list[int]], audited: list[list[int]], block_size: int = 16) -> list[int]:
    result = replay(two_conversations(warm, audited), block_size=block_size)
    return [o.cached_tokens for o in result.outcomes if o.pass_name == "audit"]


def test_only_full_blocks_are_cached() -> None:
    assert cached([A32[:20]], [A32[:20]]) == [16]  # the partial block 1 is never cached
    assert cached([A32[:15]], [[*A32[:15], 99]]) == [0]  # no full block at all


def test_a_full_hit_is_capped_at_num_tokens_minus_one() -> None:
    assert cached([A32], [A32]) == [16]  # the last block is recomputed
    assert cached([A32], [[*A32, 7]]) == [32]  # one more token: both blocks hit


def test_lookup_stops_at_the_first_miss() -> None:
    changed = [*A32, *range(100, 132)]
    changed[20] = 999  # block 1; blocks 2 and 3 are token-identical to the warm prompt
    assert cached([[*A32, *range(100, 132)]], [[*changed, 5]]) == [16]


def test_the_salt_goes_into_block_0_and_so_into_every_block() -> None:
    tokens = [*A32, 5]
    salted = two_conversations([tokens], [tokens], cache_salt="tenant-b")
    assert [o.cached_tokens for o in replay(salted).outcomes] == [0, 0]
    same = corpus(
        {"conversation_id": "w", "turn": 0, "prompt_token_ids": tokens, "cache_salt": "t"},
        {"conversation_id": "a", "turn": 0, "prompt_token_ids": tokens, "cache_salt": "t"},
    )
    assert [o.cached_tokens for o in replay(same).outcomes] == [0, 32]
    plain = hash_blocks(bytes(range(128)))
    salt = hash_blocks(bytes(range(128)), salt=b"t")
    assert all(a != b for a, b in zip(plain, salt, strict=True))


def test_block_size_is_honoured() -> None:
    assert cached([A32], [A32], block_size=8) == [24]


def test_a_bounded_pool_evicts_least_recently_used_and_says_so() -> None:
    a, b, c, d = (list(range(start, start + 32)) for start in (1, 40, 80, 120))
    records = [
        {"conversation_id": "w", "turn": t, "prompt_token_ids": p}
        for t, p in enumerate([a, b, c, d])
    ]
    records += [
        {"conversation_id": "b", "turn": 0, "prompt_token_ids": [*b, 1]},
        {"conversation_id": "a", "turn": 0, "prompt_token_ids": [*a, 1]},
    ]
    result = replay(corpus(*records), kv_blocks=7, warmup_conversations=1)
    audited = [o for o in result.outcomes if o.pass_name == "audit"]
    # Six usable blocks hold three of the 2-block prompts: D evicted A, the least recently
    # used.
    assert [o.cached_tokens for o in audited] == [32, 0]
    assert audited[1].cause == "evicted"
    unbounded = replay(corpus(*records), warmup_conversations=1)
    assert [o.cached_tokens for o in unbounded.outcomes[4:]] == [32, 32]


@pytest.mark.parametrize(
    ("kv_blocks", "want"),
    [
        # 6 usable: A, B and C (2 blocks each) fill the pool; A is still whole.
        (7, 32),
        # 5 usable: C takes the free block and evicts A's block 1 (freed tail first).
        (6, 16),
        # 4 usable: A and B fill the pool; C evicts both of A's blocks.
        (5, 0),
    ],
)
def test_kv_blocks_is_num_gpu_blocks_and_one_is_the_null_block(kv_blocks: int, want: int) -> None:
    a, b, c = (list(range(start, start + 32)) for start in (1, 40, 80))
    records = [
        {"conversation_id": "w", "turn": t, "prompt_token_ids": p} for t, p in enumerate([a, b, c])
    ]
    records.append({"conversation_id": "a", "turn": 0, "prompt_token_ids": [*a, 1]})
    result = replay(corpus(*records), kv_blocks=kv_blocks, warmup_conversations=1)
    assert [o.cached_tokens for o in result.outcomes] == [0, 0, 0, want]
    assert result.kv_blocks == kv_blocks  # the result says the engine's figure


def test_a_prompt_must_fit_in_the_blocks_besides_the_null_block() -> None:
    tokens = two_conversations([list(range(1, 34))], [list(range(1, 34))])  # 3 blocks each
    assert [o.cached_tokens for o in replay(tokens, kv_blocks=4).outcomes] == [0, 32]
    with pytest.raises(CorpusError, match=r"--kv-blocks 3 holds 2 \(vLLM keeps one as its null"):
        replay(tokens, kv_blocks=3)
