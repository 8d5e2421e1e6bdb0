"""vLLM's ``--prefix-caching-hash-algo`` choices, as chained block hashes of a prompt.

vLLM names each full block by ``hash_fn((parent_hash, tuple(block_token_ids),
extra_keys))`` (``hash_block_tokens``): block 0's parent is ``NONE_HASH``
(``hash_fn(PYTHONHASHSEED)`` when that variable is set, ``init_none_hash``), and its extra
keys are ``(cache_salt,)`` when the request has a salt (``None`` otherwise, and on every
later block). ``hash_fn`` is one of vLLM's (``vllm/utils/hashing.py``), each reproduced
byte for byte here:

* ``sha256``: sha256 of the pickled tuple (highest protocol): vLLM's default from 0.10.2;
* ``sha256_cbor``: sha256 of the tuple's canonical CBOR (``cbor2``): the language-neutral
  choice;
* ``xxhash``: the 128-bit XXH3 of the pickled tuple (``xxhash``), from vLLM 0.13;
* ``xxhash_cbor``: the 128-bit XXH3 of the canonical CBOR, from vLLM 0.13.

The XXH3 ones are not cryptographic: a crafted prompt can collide with another tenant's
block (the audit warns when tenants share such a cache). Beside them, ``fast`` is the
simulator's chain (``sim/hashing.py``): sha256 over the same inputs as raw bytes, equal
exactly where vLLM's are equal, so every hit is the same, but not vLLM's digests; it is the
default unless ``--vllm-version`` names a vLLM whose default the audit reproduces
(:func:`default_algo`). vLLM before 0.10.2 defaults to Python's ``hash`` (``builtin``),
salted per process, which no other process reproduces: ``fast`` stands in for it.

The byte-identical chains are rooted at vLLM's ``NONE_HASH`` for ``PYTHONHASHSEED=``
:data:`HASH_SEED`. Which algorithm a result used is in its settings, and ``compare``
refuses two results hashed differently.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import pickle
from collections.abc import Callable
from typing import Any

from cachescale.audit.divergence import Tokens
from cachescale.extras import install_hint
from cachescale.sim.hashing import hash_blocks

#: ``--hash-algo`` choices; the first is the default without ``--vllm-version``.
HASH_ALGOS = ("fast", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: vLLM's default algorithm by version, newest first: from that version on.
VLLM_DEFAULTS = (((0, 10, 2), "sha256"),)
#: The first vLLM version that offers each algorithm, where it is not every version's.
VLLM_SINCE = {"sha256": (0, 8, 3), "xxhash": (0, 13), "xxhash_cbor": (0, 13)}
#: The ``PYTHONHASHSEED`` whose ``NONE_HASH`` roots the byte-identical chains.
HASH_SEED = "0"

ChainHasher = Callable[[Tokens, int, str | None], list[bytes]]
"""A prompt's ids, the block size and its ``cache_salt`` to its chained block hashes."""


class HashAlgoError(ValueError):
    """An algorithm whose package is missing (the message says what to install), or
    that the vLLM named does not have."""


def _module(algo: str, name: str) -> Any:
    """An optional package an algorithm needs, or what to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise HashAlgoError(
            f"--hash-algo {algo} needs the {name} package: {install_hint('audit')}"
        ) from None


def _serializer(algo: str) -> Callable[[Any], bytes]:
    """The ``hash_fn`` of a byte-identical algorithm: serialize, then digest."""
    if algo.endswith("_cbor"):
        dumps = _module(algo, "cbor2").dumps

        def serialize(value: Any) -> bytes:
            return bytes(dumps(value, canonical=True))

    else:
        protocol = pickle.HIGHEST_PROTOCOL

        def serialize(value: Any) -> bytes:
            return pickle.dumps(value, protocol=protocol)

    if algo.startswith("xxhash"):
        xxh3 = _module(algo, "xxhash").xxh3_128_digest

        def digest(value: Any) -> bytes:
            return bytes(xxh3(serialize(value)))

        return digest
    sha256 = hashlib.sha256

    def sha256_digest(value: Any) -> bytes:
        return sha256(serialize(value)).digest()

    return sha256_digest


def _version(text: str) -> tuple[int, ...]:
    """``0.10.2`` (or ``v0.13``, ``0.11.0rc1``) as numbers."""
    parts = []
    for part in text.removeprefix("v").split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        parts.append(int(digits))
    if not parts:
        raise HashAlgoError(f"--vllm-version {text}: not a version such as 0.13.0")
    return tuple(parts)


def default_algo(vllm_version: str | None, algo: str | None = None) -> str:
    """The algorithm to hash with: ``algo`` when given (checked against the vLLM
    version, when one is named), else that version's default, else ``fast``."""
    if vllm_version is None:
        return algo or HASH_ALGOS[0]
    version = _version(vllm_version)
    if algo is not None:
        since = VLLM_SINCE.get(algo)
        if since is not None and version < since:
            first = ".".join(map(str, since))
            raise HashAlgoError(f"--hash-algo {algo}: vLLM {vllm_version} has none (from {first})")
        return algo
    for since_version, name in VLLM_DEFAULTS:
        if version >= since_version:
            return name
    return HASH_ALGOS[0]


def vllm_chain(
    hash_fn: Callable[[Any], bytes], root: bytes, ids: list[int], block_size: int, salt: str | None
) -> list[bytes]:
    """vLLM's chained hashes of the full blocks of ``ids`` under ``hash_fn``, from the
    chain's root ``root`` (its ``NONE_HASH``)."""
    parent = root
    extra: tuple[str, ...] | None = (salt,) if salt else None
    chain: list[bytes] = []
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash_fn((parent, tuple(ids[start : start + block_size]), extra))
        chain.append(parent)
        extra = None
    return chain


def chain_hasher(algo: str) -> ChainHasher:
    """The chain of ``--hash-algo algo`` (one of :data:`HASH_ALGOS`)."""
    if algo == "fast":

        def simulator(tokens: Tokens, block_size: int, salt: str | None) -> list[bytes]:
            return hash_blocks(tokens.tobytes(), block_size, (salt or "").encode())

        return simulator
    if algo not in HASH_ALGOS:
        raise HashAlgoError(f"--hash-algo {algo}: not one of {', '.join(HASH_ALGOS)}")
    hash_fn = _serializer(algo)
    root = hash_fn(HASH_SEED)

    def vllm(tokens: Tokens, block_size: int, salt: str | None) -> list[bytes]:
        return vllm_chain(hash_fn, root, tokens.tolist(), block_size, salt)

    return vllm
