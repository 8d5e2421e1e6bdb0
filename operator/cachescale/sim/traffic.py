"""The request stream the simulated fleet serves: prompts built from segments, hashed as vLLM.

A prompt is an ordered list of segments (``layout``): tool definitions, a per-tenant system
prompt, retrieved document chunks, the conversation history, the user turn and a variable
field (timestamp / request id). Every segment has real token ids, generated
deterministically from the seed, and every request carries the chained block hashes of its
prompt *and* the output it will generate (:mod:`cachescale.sim.hashing`). The prefix cache
is therefore exercised by the mechanism itself, not by a hit-rate knob: a hit rate emerges
from which segments repeat, in which order, behind which salt.

That is what lets the simulator reproduce the incident in the brief. Re-chunking the
corpus (512 → 500 tokens) changes the docs' token content once and the cache heals;
re-running retrieval every turn *ahead of* the history, moving a variable field to the
top, shuffling tool definitions or sliding a history window change the prefix on almost
every request and keep the hit rate near zero. These changes are
:data:`~cachescale.sim.traffic_spec.Perturbation` models applied at their time.

What to generate — :class:`~cachescale.sim.traffic_spec.WorkloadSpec` and the
perturbation models — is declared in :mod:`cachescale.sim.traffic_spec`, a schema the
scenario file validates against. This module is the mechanism that turns it into requests
(arrivals, sessions, token ids, hash chains), plus the infinite-cache ground truth
(:func:`ideal_hit_rate`) a stream's hit rate is checked against.

Generation is lazy (an iterator in arrival order) and hashing is the hot cost, so hash
chains are memoised by segment prefix (bounded LRU) and a session remembers the chain of
its last turn: a request hashes only the blocks after its first novel segment. After a
collapse every block is hashed, one ``sha256`` call per block.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from cachescale.sim.hashing import TOKEN_BYTES, extend_chain, hash_blocks
from cachescale.sim.request import SimRequest
from cachescale.sim.traffic_spec import (
    ChunkSizeChange,
    LayoutChange,
    LengthDist,
    Perturbation,
    RateChange,
    RetrievalAheadOfHistory,
    RetrievalMode,
    SegmentKind,
    ShuffleTools,
    SlidingWindow,
    VariableFieldToTop,
    WorkloadSpec,
)

VOCAB_SIZE = 32_000
"""Token ids are drawn from ``[0, VOCAB_SIZE)``."""


# --- Perturbations applied -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrafficState:
    """The workload's effective settings at one instant (spec + perturbations so far)."""

    layout: tuple[SegmentKind, ...]
    retrieval_mode: RetrievalMode
    chunk_size: int
    shuffle_tools: bool
    history_max_tokens: int | None
    rate_per_s: float
    applied: tuple[str, ...] = ()
    """Kinds of the perturbations applied so far, in order."""

    def after(self, p: Perturbation) -> TrafficState:
        """This state with one perturbation applied."""
        new = self._changed(p)
        return replace(new, applied=(*self.applied, p.kind))

    def _changed(self, p: Perturbation) -> TrafficState:
        match p:
            case ChunkSizeChange():
                return replace(self, chunk_size=p.chunk_size)
            case RetrievalAheadOfHistory():
                return replace(
                    self, retrieval_mode="per_request", layout=_docs_before_history(self.layout)
                )
            case VariableFieldToTop():
                rest = tuple(k for k in self.layout if k != "variable")
                return replace(self, layout=("variable", *rest))
            case ShuffleTools():
                return replace(self, shuffle_tools=True)
            case SlidingWindow():
                return replace(self, history_max_tokens=p.history_max_tokens)
            case RateChange():
                return replace(self, rate_per_s=p.rate_per_s)
            case LayoutChange():
                return replace(self, layout=p.layout)


