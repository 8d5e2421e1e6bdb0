"""vLLM's ``--prefix-caching-hash-algo`` choices, as chained block hashes of a prompt.

vLLM names each full block by ``hash_fn((parent_hash, tuple(block_token_ids),
extra_keys))``: block 0's parent is ``NONE_HASH`` (``hash_fn(PYTHONHASHSEED)`` when that
variable is set), and its extra keys are ``(cache_salt,)`` when the request has a salt
(``None`` otherwise, and on every later block). ``hash_fn`` is one of:

* ``sha256`` (the default): here the simulator's chain (``sim/hashing.py``): sha256 over
  the same inputs as raw bytes. Equal exactly where vLLM's are equal, so every hit is the
  same, but not byte-identical to vLLM's (which pickles the tuple), and fast;
* ``sha256_cbor``: sha256 of the tuple's canonical CBOR (``cbor2``), byte-identical to
  vLLM's digests: the language-neutral choice;
* ``xxhash``: the 128-bit XXH3 of the pickled tuple (``xxhash``), byte-identical to
  vLLM's on this interpreter. Not cryptographic: a crafted prompt can collide with another
  tenant's block (the audit warns when tenants share such a cache).

The two byte-identical algorithms root the chain at vLLM's ``NONE_HASH`` for
``PYTHONHASHSEED=`` :data:`HASH_SEED`. Which algorithm a result used is in its settings,
and ``compare`` refuses two results hashed differently.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

from cachescale.audit.divergence import Tokens
from cachescale.extras import install_hint
from cachescale.sim.hashing import hash_blocks

#: ``--hash-algo`` choices; the first is the default.
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash")
#: The ``PYTHONHASHSEED`` whose ``NONE_HASH`` roots the byte-identical chains.
HASH_SEED = "0"

ChainHasher = Callable[[Tokens, int, str | None], list[bytes]]
"""A prompt's ids, the block size and its ``cache_salt`` to its chained block hashes."""


class HashAlgoError(ValueError):
    """An algorithm whose package is missing; the message says what to install."""


def _serializer(algo: str) -> Callable[[Any], bytes]:
    """The ``hash_fn`` of a byte-identical algorithm: serialize, then digest."""
    if algo == "sha256_cbor":
        try:
            import cbor2
        except ImportError:
            raise HashAlgoError(
                f"--hash-algo sha256_cbor needs the cbor2 package: {install_hint('audit')}"
            ) from None
        dumps = cbor2.dumps
        sha256 = hashlib.sha256

        def cbor_sha256(value: Any) -> bytes:
            return sha256(dumps(value, canonical=True)).digest()

        return cbor_sha256
    try:
        import xxhash
    except ImportError:
        raise HashAlgoError(
            f"--hash-algo xxhash needs the xxhash package: {install_hint('audit')}"
        ) from None
    digest = xxhash.xxh3_128_digest
    protocol = pickle.HIGHEST_PROTOCOL

    def pickle_xxh3(value: Any) -> bytes:
        return digest(pickle.dumps(value, protocol=protocol))

    return pickle_xxh3


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
    if algo == "sha256":

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
