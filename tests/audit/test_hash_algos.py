"""``--hash-algo``: vLLM's block hash definitions on worked vectors, the same hits under
every algorithm, the simulator's chain as ``fast``, the default by vLLM version, and no
comparison across algorithms.

vLLM's definition (``vllm/utils/hashing.py`` and ``hash_block_tokens`` in
``vllm/v1/core/kv_cache_utils.py``): block ``i`` is named
``hash_fn((parent, tuple(block_token_ids), extra_keys))``, where block 0's parent is
``NONE_HASH = hash_fn(PYTHONHASHSEED)`` and its extra keys are ``(cache_salt,)`` when the
request has a salt (``None`` otherwise and on every later block). ``sha256_cbor`` is
``sha256(cbor2.dumps(x, canonical=True))``; ``xxhash`` is ``xxh3_128(pickle.dumps(x,
HIGHEST_PROTOCOL))``. The CBOR below is written out byte by byte (RFC 8949): an array of
3 is ``0x83``, a 32-byte string ``0x58 0x20``, an array of 4 ``0x84``, small integers are
their own byte, 100 is ``0x18 0x64``, 1000 ``0x19 0x03e8``, 70000 ``0x1a 0x00011170``,
null ``0xf6``, a 1-character text ``0x61``.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import xxhash

from cachescale.audit.demo import build_case
from cachescale.audit.hashing import (
    HASH_ALGOS,
    HASH_SEED,
    HashAlgoError,
    chain_hasher,
    default_algo,
)
from cachescale.audit.replay import replay
from cachescale.commands import audit_flags as command
from cachescale.exit_codes import ExitCode
from cachescale.sim.hashing import hash_blocks
from tests.audit.helpers import cli, corpus, results_by_setting, two_requests

TOKENS = np.asarray([1, 2, 3, 4, 100, 1000, 70000, 23, 5], dtype=np.int32)
"""Two full blocks of 4 and a partial one (never hashed)."""


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def test_sha256_cbor_digests_are_vllms_on_worked_vectors() -> None:
    assert HASH_SEED == "0"
    root = sha256(b"\x61" + b"0")  # NONE_HASH for PYTHONHASHSEED=0: the text "0"
    block0 = sha256(b"\x83\x58\x20" + root + b"\x84\x01\x02\x03\x04" + b"\xf6")
    block1 = sha256(
        b"\x83\x58\x20" + block0 + b"\x84\x18\x64\x19\x03\xe8\x1a\x00\x01\x11\x70\x17" + b"\xf6"
    )
    salted0 = sha256(b"\x83\x58\x20" + root + b"\x84\x01\x02\x03\x04" + b"\x81\x61t")
    salted1 = sha256(
        b"\x83\x58\x20" + salted0 + b"\x84\x18\x64\x19\x03\xe8\x1a\x00\x01\x11\x70\x17" + b"\xf6"
    )
    assert block0.hex() == "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb"
    assert block1.hex() == "17e64aa6283f2ed4b60c94bf9489b028f44b7e613cab9b813eb4556a472106dd"
    chain = chain_hasher("sha256_cbor")
    assert chain(TOKENS, 4, None) == [block0, block1]
    assert chain(TOKENS, 4, "t") == [salted0, salted1]  # the salt is in block 0 only
    assert chain(TOKENS, 4, "") == [block0, block1]  # an empty salt is no salt, as in vLLM


def test_xxhash_is_xxh3_128_of_the_pickled_tuple() -> None:
    # pickle protocol 5 of the text "0": PROTO 5, FRAME of 5 bytes, SHORT_BINUNICODE of 1,
    # MEMOIZE, STOP.
    pickled_seed = b"\x80\x05\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01" + b"0" + b"\x94."
    root = xxhash.xxh3_128_digest(pickled_seed)
    chain = chain_hasher("xxhash")(TOKENS, 4, None)
    assert [len(h) for h in chain] == [16, 16]
    assert [h.hex() for h in chain] == [
        "f3856cedd7e636094750c4546e855397",
        "7944675f49ad326ef2f9d7ac24e59fb8",
    ]
    assert chain[0] == xxhash.xxh3_128_digest(pickle.dumps((root, (1, 2, 3, 4), None), protocol=5))
    salted = chain_hasher("xxhash")(TOKENS, 4, "t")
    assert all(a != b for a, b in zip(chain, salted, strict=True))


def test_fast_is_the_simulators_chain() -> None:
    assert chain_hasher("fast")(TOKENS, 4, "t") == hash_blocks(TOKENS.tobytes(), 4, b"t")
    assert command.HASH_ALGOS == HASH_ALGOS


def test_sha256_is_vllms_default_digest_of_the_pickled_tuple() -> None:
    """vLLM >= 0.10.2's default, computed as vLLM computes it: ``sha256`` in
    ``vllm/utils/hashing.py`` is ``hashlib.sha256(pickle.dumps(x,
    protocol=pickle.HIGHEST_PROTOCOL)).digest()``; ``init_none_hash`` in
    ``vllm/v1/core/kv_cache_utils.py`` roots the chain at ``sha256("0")`` for
    ``PYTHONHASHSEED=0``, and ``hash_block_tokens`` hashes ``(parent, tuple(ids),
    extra_keys)``."""
    pickled_seed = b"\x80\x05\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01" + b"0" + b"\x94."
    assert pickle.dumps("0", protocol=pickle.HIGHEST_PROTOCOL) == pickled_seed
    root = sha256(pickled_seed)
    block0 = sha256(pickle.dumps((root, (1, 2, 3, 4), None), protocol=5))
    block1 = sha256(pickle.dumps((block0, (100, 1000, 70000, 23), None), protocol=5))
    salted0 = sha256(pickle.dumps((root, (1, 2, 3, 4), ("t",)), protocol=5))
    chain = chain_hasher("sha256")
    assert chain(TOKENS, 4, None) == [block0, block1]
    assert chain(TOKENS, 4, "t")[0] == salted0
    assert chain(TOKENS, 4, None) != chain_hasher("fast")(TOKENS, 4, None)


def test_xxhash_cbor_is_xxh3_128_of_the_canonical_cbor() -> None:
    """vLLM >= 0.13's ``xxhash_cbor`` (``vllm/utils/hashing.py``):
    ``xxh3_128_digest(cbor2.dumps(x, canonical=True))``, chained by ``hash_block_tokens``
    from ``NONE_HASH = xxhash_cbor("0")`` (``init_none_hash``, ``PYTHONHASHSEED=0``). The
    CBOR is the worked bytes of the ``sha256_cbor`` vector above, with 16-byte digests
    (``0x50``) as parents."""
    root = xxhash.xxh3_128_digest(b"\x61" + b"0")
    block0 = xxhash.xxh3_128_digest(b"\x83\x50" + root + b"\x84\x01\x02\x03\x04" + b"\xf6")
    block1 = xxhash.xxh3_128_digest(
        b"\x83\x50" + block0 + b"\x84\x18\x64\x19\x03\xe8\x1a\x00\x01\x11\x70\x17" + b"\xf6"
    )
    salted0 = xxhash.xxh3_128_digest(b"\x83\x50" + root + b"\x84\x01\x02\x03\x04\x81\x61t")
    chain = chain_hasher("xxhash_cbor")
    assert chain(TOKENS, 4, None) == [block0, block1]
    assert chain(TOKENS, 4, "t")[0] == salted0


def test_the_vllm_version_picks_the_default_and_bounds_the_choice(tmp_path: Path) -> None:
    assert default_algo(None) == "fast"
    assert default_algo("0.10.1") == "fast"  # Python's builtin hash: fast stands in
    assert default_algo("0.10.2") == "sha256"
    assert default_algo("v0.13.0rc1") == "sha256"
    assert default_algo("0.13", "xxhash_cbor") == "xxhash_cbor"
    with pytest.raises(HashAlgoError, match=r"vLLM 0\.12\.1 has none \(from 0\.13\)"):
        default_algo("0.12.1", "xxhash")
    with pytest.raises(HashAlgoError, match="not a version"):
        default_algo("main")
    source = two_requests(tmp_path)
    out = tmp_path / "r.json"
    done = cli("run", str(source), "--out", str(out), "--vllm-version", "0.11.0")
    assert done.returncode == ExitCode.OK, done.stderr
    assert json.loads(out.read_text(encoding="utf-8"))["settings"]["hash_algo"] == "sha256"
    done = cli(
        "run", str(source), "--out", str(out), "--vllm-version", "0.9.2", "--hash-algo", "xxhash"
    )
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.count("\n") == 1


def test_every_algorithm_gives_the_same_hits_and_causes() -> None:
    baseline, candidate = build_case("shuffled-tools", 0)
    for lines in (baseline, candidate):
        data = corpus(*(json.loads(line) for line in lines))
        runs = [replay(data, hash_algo=algo) for algo in HASH_ALGOS]
        figures = [[(o.cached_tokens, o.cause) for o in run.outcomes] for run in runs]
        assert all(figure == figures[0] for figure in figures)
        assert [run.hash_algo for run in runs] == list(HASH_ALGOS)


def test_results_hashed_differently_are_not_compared(tmp_path: Path) -> None:
    _, outs = results_by_setting(tmp_path, "hash-algo", ("sha256_cbor", "xxhash"))
    done = cli("compare", *outs)
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.count("\n") == 1
    assert "hash_algo differs" in done.stderr