def _docs_before_history(layout: tuple[SegmentKind, ...]) -> tuple[SegmentKind, ...]:
    """Move (or insert) ``docs`` right before ``history`` (before ``user`` if no history)."""
    if "history" in layout and "docs" in layout and layout.index("docs") < layout.index("history"):
        return layout
    rest: list[SegmentKind] = [k for k in layout if k != "docs"]
    anchor: SegmentKind = "history" if "history" in rest else "user"
    rest.insert(rest.index(anchor), "docs")
    return tuple(rest)


# --- Generation ------------------------------------------------------------------------

# An atom is one hashing unit: (identity, token bytes, shareable across requests). Two
# atoms with the same identity always carry the same bytes.
_Atom = tuple[Hashable, bytes, bool]

_BATCH = 8192
_TOKEN_BATCH = 1 << 20


class _Draws:
    """Batched draws from one seeded numpy Generator (per-call cost: an index bump)."""

    def __init__(self, seed_seq: np.random.SeedSequence) -> None:
        self._rng = np.random.default_rng(seed_seq)
        self._u: list[float] = []
        self._ui = 0
        self._z: list[float] = []
        self._zi = 0
        self._e: list[float] = []
        self._ei = 0
        self._tok = b""
        self._ti = 0

    def uniform(self) -> float:
        if self._ui == len(self._u):
            self._u, self._ui = self._rng.random(_BATCH).tolist(), 0
        self._ui += 1
        return self._u[self._ui - 1]

    def normal(self) -> float:
        if self._zi == len(self._z):
            self._z, self._zi = self._rng.standard_normal(_BATCH).tolist(), 0
        self._zi += 1
        return self._z[self._zi - 1]

    def exponential(self) -> float:
        if self._ei == len(self._e):
            self._e, self._ei = self._rng.standard_exponential(_BATCH).tolist(), 0
        self._ei += 1
        return self._e[self._ei - 1]

    def tokens(self, n: int) -> bytes:
        """``n`` fresh token ids as int32 bytes."""
        width = n * TOKEN_BYTES
        if self._ti + width > len(self._tok):
            size = max(_TOKEN_BATCH, n)
            self._tok = self._rng.integers(0, VOCAB_SIZE, size, dtype=np.int32).tobytes()
            self._ti = 0
        self._ti += width
        return self._tok[self._ti - width : self._ti]

    def length(self, dist: LengthDist) -> int:
        mu = math.log(dist.mean_tokens) - dist.sigma**2 / 2
        n = round(math.exp(mu + dist.sigma * self.normal()))
        return min(max(n, dist.min_tokens), dist.max_tokens)


def _fixed_tokens(seed: int, stream: int, *key: int, n: int) -> bytes:
    """Token ids that depend only on (seed, stream, key): a reusable segment's content."""
    rng = np.random.default_rng([seed, stream, *key])
    return rng.integers(0, VOCAB_SIZE, n, dtype=np.int32).tobytes()


