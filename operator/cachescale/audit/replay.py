"""Replay a corpus through the simulator's vLLM cache and explain every request's misses.

The cache is the simulator's own: prompts are named by ``sim.hashing.hash_blocks`` (full
blocks only, chained, ``cache_salt`` in block 0) and served one at a time, one output
token each, by a ``sim.replica.EngineReplica`` whose pool holds exactly the blocks asked
for. That engine does vLLM's lookup (first miss stops it; a full hit is capped at
``num_tokens − 1``), its LRU eviction and its tail-first freeing, so the audit and the
simulator can never disagree about what hits. Unbounded (the default) means a pool as
large as every block of the corpus: nothing is evicted and only the prompts' structure
decides what hits.

Two passes, as in the incident team's CI: warm-up, then audit. A static corpus replayed
twice would hit in full the second time by construction, so the passes are the corpus's
conversations split in two (the first ones, in order of appearance, warm the cache; the
rest are audited against it). Each request is then compared at token level with the
longest cached prompt it could have matched and with its conversation's previous turn,
and the first divergence is classified (:data:`CAUSES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cachescale.audit.corpus import Corpus, CorpusError, Record
from cachescale.audit.divergence import Tokens, common_prefix, reordered_until
from cachescale.sim.hashing import hash_blocks
from cachescale.sim.profiles import GpuProfile, ModelProfile, ReplicaProfile, StepTimeModel
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest

#: A request "hits" (request hit share) when at least this fraction of its prompt tokens
#: came from the cache: it skipped almost all of its prefill.
HIT_FRACTION = 0.8

#: Cause ids, in the order reports list them, with their one-line meaning.
CAUSES: dict[str, str] = {
    "variable-top": "variable text at the top: prompts differ within their first two blocks "
    "(a timestamp or request id in the system prompt?)",
    "not-append-only": "history not append-only: a turn does not extend the previous one "
    "(retrieval re-run ahead of the history, or sliding-window truncation)",
    "unstable-ordering": "unstable ordering: the same tokens in another order "
    "(tool definitions or JSON keys in nondeterministic order)",
    "evicted": "evicted: the prefix was computed before but the bounded pool (--kv-blocks) "
    "evicted it",
    "boundary-shift": "new content that later requests reuse: a boundary shift or a cold "
    "prefix, which heals after warm-up (not a regression by itself)",
    "unique": "genuinely unique: content no other request shares",
}

#: Tokens quoted at a divergence.
QUOTE_TOKENS = 8
#: Reference prompts kept per cached chain position (the first ones to extend it).
_CANDIDATES = 8
_WARMUP = "warmup"
_AUDIT = "audit"


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a prompt first leaves its reference, quoted."""

    position: int
    block: int
    against: str
    """"cache" (the longest cached prompt) or "previous turn"."""
    tokens: tuple[int, ...]
    reference_tokens: tuple[int, ...]

    def describe(self) -> str:
        """``token 496, block 31: [..] where the previous turn has [..]``."""
        where = f"token {self.position}, block {self.block}: {list(self.tokens)}"
        if not self.reference_tokens:
            return f"{where}, past everything the {self.against} holds"
        return f"{where} where the {self.against} has {list(self.reference_tokens)}"


@dataclass(slots=True)
class Outcome:
    """One replayed request and what the audit found about it."""

    record: Record
    pass_name: str
    prompt_tokens: int
    cached_tokens: int
    chain: list[bytes] = field(repr=False)
    """The prompt's chained block hashes."""
    divergence: Divergence | None = None
    cause: str | None = None
    new_block: bytes | None = field(default=None, repr=False)
    """The first block of new content of a miss, until the run's end decides whether a
    later request reused it (``boundary-shift``: it heals) or none did (``unique``)."""

    @property
    def recomputed_tokens(self) -> int:
        """Prompt tokens the engine had to prefill."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit(self) -> bool:
        """True when the request skipped almost all of its prefill."""
        return self.cached_tokens >= HIT_FRACTION * self.prompt_tokens


@dataclass(frozen=True, slots=True)
class Replay:
    """Every request's outcome, warm-up pass first, in replay order."""

    outcomes: list[Outcome]
    block_size: int
    kv_blocks: int | None
    warmup_conversations: int


