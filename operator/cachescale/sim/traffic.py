"""The request stream the simulated fleet serves: sessions and arrivals, prompts from segments.

A prompt is an ordered list of segments (``layout``): tool definitions, a per-tenant system
prompt, retrieved document chunks, the conversation history, the user turn and a variable
field (timestamp / request id). Every segment has real token ids, generated
deterministically from the seed, and every request carries the chained block hashes of its
prompt *and* the output it will generate (:mod:`cachescale.sim.hashing`). The prefix cache
is therefore exercised by the mechanism itself, not by a hit-rate knob: a hit rate emerges
from which segments repeat, in which order, behind which salt.

That is what lets the simulator reproduce a prefix-cache collapse. Re-chunking the corpus
(512 → 500 tokens) changes the docs' token content once and the cache heals; re-running
retrieval every turn *ahead of* the history, moving a variable field to the top, shuffling
tool definitions or sliding a history window change the prefix on almost every request
and keep the hit rate near zero. These changes are
:data:`~cachescale.sim.traffic_spec.Perturbation` models applied at their time.

What to generate — :class:`~cachescale.sim.traffic_spec.WorkloadSpec` and the
perturbation models — is declared in :mod:`cachescale.sim.traffic_spec`, a schema the
scenario file validates against. This module is the stream that turns it into requests:
Poisson arrivals under a piecewise-constant rate, the session each request belongs to, and
the assembly of its prompt in the layout's order; the segments' content and the memoised
hashing are :mod:`cachescale.sim.prompts`'. It also holds the infinite-cache ground truth
(:func:`ideal_hit_rate`) a stream's hit rate is checked against.

Generation is lazy (an iterator in arrival order), so a run holds only the requests in
flight.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from cachescale.sim.draws import Draws
from cachescale.sim.hashing import TOKEN_BYTES
from cachescale.sim.prompts import Atom, PromptBuilder, Session
from cachescale.sim.request import SimRequest
from cachescale.sim.traffic_spec import (
    Perturbation,
    SegmentKind,
    TrafficState,
    WorkloadSpec,
)


@dataclass(frozen=True, slots=True)
class TrafficStats:
    """Counters for the generator's cost (performance reports and tests)."""

    requests: int
    """Requests generated so far."""
    blocks_hashed: int
    """sha256 calls made (one per full block hashed)."""
    memo_entries: int
    """Shareable prefixes currently memoised."""
    memo_digests: int
    """Digest references the memo holds (bounded by ``memo_max_digests``)."""


