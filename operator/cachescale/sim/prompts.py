"""The content of a prompt's segments and the chained block hashes of a request.

A prompt is an ordered list of segments; each is cut into *atoms*, the hashing units: a
tool definition, a tenant's system prompt, a retrieved chunk, a user turn, a variable
field, an output. An atom is ``(identity, token bytes, shareable)``: two atoms with the
same identity always carry the same bytes, so a chain of identities names a token prefix.
Shareable content (tools, system prompts, the corpus' chunks) is fixed by the seed and
what it is (:func:`~cachescale.sim.draws.fixed_tokens`); chunks are cut from a topic's
documents at the chunk size in force, so re-chunking changes their tokens.

Hashing is the hot cost of generation, so hash chains are memoised by shareable prefix
(a bounded LRU of chain states) and a session remembers the chain of its last turn: a
request hashes only the blocks after its first novel atom. After a collapse every block
is hashed, one ``sha256`` call per block. ``memo=False`` hashes every request's whole
sequence from scratch — the reference the memoised path must match.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from cachescale.sim.draws import VOCAB_SIZE, Draws, fixed_tokens
from cachescale.sim.hashing import TOKEN_BYTES, extend_chain, hash_blocks
from cachescale.sim.traffic_spec import TrafficState, WorkloadSpec

Atom = tuple[Hashable, bytes, bool]
"""One hashing unit: (identity, token bytes, shareable across requests)."""


@dataclass(slots=True, eq=False)
class Session:
    """One conversation: its tenant and topic, its turns so far, its retrieval, its chain."""

    tenant: int
    topic: int
    # Previous turns (post-history atoms + output) and their token counts, oldest first.
    turns: deque[tuple[list[Atom], int]] = field(default_factory=deque)
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


class PromptBuilder:
    """Segment content, retrieval and memoised hashing for one seeded request stream.

    Subclassed by the stream (:class:`~cachescale.sim.traffic.Traffic`), which assembles
    each request from these atoms in its layout's order: a base class rather than a member,
    so the per-request calls reach it without one more indirection.
    """

    def __init__(
        self,
        spec: WorkloadSpec,
        seed: int,
        *,
        choices: Draws,
        tokens: Draws,
        memo: bool,
        memo_max_digests: int,
    ) -> None:
        self.spec = spec
        self.seed = seed
        self._memo_on = memo
        self._memo_cap = memo_max_digests
        self._choices = choices
        self._tokens = tokens
        self._salts = [(t.cache_salt or "").encode() for t in spec.tenants]
        self._tools = [
            fixed_tokens(seed, 1, i, n=spec.tools.tokens_each) for i in range(spec.tools.count)
        ]
        self._systems = [
            fixed_tokens(seed, 2, i, n=spec.system_tokens) for i in range(len(spec.tenants))
        ]
        self._docs: dict[int, list[bytes]] = {}
        self._pools: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._topic_chunks: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._memo: OrderedDict[tuple[int, Hashable], _Node] = OrderedDict()
        self._memo_digests = 0
        self._next_node = 1
        self._roots = {s: _Node(-i - 1, (), b"") for i, s in enumerate(dict.fromkeys(self._salts))}
        self._blocks_hashed = 0

    # -- segments -----------------------------------------------------------------------

    def _tool_atoms(self, shuffle: bool) -> list[Atom]:
        order = list(range(len(self._tools)))
        if shuffle:  # Fisher-Yates on the batched uniforms
            u = self._choices.uniform
            for i in range(len(order) - 1, 0, -1):
                j = int(u() * (i + 1))
                order[i], order[j] = order[j], order[i]
        return [(("t", i), self._tools[i], True) for i in order]

    def _doc_atoms(self, session: Session, state: TrafficState) -> list[Atom]:
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
        atoms: list[Atom] = []
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

    # -- hashing ------------------------------------------------------------------------

    def _hash_all(self, atoms: list[Atom], salt: bytes) -> list[bytes]:
        digests = hash_blocks(b"".join(a[1] for a in atoms), self.spec.block_size, salt)
        self._blocks_hashed += len(digests)
        return digests

    def _hash(self, atoms: list[Atom], salt: bytes, session: Session) -> list[bytes]:
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
