"""One simulated vLLM V1 replica: KV block pool with prefix cache, scheduler, step clock.

The simulator must run ~230,000 requests over two simulated hours on 10-20 replicas in
well under a minute, so a loop per token, or even per decode step, is out. The engine
is event-driven, exact where the operator's signals come from and approximate only
where time alone is at stake:

* **Block pool, exact at block level for cached blocks** (vLLM ``BlockPool``). ``_cached``
  maps a block hash to its reference count (0 = free but still reusable); ``_lru`` is
  the hashes with refcount 0 in LRU order, front evicted first (kept as a lazy queue,
  see the block pool section); ``_unhashed_free`` counts free blocks without a hash
  (vLLM puts those at the front of the free queue, so they are reused before any cached
  block is evicted); ``_in_use_unhashed`` counts blocks held by running sequences that
  carry no cache entry (partial last block, decode blocks).
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
* **Scheduler** (vLLM V1 order, chunked prefill). Each step has ``max_num_batched_tokens``
  of budget: every decoding sequence takes 1, prefills already running take the rest
  FCFS, and only if budget is left are waiting requests admitted (FCFS, head-of-line:
  stop at the first that does not fit, or at ``max_num_seqs``, or if this step
  preempted). A request therefore waits in ``num_waiting`` until the prefill pipeline
  reaches it, as in vLLM. Admission allocates the blocks of the whole uncached prompt.
* **Step clock.** Steps that carry prefill are simulated one by one (one event each:
  their count is bounded by requests plus prefill tokens / budget, and step granularity
  is what a cache hit's TTFT is made of). Between prefills the engine only decodes, and
  all decoding sequences advance one token per step, so one integer counter (``_steps``)
  is enough: a sequence that started decoding at step ``D0`` with ``n`` tokens to go
  finishes at step ``D0 + n`` (a heap keyed on that). A decode-only stretch is one event
  up to the next finish, at a constant step time equal to the exact mean over the
  stretch (context grows linearly). An arrival during such a stretch cuts it at the
  next step boundary, where the new request is scheduled; after a preemption the
  stretch is one step long, so the preempted request is retried on the next step.
* **KV growth of decoding sequences** is reconciled at each event, not per token:
  the blocks held at step ``n``, ``Σ ceil((c_i + n) / block_size)``, are computed in
  O(block_size) from per-phase counters, whatever the batch size. If the pool cannot
  supply the growth even after evicting every free cached block, the most recently
  admitted running request is preempted
  (recompute; vLLM's FCFS policy preempts from the back of the running queue), and so
  on until it fits. A decode-only stretch also ends before the first step whose growth
  the pool could not supply, so preemptions land on the right step; the cached blocks
  that growth evicts are evicted at the stretch's end, i.e. slightly late.

Ground truth goes back into ``SimRequest`` (``cached_tokens`` once, at first admission;
``first_token_s``; ``finished_s``; ``num_preemptions``); cumulative counters mirror the
vLLM series the exporter publishes. No prometheus_client here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from heapq import heappop, heappush
from itertools import compress, islice, repeat, tee
from operator import is_, not_
from typing import cast

from cachescale.sim.profiles import ReplicaProfile
from cachescale.sim.request import SimRequest

# Sequence states.
_PREFILL = 0
_DECODE = 1
_GONE = 2
# What the engine is doing until its next internal event.
_IDLE = 0
_STEP = 1  # one step that carries prefill
_FLUID = 2  # a run of decode-only steps

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


class _Seq:
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
        self.state = _PREFILL
        self.c = 0  # KV tokens after step n are c + n (set when decoding starts)
        self.finish = 0  # step at which the last output token is produced


class EngineReplica:
    """One vLLM V1 replica: shared KV pool with prefix cache, FCFS scheduler, step clock.

    Drive it with ``advance_to(t)`` (returns the requests finished by ``t``) and then
    ``submit(req, t)``; read routing and metric state from the properties.
    """

    __slots__ = (
        "_alloc_step",
        "_block_size",
        "_budget",
        "_busy_done",
        "_cached",
        "_completing",
        "_d_a",
        "_d_alloc",
        "_d_n",
        "_d_phase",
        "_d_sum_c",
        "_decode_heap",
        "_evictions",
        "_free_cached",
        "_gen_tokens",
        "_hits",
        "_in_use_unhashed",
        "_lru_hashes",
        "_lru_limit",
        "_lru_marks",
        "_max_num_seqs",
        "_next_uid",
        "_now",
        "_num_blocks",
        "_preemptions",
        "_prefill",
        "_profile",
        "_prompt_tokens",
        "_queries",
        "_replica_id",
        "_running",
        "_seg_end_step",
        "_seg_end_t",
        "_seg_kind",
        "_seg_start_step",
        "_seg_step_s",
        "_seg_t0",
        "_start_s",
        "_steps",
        "_t_fixed",
        "_t_kv",
        "_t_seq",
        "_t_tok",
        "_unhashed_free",
        "_waiting",
    )

    def __init__(
        self, profile: ReplicaProfile, max_num_seqs: int, replica_id: int, start_s: float
    ) -> None:
        num_blocks = profile.num_blocks
        if num_blocks <= 0:
            raise ValueError(f"profile {profile.name!r} leaves no memory for the KV cache")
        if not 1 <= max_num_seqs <= profile.max_num_batched_tokens:
            # vLLM refuses max_num_batched_tokens < max_num_seqs as well.
            raise ValueError(
                f"max_num_seqs must be in [1, {profile.max_num_batched_tokens}], got {max_num_seqs}"
            )
        bs = profile.block_size
        self._profile = profile
        self._block_size = bs
        self._budget = profile.max_num_batched_tokens
        self._t_fixed = profile.step.t_fixed_s
        self._t_tok = profile.step.t_prefill_token_s
        self._t_seq = profile.step.t_decode_seq_s
        self._t_kv = profile.step.t_kv_token_s
        self._max_num_seqs = max_num_seqs
        self._replica_id = replica_id
        self._start_s = start_s
        self._num_blocks = num_blocks
        # Block pool.
        self._cached: dict[bytes, int | float] = {}  # refcounts; a free block's is 0.0
        self._lru_hashes: deque[bytes] = deque()
        self._lru_marks: deque[float] = deque()
        self._lru_limit = 4 * num_blocks + 1024  # compact the queue (stale entries) beyond this
        self._free_cached = 0  # valid LRU entries: free blocks that keep a hash
        self._unhashed_free = num_blocks
        self._in_use_unhashed = 0
        # Scheduler queues. Waiting entries carry the output tokens already generated
        # (non-zero for a preempted request, which vLLM resumes, not restarts).
        self._waiting: deque[tuple[SimRequest, int]] = deque()
        self._running: dict[int, _Seq] = {}  # admission order; the back is preempted first
        self._prefill: deque[_Seq] = deque()
        self._completing: list[_Seq] = []  # prefills that finish at the end of this step
        self._decode_heap: list[tuple[int, int, _Seq]] = []
        self._next_uid = 0
        # Decoding sequences in aggregate: count, Σ c // bs, per-phase counts of c % bs,
        # Σ c, blocks allocated to them, and the step the allocation covers.
        self._d_n = 0
        self._d_a = 0
        self._d_phase = [0] * bs
        self._d_sum_c = 0
        self._d_alloc = 0
        self._alloc_step = 0
        # Clock: completed steps, current time, and the segment running until the next
        # internal event.
        self._steps = 0
        self._now = start_s
        self._seg_kind = _IDLE
        self._seg_t0 = start_s
        self._seg_end_t = math.inf
        self._seg_start_step = 0
        self._seg_end_step = 0
        self._seg_step_s = 0.0
        # Cumulative counters.
        self._busy_done = 0.0
        self._queries = 0
        self._hits = 0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._gen_tokens = 0
        self._evictions = 0

    # --- driving ------------------------------------------------------------------

    def advance_to(self, t: float) -> list[SimRequest]:
        """Run the engine up to time ``t``; return the requests that finished in (prev, t]."""
        if t < self._now:
            raise ValueError(f"time runs forward: advance_to({t}) after {self._now}")
        done: list[SimRequest] = []
        while self._seg_end_t <= t:
            end = self._seg_end_t
            self._busy_done += end - self._seg_t0
            self._now = end
            self._end_segment(done)
        self._now = t
        return done

    def submit(self, req: SimRequest, t: float) -> None:
        """Queue a request arriving at ``t``; call ``advance_to(t)`` first."""
        if t != self._now:
            raise ValueError(
                f"call advance_to({t}) before submit(req, {t}); engine is at {self._now}"
            )
        bs = self._block_size
        kv_tokens = req.prompt_tokens + req.output_tokens - 1
        if req.prompt_tokens < 1 or req.output_tokens < 1:
            raise ValueError(f"request {req.request_id}: prompt and output need >= 1 token")
        if -(-kv_tokens // bs) > self._num_blocks:
            raise ValueError(
                f"request {req.request_id} needs {-(-kv_tokens // bs)} KV blocks; "
                f"the pool has {self._num_blocks}"
            )
        if len(req.block_hashes) < kv_tokens // bs:
            raise ValueError(
                f"request {req.request_id} carries {len(req.block_hashes)} block hashes, "
                f"needs {kv_tokens // bs}"
            )
        req.replica = self._replica_id
        was_empty = not self._waiting
        self._waiting.append((req, 0))
        if self._seg_kind == _IDLE:
            self._start_step([], block_admission=False)
        elif self._seg_kind == _FLUID and was_empty and len(self._running) < self._max_num_seqs:
            self._cut_fluid()

    def drain(self) -> list[SimRequest]:
        """Run until nothing is queued or running; return the requests that finished."""
        done: list[SimRequest] = []
        while self._seg_kind != _IDLE:
            done.extend(self.advance_to(self._seg_end_t))
        return done

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
    def profile(self) -> ReplicaProfile:
        """The replica's engine profile."""
        return self._profile

    @property
    def replica_id(self) -> int:
        """The id written into ``SimRequest.replica``."""
        return self._replica_id

    @property
    def start_s(self) -> float:
        """When the replica started (its cache was empty then)."""
        return self._start_s

    @property
    def max_num_seqs(self) -> int:
        """The ``--max-num-seqs`` the replica runs with."""
        return self._max_num_seqs

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._block_size

    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool."""
        return self._num_blocks

    @property
    def num_waiting(self) -> int:
        """Requests queued, preempted ones included (``vllm:num_requests_waiting``)."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Requests prefilling or decoding (``vllm:num_requests_running``)."""
        return len(self._running)

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
    def num_preemptions_total(self) -> int:
        """Preemption events (a request preempted twice counts twice)."""
        return self._preemptions

    @property
    def prompt_tokens_total(self) -> int:
        """Prompt tokens, counted once per request when its first token is produced."""
        return self._prompt_tokens

    @property
    def generation_tokens_total(self) -> int:
        """Output tokens produced (updated at each internal event)."""
        return self._gen_tokens

    @property
    def evictions_total(self) -> int:
        """Cached blocks evicted from the LRU front to make room."""
        return self._evictions

    @property
    def busy_seconds(self) -> float:
        """Seconds the engine spent running steps, up to the last ``advance_to``."""
        if self._seg_kind == _IDLE:
            return self._busy_done
        return self._busy_done + (self._now - self._seg_t0)

    # --- segments -----------------------------------------------------------------

    def _end_segment(self, done: list[SimRequest]) -> None:
        """Apply the effects of the segment ending now, then schedule the next one."""
        k = self._seg_end_step
        block_admission = False
        if self._seg_kind == _FLUID:
            self._gen_tokens += self._d_n * (k - self._steps)
            self._steps = k
            block_admission = self._reconcile(k, done)
        else:
            self._gen_tokens += self._d_n
            self._steps = k
            for seq in self._completing:
                self._start_decoding(seq)
            self._completing.clear()
        heap = self._decode_heap
        while heap and heap[0][0] <= k:
            seq = heappop(heap)[2]
            if seq.state == _DECODE:
                self._finish(seq, done)
        self._start_step(done, block_admission)

    def _start_step(self, done: list[SimRequest], block_admission: bool) -> None:
        """Schedule the next step at ``_now`` (vLLM order) and set the next event."""
        k = self._steps + 1
        if self._reconcile(k, done):
            block_admission = True
        budget = self._budget - self._d_n
        prefill_tokens = 0
        prefill = self._prefill
        completing = self._completing
        while prefill and budget > 0:
            seq = prefill[0]
            take = seq.remaining if seq.remaining < budget else budget
            seq.remaining -= take
            budget -= take
            prefill_tokens += take
            if seq.remaining:
                break
            completing.append(prefill.popleft())
        if not block_admission:
            waiting = self._waiting
            running = self._running
            while budget > 0 and waiting and len(running) < self._max_num_seqs:
                req, generated = waiting[0]
                new = self._admit(req, generated)
                if new is None:
                    break
                waiting.popleft()
                take = new.remaining if new.remaining < budget else budget
                new.remaining -= take
                budget -= take
                prefill_tokens += take
                if new.remaining:
                    prefill.append(new)
                else:
                    completing.append(new)
        now = self._now
        self._seg_t0 = now
        n = self._d_n
        if prefill_tokens:
            self._seg_kind = _STEP
            self._seg_end_step = k
            self._seg_end_t = now + (
                self._t_fixed
                + self._t_tok * prefill_tokens
                + self._t_seq * n
                + self._t_kv * (self._d_sum_c + n * k)
            )
        elif n:
            heap = self._decode_heap
            while heap[0][2].state != _DECODE:
                heappop(heap)
            last = self._fluid_end(k, heap[0][0])
            if block_admission and self._waiting:
                last = k  # vLLM retries the preempted request on the very next step
            steps = last - self._steps
            step_s = (
                self._t_fixed
                + self._t_seq * n
                + self._t_kv * (self._d_sum_c + n * (self._steps + (steps + 1) / 2))
            )
            self._seg_kind = _FLUID
            self._seg_start_step = self._steps
            self._seg_end_step = last
            self._seg_step_s = step_s
            self._seg_end_t = now + steps * step_s
        else:
            self._seg_kind = _IDLE
            self._seg_end_t = math.inf

    def _fluid_end(self, k: int, next_finish: int) -> int:
        """Last step of a decode-only run from step ``k``: the next finish, or earlier.

        Each decoding sequence needs one more block every ``block_size`` steps. The run
        stops before the first step whose growth the pool could not supply even by
        evicting every free cached block, so preemption happens on the right step.
        """
        d = self._d_n
        bs = self._block_size
        slack = self._unhashed_free + self._free_cached  # _d_alloc == need(k) here
        cycles = slack // d
        base = k + cycles * bs  # need(base) = need(k) + cycles·d: one block each per cycle
        if base >= next_finish:
            return next_finish
        need_base = self._d_alloc + cycles * d
        spare = slack - cycles * d  # < d, so some step within one more cycle overflows
        j = 1
        while self._decode_need(base + j) - need_base <= spare:
            j += 1
        return min(next_finish, base + j - 1)

    def _cut_fluid(self) -> None:
        """End the decode-only run at the step boundary after ``_now`` (an arrival)."""
        position = self._seg_start_step + (self._now - self._seg_t0) / self._seg_step_s
        boundary = math.floor(position) + 1
        if boundary < self._seg_end_step:
            self._seg_end_step = boundary
            end = self._seg_t0 + (boundary - self._seg_start_step) * self._seg_step_s
            self._seg_end_t = max(end, self._now)

    # --- decoding sequences in aggregate ------------------------------------------

    def _decode_need(self, n: int) -> int:
        """Blocks all decoding sequences hold at step ``n``: ``Σ ceil((c_i + n) / bs)``."""
        d = self._d_n
        if not d:
            return 0
        bs = self._block_size
        m, y = divmod(n, bs)
        # ceil((bs·a + x + bs·m + y) / bs) = a + m + [x + y >= 1] + [x + y >= bs + 1]
        need = self._d_a + d * m + d
        if y == 0:
            need -= self._d_phase[0]
        elif y >= 2:
            need += sum(self._d_phase[bs + 1 - y :])
        return need

    def _start_decoding(self, seq: _Seq) -> None:
        """A prefill finished at step ``_steps``: emit its token and start decoding."""
        k = self._steps
        bs = self._block_size
        c = seq.tokens - k
        seq.c = c
        a, x = divmod(c, bs)
        self._d_n += 1
        self._d_a += a
        self._d_phase[x] += 1
        self._d_sum_c += c
        self._d_alloc += -(-seq.tokens // bs)  # already held since admission
        self._gen_tokens += 1
        req = seq.req
        if req.first_token_s is None:
            req.first_token_s = self._now
            self._prompt_tokens += req.prompt_tokens
        seq.finish = k + req.output_tokens - (seq.generated + 1)
        seq.state = _DECODE
        heappush(self._decode_heap, (seq.finish, seq.uid, seq))

    def _stop_decoding(self, seq: _Seq) -> int:
        """Take a decoding sequence out of the aggregate; return the blocks it holds."""
        bs = self._block_size
        c = seq.c
        a, x = divmod(c, bs)
        self._d_n -= 1
        self._d_a -= a
        self._d_phase[x] -= 1
        self._d_sum_c -= c
        blocks = -(-(c + self._alloc_step) // bs)
        self._d_alloc -= blocks
        seq.state = _GONE
        return blocks

    def _reconcile(self, n: int, done: list[SimRequest]) -> bool:
        """Give decoding sequences their blocks for step ``n``, preempting if needed.

        Returns whether a request was preempted (vLLM then admits nothing this step).
        """
        need = self._decode_need(n)
        preempted = False
        while need - self._d_alloc > self._unhashed_free + self._free_cached:
            victim = next(reversed(self._running.values()))
            if victim.state == _DECODE and victim.finish <= self._steps:
                self._finish(victim, done)  # it produced its last token already
            else:
                self._preempt(victim)
                preempted = True
            need = self._decode_need(n)
        grow = need - self._d_alloc
        if grow > 0:
            self._take_blocks(grow)
            self._in_use_unhashed += grow
        self._d_alloc = need
        self._alloc_step = n
        return preempted

    # --- block pool -----------------------------------------------------------------
    #
    # The LRU free queue is lazy. Freeing blocks appends (hash, mark) pairs to two
    # parallel deques and stores ``mark`` as the blocks' refcount in ``_cached``: a
    # ``0.0`` made for this freeing (falsy and equal to 0 like any free block's refcount,
    # but a distinct object). An entry is valid while ``_cached[hash] is mark``. Touching
    # a block (refcount 1) or freeing it again (a new mark at the back) leaves its old
    # entry stale in place instead of unlinking it, and eviction skips stale entries as
    # it pops the front. The valid entries are exactly vLLM's free queue, in the same
    # order: the deques only save an ordered dict's per-block insert, unlink and node
    # allocation, and a stale entry costs one skipped pop.

    @property
    def _lru(self) -> list[bytes]:
        """The free cached blocks, LRU front (next evicted) first."""
        get = self._cached.get
        return [
            h for h, mark in zip(self._lru_hashes, self._lru_marks, strict=True) if get(h) is mark
        ]

    def _take_blocks(self, n: int) -> None:
        """Take ``n`` free blocks: unhashed ones first, then evict from the LRU front."""
        free = self._unhashed_free
        if n <= free:
            self._unhashed_free = free - n
            return
        self._unhashed_free = 0
        n -= free
        # Pop the front, skipping stale entries, until n valid ones are gone (islice stops
        # right after the n-th: nothing behind it is popped).
        cached = self._cached
        front, probe = tee(iter(self._lru_hashes.popleft, None))
        marks = iter(self._lru_marks.popleft, None)
        valid = compress(front, map(is_, map(cached.get, probe), marks))
        _consume(map(cached.__delitem__, islice(valid, n)))
        self._free_cached -= n
        self._evictions += n

    def _to_lru(self, freed: list[bytes]) -> None:
        """Put newly free blocks at the LRU back, in order, under one fresh mark."""
        n = len(freed)
        if not n:
            return
        mark = _free_mark()  # a new object: no live entry carries it yet
        self._cached.update(zip(freed, repeat(mark)))
        hashes = self._lru_hashes
        hashes.extend(freed)
        self._lru_marks.extend(repeat(mark, n))
        self._free_cached += n
        if len(hashes) > self._lru_limit:
            self._compact_lru()

    def _compact_lru(self) -> None:
        """Drop the stale entries of the LRU queue (the valid ones keep their order)."""
        hashes, marks = self._lru_hashes, self._lru_marks
        valid = list(map(is_, map(self._cached.get, hashes), marks))
        self._lru_hashes = deque(compress(hashes, valid))
        self._lru_marks = deque(compress(marks, valid))

    def _admit(self, req: SimRequest, generated: int) -> _Seq | None:
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
        self._free_cached -= touched_free
        self._take_blocks(new_blocks)
        self._in_use_unhashed += partial
        if req.cached_tokens is None:  # recorded once, at first admission (vLLM >= 0.27)
            req.cached_tokens = hits * bs
            self._queries += tokens
            self._hits += hits * bs
        seq = _Seq(req, self._next_uid, tokens, generated, full, tokens - hits * bs)
        self._next_uid += 1
        self._running[seq.uid] = seq
        return seq

    def _release(self, seq: _Seq, blocks: int, kv_tokens: int) -> None:
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
            if refs.count(1) == held:  # nobody else holds them: all go to the LRU
                self._to_lru(rev)
            else:
                refs = list(map(_dec, refs))
                cached.update(zip(rev, refs, strict=True))
                self._to_lru(list(compress(rev, map(not_, refs))))

    # --- request lifecycle ------------------------------------------------------------

    def _finish(self, seq: _Seq, done: list[SimRequest]) -> None:
        """A decoding sequence produced its last token: free it and report it."""
        del self._running[seq.uid]
        blocks = self._stop_decoding(seq)
        self._release(seq, blocks, seq.c + seq.finish)
        req = seq.req
        req.finished_s = self._now
        done.append(req)

    def _preempt(self, seq: _Seq) -> None:
        """Preempt (recompute) a running sequence; it goes back to the waiting front."""
        del self._running[seq.uid]
        if seq.state == _DECODE:
            blocks = self._stop_decoding(seq)
            kv_tokens = seq.c + self._steps
            generated = seq.generated + 1 + self._steps - (seq.tokens - seq.c)
        else:
            self._prefill.remove(seq)
            seq.state = _GONE
            blocks = -(-seq.tokens // self._block_size)
            kv_tokens = seq.tokens - seq.remaining
            generated = seq.generated
        self._release(seq, blocks, kv_tokens)
        seq.req.num_preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft((seq.req, generated))