class Traffic(PromptBuilder):
    """Lazy, deterministic stream of :class:`SimRequest` in arrival order.

    ``seed`` fixes everything (arrivals, sessions, token ids, hashes). Perturbations apply
    to requests arriving at or after their ``at_s``. ``until_s`` ends the stream (None:
    endless). ``memo=False`` hashes every request's whole sequence from scratch — the
    reference the memoised path must match. ``memo_max_digests`` bounds the prefix memo
    (total digest references held; least recently used prefixes go first).
    """

    def __init__(
        self,
        spec: WorkloadSpec,
        *,
        seed: int = 0,
        perturbations: Sequence[Perturbation] = (),
        until_s: float | None = None,
        memo: bool = True,
        memo_max_digests: int = 4_000_000,
    ) -> None:
        arrivals, choices, tokens = np.random.SeedSequence(seed).spawn(3)
        super().__init__(
            spec,
            seed,
            choices=Draws(choices),
            tokens=Draws(tokens),
            memo=memo,
            memo_max_digests=memo_max_digests,
        )
        self.until_s = until_s
        self._perturbations = sorted(perturbations, key=lambda p: p.at_s)
        self._next_p = 0
        self._base = TrafficState(
            layout=spec.layout,
            retrieval_mode=spec.retrieval.mode,
            chunk_size=spec.retrieval.chunk_size,
            shuffle_tools=spec.tools.shuffle,
            history_max_tokens=spec.sessions.history_max_tokens,
            rate_per_s=spec.rate_per_s,
        )
        self._state = self._base
        # Piecewise-constant arrival rate: spec steps, then rate perturbations (later wins).
        changes = [(s.at_s, 0, s.rate_per_s) for s in spec.rate_steps]
        changes += [(p.at_s, 1, p.rate_per_s) for p in self._perturbations if p.kind == "rate"]
        self._rate_starts = [0.0]
        self._rates = [spec.rate_per_s]
        for at_s, _, rate in sorted(changes, key=lambda c: (c[0], c[1])):
            if at_s == self._rate_starts[-1]:
                self._rates[-1] = rate
            else:
                self._rate_starts.append(at_s)
                self._rates.append(rate)
        self._rate_i = 0
        self._t = 0.0
        self._arrivals = Draws(arrivals)
        self._tenant_cdf = _cdf([t.weight for t in spec.tenants])
        r = spec.retrieval
        self._topic_cdf = _cdf([(k + 1) ** -r.zipf_exponent for k in range(r.topics)])
        self._sessions: list[Session] = []
        self._next_id = 0

    # -- public -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[SimRequest]:
        return self

    def __next__(self) -> SimRequest:
        t = self._next_arrival()
        if t is None or (self.until_s is not None and t > self.until_s):
            raise StopIteration
        return self._request(t)

    def state_at(self, t: float) -> TrafficState:
        """Effective settings for a request arriving at ``t`` (pure; for reports)."""
        state = self._base
        for p in self._perturbations:
            if p.at_s > t:
                break
            state = state.after(p)
        rate_i = bisect.bisect_right(self._rate_starts, t) - 1
        return replace(state, rate_per_s=self._rates[rate_i])

    def layout_at(self, t: float) -> tuple[SegmentKind, ...]:
        """The segment order for a request arriving at ``t``."""
        return self.state_at(t).layout

    @property
    def stats(self) -> TrafficStats:
        """Generation cost so far."""
        return TrafficStats(
            requests=self._next_id,
            blocks_hashed=self._blocks_hashed,
            memo_entries=len(self._memo),
            memo_digests=self._memo_digests,
        )

    # -- arrivals -----------------------------------------------------------------------

    def _next_arrival(self) -> float | None:
        """Next Poisson arrival under a piecewise-constant rate (exact inversion)."""
        work = self._arrivals.exponential()
        t = self._t
        while True:
            i = self._rate_i
            rate = self._rates[i]
            end = self._rate_starts[i + 1] if i + 1 < len(self._rates) else math.inf
            if rate > 0:
                if t + work / rate < end:
                    self._t = t + work / rate
                    return self._t
                work -= (end - t) * rate
            elif end == math.inf:
                return None
            t = end
            self._rate_i += 1

    # -- prompt assembly ----------------------------------------------------------------

    def _request(self, t: float) -> SimRequest:
        while self._next_p < len(self._perturbations):
            p = self._perturbations[self._next_p]
            if p.at_s > t:
                break
            self._state = self._state.after(p)
            self._next_p += 1
        state = self._state
        rid = self._next_id
        self._next_id += 1
        session = self._session()
        draws = self._tokens

        pre: list[Atom] = []
        turn: list[Atom] = []
        into = pre
        for kind in state.layout:
            if kind == "history":
                into = turn
            elif kind == "tools":
                into.extend(self._tool_atoms(state.shuffle_tools))
            elif kind == "system":
                tenant = session.tenant
                into.append((("s", tenant), self._systems[tenant], True))
            elif kind == "docs":
                into.extend(self._doc_atoms(session, state))
            elif kind == "user":
                n = draws.length(self.spec.user_tokens)
                into.append((("u", rid), draws.tokens(n), False))
            else:  # variable
                into.append((("v", rid), draws.tokens(self.spec.variable_tokens), False))

        has_history = "history" in state.layout
        history: list[Atom] = []
        if has_history:
            limit = state.history_max_tokens
            while limit is not None and session.history_tokens > limit:
                session.history_tokens -= session.turns.popleft()[1]
            for atoms, _ in session.turns:
                history.extend(atoms)
        n_out = draws.length(self.spec.output_tokens)
        out: Atom = (("o", rid), draws.tokens(n_out), False)
        atoms = [*pre, *history, *turn, out]
        prompt_bytes = sum(len(a[1]) for a in atoms) - len(out[1])

        salt = self._salts[session.tenant]
        digests = self._hash(atoms, salt, session) if self._memo_on else self._hash_all(atoms, salt)

        if has_history:
            turn.append(out)
            tokens = sum(len(a[1]) for a in turn) // TOKEN_BYTES
            session.turns.append((turn, tokens))
            session.history_tokens += tokens
        return SimRequest(
            request_id=rid,
            arrival_s=t,
            tenant=self.spec.tenants[session.tenant].name,
            prefix_group=session.topic,
            prompt_tokens=prompt_bytes // TOKEN_BYTES,
            output_tokens=n_out,
            block_hashes=digests,
        )

    # -- sessions -----------------------------------------------------------------------

    def _session(self) -> Session:
        """The session this request belongs to: a follow-up or a new conversation.

        A fixed number of conversation slots makes the stream stationary: follow-ups are
        exactly a share 1 − 1/mean_turns of requests, session lengths are geometric with
        that mean, and the gap between turns stays put instead of drifting with the size
        of an unbounded pool.
        """
        u = self._choices.uniform
        slots = self._sessions
        spec = self.spec.sessions
        if slots and u() < 1.0 - 1.0 / spec.mean_turns:
            return slots[int(u() * len(slots))]
        tenant = bisect.bisect_left(self._tenant_cdf, u())
        topic = bisect.bisect_left(self._topic_cdf, u())
        session = Session(tenant=tenant, topic=topic)
        if len(slots) < spec.concurrent:
            slots.append(session)
        else:
            slots[int(u() * len(slots))] = session
        return session


# --- Ground truth ----------------------------------------------------------------------


def ideal_hit_rate(
    requests: Iterable[SimRequest],
    block_size: int = 16,
    since_s: float = -math.inf,
    until_s: float = math.inf,
) -> float:
    """Token-weighted prefix-cache hit rate of a stream if the cache were infinite.

    Requests are taken in the given order; each looks up its prompt blocks from block 0 and
    stops at the first miss (as vLLM), hits at most ``prompt_tokens - 1`` tokens (vLLM
    always recomputes the last prompt token), then adds all its blocks — prompt and output
    — to the cache. Only requests arriving in ``[since_s, until_s)`` are counted; earlier
    ones still warm the cache. Returns hit tokens / prompt tokens (0 if none counted).
    """
    seen: set[bytes] = set()
    hit = total = 0
    for r in requests:
        if since_s <= r.arrival_s < until_s:
            limit = min((r.prompt_tokens - 1) // block_size, len(r.block_hashes))
            n = 0
            hashes = r.block_hashes
            while n < limit and hashes[n] in seen:
                n += 1
            hit += n * block_size
            total += r.prompt_tokens
        seen.update(r.block_hashes)
    return hit / total if total else 0.0


def _cdf(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    acc = 0.0
    out = []
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0
    return out