def _audit_profile(block_size: int, num_blocks: int, budget: int) -> ReplicaProfile:
    """An engine whose pool holds exactly ``num_blocks`` blocks (2 bytes of KV a token)."""
    return ReplicaProfile(
        name="audit",
        model=ModelProfile(
            name="audit",
            layers=1,
            kv_heads=1,
            head_dim=1,
            kv_dtype_bytes=1,
            weight_bytes=0,
            params=1,
        ),
        gpu=GpuProfile(
            name="audit",
            memory_bytes=num_blocks * block_size * 2,
            hbm_bytes_per_s=1.0,
            bf16_flops=1.0,
            fp8_flops=None,
        ),
        gpus_per_replica=1,
        gpu_memory_utilization=1.0,
        block_size=block_size,
        max_num_batched_tokens=budget,
        step=StepTimeModel(
            t_fixed_s=1e-3, t_prefill_token_s=1e-6, t_decode_seq_s=1e-5, t_kv_token_s=0.0
        ),
    )


def _split(corpus: Corpus, warmup: int | None) -> tuple[list[Record], int]:
    conversations = corpus.conversations
    if len(conversations) < 2:
        raise CorpusError(
            f"the corpus has {len(conversations)} conversation; the audit needs at least 2 "
            "(the first ones warm the cache, the rest are audited)"
        )
    count = len(conversations) // 2 if warmup is None else warmup
    if not 1 <= count < len(conversations):
        raise CorpusError(
            f"--warmup-conversations {count}: the corpus has {len(conversations)} "
            "conversations; at least one must warm the cache and one be audited"
        )
    warm = set(conversations[:count])
    first = [r for r in corpus.records if r.conversation_id in warm]
    return first + [r for r in corpus.records if r.conversation_id not in warm], count


