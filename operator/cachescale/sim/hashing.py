"""vLLM-style chained block hashes over token bytes: the identity of a cached KV block.

vLLM caches KV in fixed-size blocks and names each *full* block by a hash of its parent
block's hash, its own token ids and the request's extra keys (``cache_salt`` on block 0
only). Because the parent hash is an input, a block's digest fingerprints the whole prefix
up to it: change one token and every later digest changes, which is what makes a lookup
stop at the first miss. This module is that rule and nothing else, kept apart from the
request stream so it can be tested on its own and stays the single hot loop of generation.

Tokens travel as little-endian int32 bytes (``numpy.int32`` arrays' ``tobytes()``), so a
block is a fixed-width byte slice and hashing never touches Python ints. The digest is
``sha256(parent ‖ block bytes ‖ extra)`` — the same inputs as vLLM's ``hash_block_tokens``
(which pickles or CBOR-encodes the tuple instead), so the digests are not byte-identical
to a real engine's, but equality between them behaves exactly the same way.
"""

from __future__ import annotations

import hashlib

import numpy as np

#: Bytes per token id on the wire (int32).
TOKEN_BYTES = 4

#: Parent of block 0. vLLM derives it per process: ``hash_fn(PYTHONHASHSEED)`` when that
#: variable is set, 32 random bytes otherwise (``init_none_hash`` in
#: ``vllm/v1/core/kv_cache_utils.py``). A simulation must be reproducible, so it is a fixed
#: digest here — the behaviour of a fleet whose pods all set the same ``PYTHONHASHSEED``.
NONE_HASH: bytes = hashlib.sha256(b"vllm-none-hash").digest()

_sha256 = hashlib.sha256

#: Below this many blocks, slicing in the loop beats one numpy split (its fixed cost).
_SPLIT_MIN_BLOCKS = 8

_block_dtypes: dict[int, np.dtype[np.void]] = {}


def _split(buf: bytes, start: int, count: int, width: int) -> list[bytes]:
    """``count`` consecutive ``width``-byte slices of ``buf`` from ``start``, as bytes."""
    dtype = _block_dtypes.get(width)
    if dtype is None:
        dtype = _block_dtypes[width] = np.dtype((np.void, width))
    blocks: list[bytes] = np.frombuffer(buf, dtype, count, start).tolist()
    return blocks


def extend_chain(
    digests: list[bytes], tail: bytes, data: bytes, block_size: int, salt: bytes = b""
) -> bytes:
    """Append the digests of the full blocks of ``tail + data`` to ``digests``.

    ``digests`` is the chain so far (its last element is the parent of the next block;
    empty means the next block is block 0, whose parent is :data:`NONE_HASH` and whose
    extra keys carry ``salt``). ``tail`` is the partial block left over by the previous
    call. Returns the new leftover (fewer than ``block_size`` tokens): only full blocks
    are ever hashed, as in vLLM.

    This is the generator's hot loop (one ``sha256`` per block, tens of millions per
    run), so it is written for CPython: no function call per block besides the hash,
    and the blocks cut in one C call when there are many.
    """
    buf = tail + data if tail else data
    width = block_size * TOKEN_BYTES
    n = len(buf) // width
    if n == 0:
        return buf
    end = n * width
    sha256 = _sha256
    start = 0
    if digests:
        parent = digests[-1]
    else:
        parent = sha256(NONE_HASH + buf[:width] + salt).digest()
        digests.append(parent)
        start = width
        n -= 1
    append = digests.append
    if n >= _SPLIT_MIN_BLOCKS:
        for block in _split(buf, start, n, width):
            parent = sha256(parent + block).digest()
            append(parent)
    else:
        for off in range(start, end, width):
            parent = sha256(parent + buf[off : off + width]).digest()
            append(parent)
    return buf[end:]


def hash_blocks(tokens: bytes, block_size: int = 16, salt: bytes = b"") -> list[bytes]:
    """Chained digests of every full block of a whole token sequence (the reference path)."""
    digests: list[bytes] = []
    extend_chain(digests, b"", tokens, block_size, salt)
    return digests
