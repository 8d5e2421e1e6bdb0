"""Replay a corpus through an engine's prefix cache and explain every request's misses.

The cache is the simulator's own vLLM engine (``audit/engines.py``): prompts are named by
their chained block hashes (``audit/hashing.py``: full blocks only, ``cache_salt`` in
block 0, the ``--hash-algo`` chosen) and served one at a time, so the audit and the
simulator can never disagree about what hits. With ``engine="sglang"`` it is SGLang's
radix cache instead (page size 1: the longest common token prefix hits); the block hashes
are still computed, to say where prompts part (``compare``) and which new content later
requests reused.

Two passes, as in the incident team's CI: warm-up, then audit. A static corpus replayed
twice would hit in full the second time by construction, so the passes are the corpus's
conversations split in two (the first ones, in order of appearance, warm the cache; the
rest are audited against it). Each missed request, and each request that lost the reuse
of its conversation's previous turn (a hit or not), is then compared at token level with
that turn or with the longest cached prompt it could have matched, and what changed names
the cause (``audit/explain.py``, ``audit/causes.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cachescale.audit.corpus import Corpus, CorpusError, Record
from cachescale.audit.engines import Lookup, SglangCache, VllmCache
from cachescale.audit.explain import (
    HIT_FRACTION,
    Context,
    Decode,
    Outcome,
    References,
    explain,
    extends,
)
from cachescale.audit.hashing import chain_hasher
from cachescale.sim.profiles import usable_blocks

#: Why ``--engine sglang`` takes none of ``--kv-blocks``, ``--hash-algo``, ``--vllm-version``.
SGLANG_FLAGS = (
    "--engine sglang is SGLang's unbounded radix cache: --kv-blocks, --hash-algo and "
    "--vllm-version are vLLM's settings"
)
#: Salts kept per first block, to find the same tokens cached under another salt.
_SALTS_KEPT = 8
_WARMUP = "warmup"
_AUDIT = "audit"


@dataclass(frozen=True, slots=True)
class Replay:
    """Every request's outcome, warm-up pass first, in replay order."""

    outcomes: list[Outcome]
    block_size: int
    kv_blocks: int | None
    """The engine's ``num_gpu_blocks`` (vLLM's null block included), None when unbounded."""
    warmup_conversations: int
    hash_algo: str = "fast"
    engine: str = "vllm"
    hit_fraction: float = HIT_FRACTION


def split_passes(corpus: Corpus, warmup: int | None) -> tuple[list[Record], int]:
    """The replay order (the warm-up conversations' records first, then the audited ones)
    and how many conversations warm the cache (``warmup``, default half); the offline
    replay and the live mode split alike."""
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


Serve = Callable[[int, Record, list[bytes]], Lookup]
"""Serve request ``index`` (its record, its chained block hashes) and say what hit."""


