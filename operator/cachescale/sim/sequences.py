"""The sequences one simulated vLLM V1 replica holds, on its block pool.

Waiting requests, prefills in flight and decoding sequences, and what happens to them
between steps: a prefill that completes starts decoding, a decoding sequence finishes at
its last token, and a sequence the pool cannot grow is preempted. The step clock that
schedules them is :class:`~cachescale.sim.replica.EngineReplica`'s.

* **Decoding sequences are kept in aggregate.** All of them advance one token per step,
  so one integer counter (``_steps``) is enough: a sequence that started decoding at step
  ``D0`` with ``n`` tokens to go finishes at step ``D0 + n`` (a heap keyed on that).
* **KV growth of decoding sequences** is reconciled at each event, not per token:
  the blocks held at step ``n``, ``Σ ceil((c_i + n) / block_size)``, are computed in
  O(block_size) from per-phase counters, whatever the batch size. If the pool cannot
  supply the growth even after evicting every free cached block, the most recently
  admitted running request is preempted (recompute; vLLM's FCFS policy preempts from the
  back of the running queue), and so on until it fits. A preempted request goes back to
  the front of the waiting queue with the output it already produced, which vLLM resumes.

Ground truth goes back into ``SimRequest`` (``first_token_s``; ``finished_s``;
``num_preemptions``); the counters mirror the vLLM series the exporter publishes.
"""

from __future__ import annotations

from collections import deque
from heapq import heappush

from cachescale.sim.block_pool import DECODE, GONE, BlockPool, Seq
from cachescale.sim.request import SimRequest


class Sequences(BlockPool):
    """A replica's queues and running sequences on its block pool, at step ``_steps``.

    Subclassed by the engine (:class:`~cachescale.sim.replica.EngineReplica`), whose step
    clock advances ``_steps`` and ``_now`` and schedules.
    """

    __slots__ = (
        "_alloc_step",
        "_completing",
        "_d_a",
        "_d_alloc",
        "_d_n",
        "_d_phase",
        "_d_sum_c",
        "_decode_heap",
        "_gen_tokens",
        "_max_num_seqs",
        "_now",
        "_preemptions",
        "_prefill",
        "_prompt_cached",
        "_prompt_tokens",
        "_running",
        "_steps",
        "_waiting",
    )

    def __init__(self, block_size: int, num_blocks: int, max_num_seqs: int, start_s: float) -> None:
        super().__init__(block_size, num_blocks)
        self._max_num_seqs = max_num_seqs
        # Scheduler queues. Waiting entries carry the output tokens already generated
        # (non-zero for a preempted request, which vLLM resumes, not restarts).
        self._waiting: deque[tuple[SimRequest, int]] = deque()
        self._running: dict[int, Seq] = {}  # admission order; the back is preempted first
        self._prefill: deque[Seq] = deque()
        self._completing: list[Seq] = []  # prefills that finish at the end of this step
        self._decode_heap: list[tuple[int, int, Seq]] = []
        # Decoding sequences in aggregate (bs: block_size): count, Σ c // bs, per-phase
        # counts of c % bs, Σ c, blocks allocated to them, and the step the allocation covers.
        self._d_n = 0
        self._d_a = 0
        self._d_phase = [0] * block_size
        self._d_sum_c = 0
        self._d_alloc = 0
        self._alloc_step = 0
        # Completed steps and the current time (the engine's clock moves them).
        self._steps = 0
        self._now = start_s
        # Cumulative counters (the block pool keeps the prefix cache's).
        self._preemptions = 0
        self._prompt_tokens = 0
        self._prompt_cached = 0
        self._gen_tokens = 0

    # --- clients that give up -----------------------------------------------------

    def abort_waiting(self, arrived_by_s: float) -> list[SimRequest]:
        """Remove the queued requests that arrived at or before ``arrived_by_s`` and have no
        output yet (their clients gave up); return them. Checked from the queue's front,
        which holds the oldest arrivals (preempted requests that already streamed output
        are kept: their clients are reading)."""
        waiting = self._waiting
        aborted: list[SimRequest] = []
        kept: list[tuple[SimRequest, int]] = []
        while waiting and waiting[0][0].arrival_s <= arrived_by_s:
            entry = waiting.popleft()
            if entry[1]:
                kept.append(entry)
            else:
                aborted.append(entry[0])
        waiting.extendleft(reversed(kept))
        return aborted

    # --- read-only state ----------------------------------------------------------

    @property
    def max_num_seqs(self) -> int:
        """The ``--max-num-seqs`` the replica runs with."""
        return self._max_num_seqs

    @property
    def num_waiting(self) -> int:
        """Requests queued, preempted ones included (``vllm:num_requests_waiting``)."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Requests prefilling or decoding (``vllm:num_requests_running``)."""
        return len(self._running)

    @property
    def load(self) -> int:
        """Requests waiting or running: what a load-aware router compares."""
        return len(self._waiting) + len(self._running)

    @property
    def num_preemptions_total(self) -> int:
        """Preemption events (a request preempted twice counts twice)."""
        return self._preemptions

    @property
    def prompt_tokens_total(self) -> int:
        """Prompt tokens, counted once per request when its first token is produced."""
        return self._prompt_tokens

    @property
    def prompt_cached_tokens_total(self) -> int:
        """Cached prompt tokens, counted with ``prompt_tokens_total`` (at the first token)."""
        return self._prompt_cached

    @property
    def generation_tokens_total(self) -> int:
        """Output tokens produced (updated at each internal event)."""
        return self._gen_tokens

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

    def _start_decoding(self, seq: Seq) -> None:
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
            self._prompt_cached += req.cached_tokens or 0
        seq.finish = k + req.output_tokens - (seq.generated + 1)
        seq.state = DECODE
        heappush(self._decode_heap, (seq.finish, seq.uid, seq))

    def _stop_decoding(self, seq: Seq) -> int:
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
        seq.state = GONE
        return blocks

    def _reconcile(self, n: int, done: list[SimRequest]) -> bool:
        """Give decoding sequences their blocks for step ``n``, preempting if needed.

        Returns whether a request was preempted (vLLM then admits nothing this step).
        """
        need = self._decode_need(n)
        preempted = False
        while need - self._d_alloc > self._unhashed_free + self._free_cached:
            victim = next(reversed(self._running.values()))
            if victim.state == DECODE and victim.finish <= self._steps:
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

    # --- request lifecycle ------------------------------------------------------------

    def _finish(self, seq: Seq, done: list[SimRequest]) -> None:
        """A decoding sequence produced its last token: free it and report it."""
        del self._running[seq.uid]
        blocks = self._stop_decoding(seq)
        self._release(seq, blocks, seq.c + seq.finish)
        req = seq.req
        req.finished_s = self._now
        done.append(req)

    def _preempt(self, seq: Seq) -> None:
        """Preempt (recompute) a running sequence; it goes back to the waiting front."""
        del self._running[seq.uid]
        if seq.state == DECODE:
            blocks = self._stop_decoding(seq)
            kv_tokens = seq.c + self._steps
            generated = seq.generated + 1 + self._steps - (seq.tokens - seq.c)
        else:
            self._prefill.remove(seq)
            seq.state = GONE
            blocks = -(-seq.tokens // self._block_size)
            kv_tokens = seq.tokens - seq.remaining
            generated = seq.generated
        self._release(seq, blocks, kv_tokens)
        seq.req.num_preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft((seq.req, generated))
