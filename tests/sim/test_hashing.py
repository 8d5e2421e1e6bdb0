"""vLLM's chained block hashes: one token changes its block and every later one; salts."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np

from cachescale.sim.hashing import NONE_HASH, extend_chain, hash_blocks


def _tokens(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 32_000, n, dtype=np.int32).tobytes()


def test_chained_hash_one_token_changes_its_block_and_every_later_one() -> None:
    tokens = bytearray(_tokens(16 * 10))
    before = hash_blocks(bytes(tokens))
    k = 4
    tokens[(16 * k + 5) * 4] ^= 1  # one token in block k
    after = hash_blocks(bytes(tokens))
    assert after[:k] == before[:k]
    assert all(a != b for a, b in zip(after[k:], before[k:], strict=True))


def test_block_hash_is_sha256_of_parent_tokens_and_salt_on_block_zero_only() -> None:
    tokens = _tokens(32)
    d0, d1 = hash_blocks(tokens, salt=b"acme")
    assert d0 == hashlib.sha256(NONE_HASH + tokens[:64] + b"acme").digest()
    assert d1 == hashlib.sha256(d0 + tokens[64:]).digest()


def test_only_full_blocks_are_hashed() -> None:
    assert len(hash_blocks(_tokens(16 * 5 + 15))) == 5
    assert hash_blocks(_tokens(15)) == []


def test_incremental_chain_equals_one_shot() -> None:
    tokens = _tokens(1000)
    digests: list[bytes] = []
    rest = b""
    for a, b in itertools.pairwise([0, 7, 40, 41, 500, 1000]):
        rest = extend_chain(digests, rest, tokens[a * 4 : b * 4], 16, b"s")
    assert digests == hash_blocks(tokens, salt=b"s")
    assert rest == tokens[992 * 4 :]