def _server(engine: str, order: list[Record], block_size: int, kv_blocks: int | None) -> Serve:
    """The engine's cache, sized for the corpus."""
    if engine == "sglang":
        radix = SglangCache()

        def serve_sglang(index: int, record: Record, hashes: list[bytes]) -> Lookup:
            return radix.serve(index, record.tokens, record.cache_salt)

        return serve_sglang
    if kv_blocks is not None:
        pool = usable_blocks(kv_blocks)
        for record in order:
            need = -(-len(record.tokens) // block_size)
            if need > pool:
                raise CorpusError(
                    f"line {record.line}: the prompt needs {need} KV blocks; "
                    f"--kv-blocks {kv_blocks} holds {pool} (vLLM keeps one as its null block)"
                )
    else:
        pool = sum(-(-len(r.tokens) // block_size) for r in order) + 1
    vllm = VllmCache(block_size, pool, max(len(r.tokens) for r in order))

    def serve_vllm(index: int, record: Record, hashes: list[bytes]) -> Lookup:
        tenant = record.tenant or ""
        return vllm.serve(index, len(record.tokens), hashes, record.cache_salt, tenant)

    return serve_vllm


def replay(
    corpus: Corpus,
    block_size: int = 16,
    kv_blocks: int | None = None,
    warmup_conversations: int | None = None,
    hash_algo: str = "fast",
    engine: str = "vllm",
    hit_fraction: float = HIT_FRACTION,
    decode: Decode | None = None,
) -> Replay:
    """Replay the corpus (warm-up pass, then audit pass) and classify every miss, and every
    request that lost the reuse of its previous turn (``decode`` quotes changes as text)."""
    if engine == "sglang" and (kv_blocks is not None or hash_algo != "fast"):
        raise ValueError(SGLANG_FLAGS)
    order, warm_count = split_passes(corpus, warmup_conversations)
    warm_ids = set(corpus.conversations[:warm_count])
    hasher = chain_hasher(hash_algo)
    chains = [hasher(r.tokens, block_size, r.cache_salt) for r in order]
    serve = _server(engine, order, block_size, kv_blocks)
    previous: dict[str, int] = {}
    outcomes: list[Outcome] = []
    ctx = Context(outcomes, block_size, kv_blocks is not None, decode)
    starts = _Starts(block_size)
    hit_blocks: set[bytes] = set()
    for index, (record, hashes) in enumerate(zip(order, chains, strict=True)):
        found = serve(index, record, hashes)
        outcome = Outcome(
            record=record,
            pass_name=_WARMUP if record.conversation_id in warm_ids else _AUDIT,
            prompt_tokens=len(record.tokens),
            cached_tokens=found.cached_tokens,
            chain=hashes,
            hit_fraction=hit_fraction,
        )
        hit_blocks.update(hashes[: found.cached_tokens // block_size])
        prev = previous.get(record.conversation_id)
        if not outcome.hit or _lost_reuse(outcome, outcomes, prev, block_size):
            explain(outcome, ctx, prev, found.known, found.candidates, starts.same(record))
        starts.add(index, record)
        previous[record.conversation_id] = index
        outcomes.append(outcome)
    _decide_new_content(outcomes, hit_blocks)
    return Replay(outcomes, block_size, kv_blocks, warm_count, hash_algo, engine, hit_fraction)


def _decide_new_content(outcomes: list[Outcome], hit_blocks: set[bytes]) -> None:
    """New content a later request reused heals (``boundary-shift``); else ``unique``."""
    for outcome in outcomes:
        if outcome.cause is None and outcome.new_block is not None:
            outcome.cause = "boundary-shift" if outcome.new_block in hit_blocks else "unique"


def explain_outcomes(outcomes: list[Outcome], block_size: int, decode: Decode | None) -> None:
    """Name the causes of requests whose cached tokens an engine reported (live mode): the
    same explanation as the replay's, with the cache's answers read from the outcomes (the
    leading whole blocks the engine gave; earlier prompts by their chained block hashes).
    A prompt found cached past what the engine gave was evicted by the engine's pool."""
    references, starts = References(), _Starts(block_size)
    explained: list[Outcome] = []
    ctx = Context(explained, block_size, True, decode)
    previous: dict[str, int] = {}
    hit_blocks: set[bytes] = set()
    for index, outcome in enumerate(outcomes):
        record, chain = outcome.record, outcome.chain
        salt = (record.cache_salt or "").encode()
        blocks = min(outcome.cached_tokens // block_size, len(chain))
        hit_blocks.update(chain[:blocks])
        prev = previous.get(record.conversation_id)
        if not outcome.hit or _lost_reuse(outcome, explained, prev, block_size):
            candidates = references.candidates(chain, blocks, salt)
            explain(outcome, ctx, prev, blocks * block_size, candidates, starts.same(record))
        references.add(index, len(record.tokens), chain, block_size, salt)
        starts.add(index, record)
        previous[record.conversation_id] = index
        explained.append(outcome)
    _decide_new_content(outcomes, hit_blocks)


def _lost_reuse(outcome: Outcome, outcomes: list[Outcome], prev: int | None, block: int) -> bool:
    """True when a request took a block or more less from the cache than its previous
    turn holds, because it does not extend that turn (a sliding window that still hits)."""
    if prev is None:
        return False
    previous = outcomes[prev].record.tokens
    return outcome.cached_tokens + block <= len(previous) and not extends(
        outcome.record.tokens, previous
    )


class _Starts:
    """Earlier prompts by the tokens of their first block, the first one per salt: where a
    ``cache_salt`` kept a prompt from the same tokens cached under another one."""

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self._by_start: dict[bytes, dict[str | None, int]] = {}

    def same(self, record: Record) -> list[int]:
        """Earlier prompts whose first block holds this prompt's first block's tokens."""
        known = self._by_start.get(record.tokens[: self._block_size].tobytes())
        return list(known.values()) if known else []

    def add(self, index: int, record: Record) -> None:
        """Register a prompt (the first of each salt, for the first few salts)."""
        known = self._by_start.setdefault(record.tokens[: self._block_size].tobytes(), {})
        if len(known) < _SALTS_KEPT:
            known.setdefault(record.cache_salt, index)
