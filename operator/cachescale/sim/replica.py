"""One simulated vLLM V1 replica: the scheduler and the step clock.

The simulator must run ~230,000 requests over two simulated hours on 10-20 replicas in
well under a minute, so a loop per token, or even per decode step, is out. The engine
is event-driven, exact where the operator's signals come from and approximate only
where time alone is at stake. It is built in three layers, each a class of its own
module: the KV block pool with its prefix cache (:mod:`cachescale.sim.block_pool`), the
sequences it holds and their KV growth (:mod:`cachescale.sim.sequences`), and here the
scheduler and the clock that drive them:

* **Scheduler** (vLLM V1 order, chunked prefill). Each step has ``max_num_batched_tokens``
  of budget: every decoding sequence takes 1, prefills already running take the rest
  FCFS, and only if budget is left are waiting requests admitted (FCFS, head-of-line:
  stop at the first that does not fit, or at ``max_num_seqs``, or if this step
  preempted). A request therefore waits in ``num_waiting`` until the prefill pipeline
  reaches it, as in vLLM. Admission allocates the blocks of the whole uncached prompt.
* **Step clock.** Steps that carry prefill are simulated one by one (one event each:
  their count is bounded by requests plus prefill tokens / budget, and step granularity
  is what a cache hit's TTFT is made of). Between prefills the engine only decodes, and
  all decoding sequences advance one token per step. A decode-only stretch is one event
  up to the next finish, at a constant step time equal to the exact mean over the
  stretch (context grows linearly). An arrival during such a stretch cuts it at the
  next step boundary, where the new request is scheduled; after a preemption the
  stretch is one step long, so the preempted request is retried on the next step.
  A decode-only stretch also ends before the first step whose KV growth the pool could
  not supply, so preemptions land on the right step; the cached blocks that growth
  evicts are evicted at the stretch's end, i.e. slightly late.

Ground truth goes back into ``SimRequest`` (``cached_tokens`` and ``scheduled_s`` once, at
first admission; ``first_token_s``; ``finished_s``; ``num_preemptions``); cumulative
counters mirror the vLLM series the exporter publishes. No prometheus_client here.
"""

from __future__ import annotations

import math
from heapq import heappop

from cachescale.sim.block_pool import DECODE
from cachescale.sim.profiles import ReplicaProfile
from cachescale.sim.request import SimRequest
from cachescale.sim.sequences import Sequences

# What the engine is doing until its next internal event.
_IDLE = 0
_STEP = 1  # one step that carries prefill
_FLUID = 2  # a run of decode-only steps


class EngineReplica(Sequences):
    """One vLLM V1 replica: shared KV pool with prefix cache, FCFS scheduler, step clock.

    Drive it with ``advance_to(t)`` (returns the requests finished by ``t``) and then
    ``submit(req, t)``; read routing and metric state from the properties.
    """

    __slots__ = (
        "_budget",
        "_busy_done",
        "_profile",
        "_replica_id",
        "_seg_end_step",
        "_seg_end_t",
        "_seg_kind",
        "_seg_start_step",
        "_seg_step_s",
        "_seg_t0",
        "_start_s",
        "_t_fixed",
        "_t_kv",
        "_t_seq",
        "_t_tok",
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
        super().__init__(bs, num_blocks, max_num_seqs, start_s)
        self._profile = profile
        self._budget = profile.max_num_batched_tokens
        self._t_fixed = profile.step.t_fixed_s
        self._t_tok = profile.step.t_prefill_token_s
        self._t_seq = profile.step.t_decode_seq_s
        self._t_kv = profile.step.t_kv_token_s
        self._replica_id = replica_id
        self._start_s = start_s
        # The segment running until the next internal event.
        self._seg_kind = _IDLE
        self._seg_t0 = start_s
        self._seg_end_t = math.inf
        self._seg_start_step = 0
        self._seg_end_step = 0
        self._seg_step_s = 0.0
        self._busy_done = 0.0

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
    def next_event_s(self) -> float:
        """When the engine's next step or decode run ends (infinity when idle): a driver
        that must react to each finish steps the engine from event to event."""
        return self._seg_end_t

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
            if seq.state == DECODE:
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
                running[new.uid] = new
                waiting.popleft()
                if req.scheduled_s is None:
                    req.scheduled_s = self._now
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
            while heap[0][2].state != DECODE:
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