def _cdf(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    acc = 0.0
    out = []
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0
    return out


@dataclass(slots=True, eq=False)
class _Session:
    tenant: int
    topic: int
    # Previous turns (post-history atoms + output) and their token counts, oldest first.
    turns: deque[tuple[list[_Atom], int]] = field(default_factory=deque)
    history_tokens: int = 0
    # The chunks this session retrieved (per_session mode) and the chunk size they had.
    chunks: list[tuple[int, int]] = field(default_factory=list)
    chunk_size: int = 0
    # The hash chain of the last request's whole sequence, to extend on the next turn.
    tail_keys: tuple[Hashable, ...] = ()
    tail_digests: list[bytes] = field(default_factory=list)
    tail_rest: bytes = b""


@dataclass(slots=True, eq=False)
class _Node:
    """Memoised chain state after a shareable prefix: digests so far + partial block.

    ``digests`` is a tuple: a tuple of bytes is untracked by the cyclic garbage collector,
    so the millions of digest references the memo holds are not rescanned by every
    collection (a list would be).
    """

    node_id: int
    digests: tuple[bytes, ...]
    rest: bytes


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """Counters for the generator's cost (performance reports and tests)."""

    requests: int
    """Requests generated so far."""
    blocks_hashed: int
    """sha256 calls made (one per full block hashed)."""
    memo_entries: int
    """Shareable prefixes currently memoised."""
    memo_digests: int
    """Digest references the memo holds (bounded by ``memo_max_digests``)."""


class Workload:
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
        self.spec = spec
        self.seed = seed
        self.until_s = until_s
        self._memo_on = memo
        self._memo_cap = memo_max_digests
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

        arrivals, choices, tokens = np.random.SeedSequence(seed).spawn(3)
        self._arrivals = _Draws(arrivals)
        self._choices = _Draws(choices)
        self._tokens = _Draws(tokens)
        self._tenant_cdf = _cdf([t.weight for t in spec.tenants])
        r = spec.retrieval
        self._topic_cdf = _cdf([(k + 1) ** -r.zipf_exponent for k in range(r.topics)])
        self._salts = [(t.cache_salt or "").encode() for t in spec.tenants]
        self._tools = [
            _fixed_tokens(seed, 1, i, n=spec.tools.tokens_each) for i in range(spec.tools.count)
        ]
        self._systems = [
            _fixed_tokens(seed, 2, i, n=spec.system_tokens) for i in range(len(spec.tenants))
        ]
        self._docs: dict[int, list[bytes]] = {}
        self._pools: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._topic_chunks: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._sessions: list[_Session] = []
        self._next_id = 0
        self._memo: OrderedDict[tuple[int, Hashable], _Node] = OrderedDict()
        self._memo_digests = 0
        self._next_node = 1
        self._roots = {s: _Node(-i - 1, (), b"") for i, s in enumerate(dict.fromkeys(self._salts))}
        self._blocks_hashed = 0

    # -- public -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[SimRequest]:
        return self

    def __next__(self) -> SimRequest:
        t = self._next_arrival()
        if t is None or (self.until_s is not None and t > self.until_s):
            raise StopIteration
        return self._request(t)

    def next_request(self) -> SimRequest | None:
        """The next request, or None when the stream has ended."""
        return next(self, None)

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
    def stats(self) -> WorkloadStats:
        """Generation cost so far."""
        return WorkloadStats(
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

        pre: list[_Atom] = []
        turn: list[_Atom] = []
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
        history: list[_Atom] = []
        if has_history:
            limit = state.history_max_tokens
            while limit is not None and session.history_tokens > limit:
                session.history_tokens -= session.turns.popleft()[1]
            for atoms, _ in session.turns:
                history.extend(atoms)
        n_out = draws.length(self.spec.output_tokens)
        out: _Atom = (("o", rid), draws.tokens(n_out), False)
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

    def _tool_atoms(self, shuffle: bool) -> list[_Atom]:
        order = list(range(len(self._tools)))
        if shuffle:  # Fisher-Yates on the batched uniforms
            u = self._choices.uniform
            for i in range(len(order) - 1, 0, -1):
                j = int(u() * (i + 1))
                order[i], order[j] = order[j], order[i]
        return [(("t", i), self._tools[i], True) for i in order]

    def _doc_atoms(self, session: _Session, state: TrafficState) -> list[_Atom]:
        cs = state.chunk_size
        topic = session.topic
        docs = self._topic_docs(topic)
        pool = self._pools.get((topic, cs))
        if pool is None:  # every chunk of every doc of the topic, as (doc, index)
            width = cs * TOKEN_BYTES
            pool = [(d, j) for d, doc in enumerate(docs) for j in range(-(-len(doc) // width))]
            self._pools[(topic, cs)] = pool
        k = min(self.spec.retrieval.top_k, len(pool))
        mode = state.retrieval_mode
        if mode == "per_topic":
            chosen = self._topic_chunks.get((topic, cs))
            if chosen is None:
                rng = np.random.default_rng([self.seed, 3, topic, cs])
                chosen = [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]
                self._topic_chunks[(topic, cs)] = chosen
        elif mode == "per_session" and session.chunk_size == cs:
            chosen = session.chunks
        else:
            u = self._choices.uniform
            picked: list[int] = []
            while len(picked) < k:
                i = int(u() * len(pool))
                if i not in picked:
                    picked.append(i)
            chosen = [pool[i] for i in picked]
            session.chunks, session.chunk_size = chosen, cs
        width = cs * TOKEN_BYTES
        atoms: list[_Atom] = []
        for doc, j in chosen:
            data = docs[doc][j * width : (j + 1) * width]
            atoms.append((("c", topic, doc, cs, j), data, True))
        return atoms

    def _topic_docs(self, topic: int) -> list[bytes]:
        """The topic's documents; lengths vary in [0.5, 1.5) × tokens_per_doc."""
        docs = self._docs.get(topic)
        if docs is None:
            docs = []
            for d in range(self.spec.retrieval.docs_per_topic):
                rng = np.random.default_rng([self.seed, 4, topic, d])
                n = max(1, int(self.spec.retrieval.tokens_per_doc * rng.uniform(0.5, 1.5)))
                docs.append(rng.integers(0, VOCAB_SIZE, n, dtype=np.int32).tobytes())
            self._docs[topic] = docs
        return docs

    # -- sessions -----------------------------------------------------------------------

    def _session(self) -> _Session:
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
        session = _Session(tenant=tenant, topic=topic)
        if len(slots) < spec.concurrent:
            slots.append(session)
        else:
            slots[int(u() * len(slots))] = session
        return session

    # -- hashing ------------------------------------------------------------------------

    def _hash_all(self, atoms: list[_Atom], salt: bytes) -> list[bytes]:
        digests = hash_blocks(b"".join(a[1] for a in atoms), self.spec.block_size, salt)
        self._blocks_hashed += len(digests)
        return digests

    def _hash(self, atoms: list[_Atom], salt: bytes, session: _Session) -> list[bytes]:
        """Chain digests, reusing the session's last chain or the longest memoised prefix."""
        bs = self.spec.block_size
        keys = tuple([a[0] for a in atoms])
        n_tail = len(session.tail_keys)
        i = 0
        if n_tail and keys[:n_tail] == session.tail_keys:
            digests = list(session.tail_digests)
            rest = session.tail_rest
            i = n_tail
        else:
            memo = self._memo
            node = self._roots[salt]
            while i < len(atoms) and atoms[i][2]:
                child = memo.get((node.node_id, keys[i]))
                if child is None:
                    break
                memo.move_to_end((node.node_id, keys[i]))
                node = child
                i += 1
            digests = list(node.digests)
            rest = node.rest
            if i < len(atoms) and atoms[i][2]:
                # Memoise one more shareable atom: a prefix seen k times is memoised k
                # atoms deep, so popular prefixes are soon fully memoised while a prefix
                # that never repeats (after a collapse) costs one entry, not one per atom.
                before = len(digests)
                rest = extend_chain(digests, rest, atoms[i][1], bs, salt)
                self._blocks_hashed += len(digests) - before
                memo[(node.node_id, keys[i])] = _Node(self._next_node, tuple(digests), rest)
                self._next_node += 1
                self._memo_digests += len(digests)
                i += 1
                while self._memo_digests > self._memo_cap:
                    self._memo_digests -= len(memo.popitem(last=False)[1].digests)
        before = len(digests)
        rest = extend_chain(digests, rest, b"".join([a[1] for a in atoms[i:]]), bs, salt)
        self._blocks_hashed += len(digests) - before
        session.tail_keys = keys
        session.tail_digests = digests
        session.tail_rest = rest
        return digests


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