class _References:
    """For each cached chain position, a few prompts that reached it: the candidates for
    the longest cached prompt a new request could have matched."""

    def __init__(self) -> None:
        self._at: dict[bytes, list[int]] = {}

    @staticmethod
    def _key(hashes: list[bytes], block: int, salt: bytes) -> bytes:
        return b"root:" + salt if block == 0 else hashes[block - 1]

    def add(
        self, index: int, length: int, hashes: list[bytes], block_size: int, salt: bytes
    ) -> None:
        """Register prompt ``index`` at every block position it reaches."""
        at = self._at
        for block in range(-(-length // block_size)):
            key = self._key(hashes, block, salt)
            known = at.get(key)
            if known is None:
                at[key] = [index]
            elif len(known) < _CANDIDATES:
                known.append(index)

    def candidates(self, hashes: list[bytes], block: int, salt: bytes) -> list[int]:
        """Prompts that share the first ``block`` blocks and go on past them."""
        return self._at.get(self._key(hashes, block, salt), [])


def _quote(tokens: Tokens, ref: Tokens, position: int, block_size: int, against: str) -> Divergence:
    return Divergence(
        position=position,
        block=position // block_size,
        against=against,
        tokens=tuple(tokens[position : position + QUOTE_TOKENS].tolist()),
        reference_tokens=tuple(ref[position : position + QUOTE_TOKENS].tolist()),
    )


def _shape(tokens: Tokens, ref: Tokens, position: int, block_size: int) -> str | None:
    """The cause a divergence's shape names by itself: at the top, or a reordering."""
    if position < 2 * block_size:
        return "variable-top"
    if reordered_until(tokens, ref, position, block_size) is not None:
        return "unstable-ordering"
    return None


def _explain(
    outcome: Outcome,
    outcomes: list[Outcome],
    prev: int | None,
    references: _References,
    hashes: list[bytes],
    cached_blocks: int,
    salt: bytes,
    block_size: int,
    bounded: bool,
) -> None:
    """Find where a missed request diverges and name the cause (or leave the block that
    holds its new content, decided after the run: reused later or not)."""
    tokens = outcome.record.tokens
    if prev is not None:
        ref = outcomes[prev].record.tokens
        position = common_prefix(tokens, ref)
        if position < len(ref):
            outcome.divergence = _quote(tokens, ref, position, block_size, "previous turn")
            outcome.cause = _shape(tokens, ref, position, block_size) or "not-append-only"
            return
    start = cached_blocks * block_size
    best, best_ref = start, None
    for index in references.candidates(hashes, cached_blocks, salt):
        ref = outcomes[index].record.tokens
        position = common_prefix(tokens, ref, start)
        if best_ref is None or position > best:
            best, best_ref = position, ref
    if best >= len(tokens):
        return  # all of it is cached: only the num_tokens - 1 cap recomputes a block
    if best_ref is None:
        outcome.divergence = _quote(tokens, tokens[:0], best, block_size, "cache")
    else:
        outcome.divergence = _quote(tokens, best_ref, best, block_size, "cache")
        if bounded and best >= start + block_size:
            outcome.cause = "evicted"
            return
        outcome.cause = _shape(tokens, best_ref, best, block_size)
        if outcome.cause is not None:
            return
    if cached_blocks < len(hashes):
        outcome.new_block = hashes[cached_blocks]
    else:
        outcome.cause = "unique"  # only a partial last block is new


def replay(
    corpus: Corpus,
    block_size: int = 16,
    kv_blocks: int | None = None,
    warmup_conversations: int | None = None,
) -> Replay:
    """Replay the corpus (warm-up pass, then audit pass) and classify every miss."""
    order, warm_count = _split(corpus, warmup_conversations)
    warm_ids = set(corpus.conversations[:warm_count])
    salts = [(r.cache_salt or "").encode() for r in order]
    chains = [
        hash_blocks(r.tokens.tobytes(), block_size, salt)
        for r, salt in zip(order, salts, strict=True)
    ]
    longest = max(len(r.tokens) for r in order)
    pool = (
        kv_blocks
        if kv_blocks is not None
        else sum(-(-len(r.tokens) // block_size) for r in order) + 1
    )
    if kv_blocks is not None:
        for record in order:
            need = -(-len(record.tokens) // block_size)
            if need > kv_blocks:
                raise CorpusError(
                    f"line {record.line}: the prompt needs {need} KV blocks; "
                    f"--kv-blocks {kv_blocks} cannot hold it"
                )
    engine = EngineReplica(_audit_profile(block_size, pool, longest), 1, 0, 0.0)
    references = _References()
    previous: dict[str, int] = {}
    outcomes: list[Outcome] = []
    hit_blocks: set[bytes] = set()
    now = 0.0
    for index, (record, salt, hashes) in enumerate(zip(order, salts, chains, strict=True)):
        tokens = record.tokens
        length = len(tokens)
        cached_blocks = engine.has_prefix(hashes)
        request = SimRequest(
            request_id=index,
            arrival_s=now,
            tenant=record.tenant or "",
            prefix_group=0,
            prompt_tokens=length,
            output_tokens=1,
            block_hashes=hashes,
        )
        engine.advance_to(now)
        engine.submit(request, now)
        finished = engine.drain()
        now = finished[-1].finished_s or now
        cached = request.cached_tokens or 0
        outcome = Outcome(
            record=record,
            pass_name=_WARMUP if record.conversation_id in warm_ids else _AUDIT,
            prompt_tokens=length,
            cached_tokens=cached,
            chain=hashes,
        )
        hit_blocks.update(hashes[: cached // block_size])
        if not outcome.hit:
            _explain(
                outcome,
                outcomes,
                previous.get(record.conversation_id),
                references,
                hashes,
                cached_blocks,
                salt,
                block_size,
                kv_blocks is not None,
            )
        references.add(index, length, hashes, block_size, salt)
        previous[record.conversation_id] = index
        outcomes.append(outcome)
    for outcome in outcomes:
        if outcome.cause is None and outcome.new_block is not None:
            outcome.cause = "boundary-shift" if outcome.new_block in hit_blocks else "unique"
    return Replay(outcomes, block_size, kv_blocks, warm_count)
