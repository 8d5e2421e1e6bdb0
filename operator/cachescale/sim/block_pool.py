"""The KV block pool of one simulated vLLM V1 replica: prefix cache, LRU, admission, release.

Exact at block level for cached blocks, as vLLM's ``BlockPool``:

* **State.** ``_cached`` maps a block hash to its reference count (0 = free but still
  reusable); ``_lru`` is the hashes with refcount 0 in LRU order, front evicted first (kept
  as a lazy queue, see below); ``_unhashed_free`` counts free blocks without a hash (vLLM
  puts those at the front of the free queue, so they are reused before any cached block is
  evicted); ``_in_use_unhashed`` counts blocks held by running sequences that carry no
  cache entry (partial last block, decode blocks).
  Invariant: ``len(_cached) + _unhashed_free + _in_use_unhashed == num_blocks``.
* **Lookup** walks the request's block hashes from block 0 and stops at the first miss,
  capped at ``num_tokens − 1`` tokens (a full hit recomputes its last block). Hits are
  touched (refcount+1, out of the LRU); the other full prompt blocks are registered at
  admission with refcount 1 (vLLM caches a block when the step that computes it is
  scheduled; here the whole prompt is scheduled at admission). A hash that already
  exists past the first miss is referenced instead of allocated. The cached blocks of a
  chain always form a prefix of it, which lets ``has_prefix`` binary-search.
* **Freeing** (finish or preemption) releases a sequence's blocks tail first, as vLLM
  does, so the tail of a chain sits nearest the LRU front and is evicted first. Full
  blocks completed by the output get their hash on release (vLLM hashes them as decode
  fills them); the partial last block returns unhashed. Prompt blocks a preempted
  prefill never computed lose their hash.
* **The LRU free queue is lazy, one segment per freeing.** Freeing blocks appends one
  ``(hashes, mark)`` segment to ``_lru_segments`` and stores ``mark`` as the blocks'
  refcount in ``_cached``: a ``0.0`` made for this freeing (falsy and equal to 0 like any
  free block's refcount, but a distinct object). An entry is valid while
  ``_cached[hash] is mark``. Touching a block (refcount 1) or freeing it again (a new
  segment at the back) leaves its old entry stale in place instead of unlinking it, and
  puts the ``id`` of the old entry's mark in ``_stale``. Eviction consumes the front
  segment from ``_lru_pos``: a segment whose mark is not in ``_stale`` is all valid, and
  its blocks are deleted without a check; the others skip their stale entries. The valid
  entries are exactly vLLM's free queue, in the same order: the segments only save an
  ordered dict's per-block insert, unlink and node allocation. A mark leaves ``_stale``
  when its segment leaves the queue; until then the mark is alive, so its ``id`` names
  it alone.

The sequences a replica holds (:mod:`cachescale.sim.sequences`) and its scheduler and step
clock (:mod:`cachescale.sim.replica`) build on this class, each a subclass of the one
before, so the engine's inner loops reach the pool's state without indirection. A sequence
(:class:`Seq`) is one admission of a request, which this pool allocates at admission and
frees at finish or preemption.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress, filterfalse, islice, repeat
from operator import is_, not_
from typing import cast

from cachescale.sim.request import SimRequest

# Sequence states.
PREFILL = 0
DECODE = 1
GONE = 2

_ABSENT = -2  # refcount lookup default for an uncached hash
_dec = (-1).__add__
_consume = deque[object](maxlen=0).extend  # exhaust an iterator at C speed


def _free_mark() -> float:
    """The refcount of a freed cached block: ``0.0``, but a new object on every call.

    Falsy and equal to 0 like a free block's refcount, and, unlike an int, neither cached
    by the interpreter nor tracked by the garbage collector.
    """
    return float(0)


if _free_mark() is _free_mark():  # the lazy LRU queue relies on it (CPython: always)
    raise RuntimeError("this Python interns floats; the engine's LRU marks need identity")


class Seq:
    """One admission of a request: what the scheduler tracks while it runs."""

    __slots__ = ("c", "finish", "generated", "held", "remaining", "req", "state", "tokens", "uid")

    def __init__(
        self, req: SimRequest, uid: int, tokens: int, generated: int, held: int, remaining: int
    ) -> None:
        self.req = req
        self.uid = uid
        self.tokens = tokens  # tokens to prefill at this admission (prompt + output so far)
        self.generated = generated  # output tokens generated before this admission
        self.held = held  # leading block hashes this sequence holds a reference on
        self.remaining = remaining  # prefill tokens still to compute
        self.state = PREFILL
        self.c = 0  # KV tokens after step n are c + n (set when decoding starts)
        self.finish = 0  # step at which the last output token is produced


class BlockPool:
    """The KV blocks of one replica: cached (by hash, refcounted), free, and in use.

    Its counters are the ``vllm:prefix_cache_*`` series and the evictions; subclassed by
    :class:`~cachescale.sim.sequences.Sequences`.
    """

    __slots__ = (
        "_block_size",
        "_cached",
        "_evictions",
        "_free_cached",
        "_hits",
        "_in_use_unhashed",
        "_lru_entries",
        "_lru_limit",
        "_lru_pos",
        "_lru_segments",
        "_next_uid",
        "_num_blocks",
        "_queries",
        "_stale",
        "_unhashed_free",
    )

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self._block_size = block_size
        self._num_blocks = num_blocks
        self._cached: dict[bytes, int | float] = {}  # refcounts; a free block's is 0.0
        self._lru_segments: deque[tuple[list[bytes], float]] = deque()  # (hashes, mark)
        self._lru_pos = 0  # entries of the front segment already consumed
        self._lru_entries = 0  # entries from _lru_pos on, stale ones included
        self._lru_limit = 4 * num_blocks + 1024  # compact the queue (stale entries) beyond this
        self._stale: set[int] = set()  # ids of the marks of segments with stale entries
        self._free_cached = 0  # valid LRU entries: free blocks that keep a hash
        self._unhashed_free = num_blocks
        self._in_use_unhashed = 0
        self._next_uid = 0
        self._queries = 0
        self._hits = 0
        self._evictions = 0

    def has_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of a chained hash list are cached now (no LRU touch).

        A binary search, O(log n): the cached blocks of a chain always form a prefix of
        it, because a block is queued for eviction no earlier than its descendants (a
        holder of a block holds its parent, and frees tail first) and so is evicted no
        earlier than they are. The result therefore equals the first-miss walk vLLM's
        lookup does, for any list of chained hashes such as ``SimRequest.block_hashes``.
        """
        contains = self._cached.__contains__
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            if contains(hashes[mid]):
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- read-only state ----------------------------------------------------------

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._block_size

    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool."""
        return self._num_blocks

    @property
    def kv_usage(self) -> float:
        """``vllm:kv_cache_usage_perc``: ``1 − free/total``; unused cached blocks count as free."""
        return 1.0 - (self._unhashed_free + self._free_cached) / self._num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (in use or reusable)."""
        return len(self._cached)

    @property
    def prefix_cache_queries_tokens(self) -> int:
        """Prompt tokens looked up, once per request at first admission."""
        return self._queries

    @property
    def prefix_cache_hits_tokens(self) -> int:
        """Prompt tokens found in the cache, once per request at first admission."""
        return self._hits

    @property
    def evictions_total(self) -> int:
        """Cached blocks evicted from the LRU front to make room."""
        return self._evictions

    # --- allocation and release ------------------------------------------------------

    @property
    def _lru(self) -> list[bytes]:
        """The free cached blocks, LRU front (next evicted) first."""
        get = self._cached.get
        pos = self._lru_pos
        order: list[bytes] = []
        for hashes, mark in self._lru_segments:
            order += [h for h in hashes[pos:] if get(h) is mark]
            pos = 0
        return order

    def _take_blocks(self, n: int) -> None:
        """Take ``n`` free blocks: unhashed ones first, then evict from the LRU front."""
        free = self._unhashed_free
        if n <= free:
            self._unhashed_free = free - n
            return
        self._unhashed_free = 0
        n -= free
        self._free_cached -= n
        self._evictions += n
        lru = self._lru_segments
        delete = self._cached.__delitem__
        pos = self._lru_pos
        while n:
            hashes, mark = lru[0]
            left = len(hashes) - pos
            if id(mark) in self._stale:
                took, pos = self._evict_checked(hashes, mark, pos, n)
                n -= took
            elif left > n:
                _consume(map(delete, hashes[pos : pos + n]))
                pos += n
                self._lru_entries -= n
                break
            else:
                _consume(map(delete, hashes[pos:] if pos else hashes))
                n -= left
                pos = len(hashes)
            if pos == len(hashes):
                lru.popleft()
                self._stale.discard(id(mark))
                self._lru_entries -= left
                pos = 0
        self._lru_pos = pos

    def _evict_checked(self, hashes: list[bytes], mark: float, pos: int, n: int) -> tuple[int, int]:
        """Evict up to ``n`` valid entries of a segment with stale ones, from ``pos``.

        Returns how many were evicted and the position after the last one (the segment's
        end when fewer than ``n`` were valid).
        """
        cached = self._cached
        rest = islice(hashes, pos, None)
        valid = compress(range(pos, len(hashes)), map(is_, map(cached.get, rest), repeat(mark)))
        took = list(islice(valid, n))
        _consume(map(cached.__delitem__, map(hashes.__getitem__, took)))
        if len(took) < n or took[-1] + 1 == len(hashes):
            return len(took), len(hashes)
        end = took[-1] + 1
        self._lru_entries -= end - pos
        return n, end

    def _to_lru(self, freed: list[bytes]) -> None:
        """Put newly free blocks at the LRU back, in order, under one fresh mark."""
        n = len(freed)
        if not n:
            return
        mark = _free_mark()  # a new object: no live entry carries it yet
        self._cached.update(zip(freed, repeat(mark)))
        self._lru_segments.append((freed, mark))
        self._lru_entries += n
        self._free_cached += n
        if self._lru_entries > self._lru_limit:
            self._compact_lru()

    def _compact_lru(self) -> None:
        """Drop the stale entries of the LRU queue (the valid ones keep their order)."""
        get = self._cached.get
        pos = self._lru_pos
        segments: deque[tuple[list[bytes], float]] = deque()
        for hashes, mark in self._lru_segments:
            kept = [h for h in hashes[pos:] if get(h) is mark]
            pos = 0
            if kept:
                segments.append((kept, mark))
        self._lru_segments = segments
        self._lru_pos = 0
        self._lru_entries = self._free_cached
        self._stale.clear()

    def _admit(self, req: SimRequest, generated: int) -> Seq | None:
        """Look the request up in the cache and allocate its prompt; None if it does not fit."""
        bs = self._block_size
        tokens = req.prompt_tokens + generated
        full = tokens // bs
        partial = 1 if tokens - full * bs else 0
        hashes = req.block_hashes[:full]
        cached = self._cached
        # One pass: refcount of each prompt block (0 = free), _ABSENT if not cached.
        counts = list(map(cached.get, hashes, repeat(_ABSENT)))
        absent = counts.count(_ABSENT)
        hits = counts.index(_ABSENT) if absent else full  # first miss
        if hits == full and not partial and hits:
            hits -= 1  # vLLM caps a hit at num_tokens − 1: recompute the last block
        # Referenced blocks get +1; touched free blocks and new ones start at 1.
        refs = [c + 1 if c > 0 else 1 for c in counts]
        touched_free = refs.count(1) - absent
        new_blocks = absent + partial
        if new_blocks + touched_free > self._unhashed_free + self._free_cached:
            return None
        # Touch before allocating (a touched block's LRU entry goes stale), so a block this
        # request hits is never evicted by its own allocation.
        cached.update(zip(hashes, refs, strict=True))
        if touched_free:  # the marks of the touched blocks' entries (before any eviction)
            self._stale.update(map(id, filterfalse(None, counts)))
        self._free_cached -= touched_free
        self._take_blocks(new_blocks)
        self._in_use_unhashed += partial
        if req.cached_tokens is None:  # recorded once, at first admission (vLLM >= 0.27)
            req.cached_tokens = hits * bs
            self._queries += tokens
            self._hits += hits * bs
        seq = Seq(req, self._next_uid, tokens, generated, full, tokens - hits * bs)
        self._next_uid += 1
        return seq

    def _release(self, seq: Seq, blocks: int, kv_tokens: int) -> None:
        """Free a sequence's ``blocks`` tail first; full computed blocks keep a hash."""
        bs = self._block_size
        cached = self._cached
        hashes = seq.req.block_hashes
        held = seq.held
        full = min(kv_tokens // bs, blocks)
        # Everything past the held hashes was an unhashed in-use block.
        self._in_use_unhashed -= blocks - held
        self._unhashed_free += blocks - max(full, held)  # the partial tail
        if full > held:  # blocks the output completed, tail first
            rev = hashes[full - 1 : held - 1 if held else None : -1]
            counts = list(map(cached.get, rev))
            new = counts.count(None)
            if new == len(rev):
                self._to_lru(rev)
            else:
                # Another copy is cached: keep one entry (a free one is refreshed: it moves
                # to the LRU back), and this block returns unhashed.
                self._unhashed_free += len(rev) - new
                not_in_use = list(map(not_, counts))  # None (new) or 0 (free)
                self._stale.update(id(c) for c in counts if c is not None and not c)
                self._free_cached -= not_in_use.count(True) - new  # re-added just below
                self._to_lru(list(compress(rev, not_in_use)))
        if full < held:  # a preempted prefill: these blocks were never computed
            for h in reversed(hashes[full:held]):
                count = cached[h] - 1
                if count:
                    cached[h] = count
                else:
                    del cached[h]
                    self._unhashed_free += 1
            held = full
        if held:
            rev = hashes[held - 1 :: -1]
            # Held blocks are in use: int refcounts.
            refs = cast("list[int]", list(map(cached.__getitem__, rev)))
            ones = refs.count(1)
            if ones == held:  # nobody else holds them: all go to the LRU
                self._to_lru(rev)
            elif ones and max(refs[:ones]) == 1:  # a freed tail, then shared blocks
                cached.update(zip(rev[ones:], map(_dec, refs[ones:]), strict=True))
                self._to_lru(rev[:ones])
            else:
                refs = list(map(_dec, refs))
                cached.update(zip(rev, refs, strict=True))
                self._to_lru(list(compress(rev, map(not_, refs))))
