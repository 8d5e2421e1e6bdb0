"""Why a replayed request missed: what changed in its prompt, where, and the cause's name.

A request that does not extend its conversation's previous turn is compared with that
turn; any other missed request with the longest cached prompt it could have matched, and
first with any earlier prompt of the same text under another ``cache_salt``. The
comparison (``divergence.diff``) says what changed from the first token where the two
part: a reordering, a span inserted, removed or replaced, and where they rejoin; the shape
names the cause (``causes.py``), whatever the prompt's layout. New content is decided at
the run's end: reused by a later request, it heals; never reused, it is unique. The replay
(``replay.py``) supplies the cache's answers; this module holds the per-request outcome
and the words: the token and block where the change starts, the ids there, and their
decoded text when a tokenizer is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cachescale.audit.causes import cache_cause, salt_detail, turn_cause
from cachescale.audit.corpus import Record
from cachescale.audit.divergence import Change, Tokens, common_prefix, diff

#: A request "hits" (request hit share) by default when at least this fraction of its
#: prompt tokens came from the cache: it skipped almost all of its prefill
#: (``audit run --hit-fraction``).
HIT_FRACTION = 0.8
#: Tokens quoted at a divergence.
QUOTE_TOKENS = 8
#: Tokens of a changed span decoded to text, at most.
TEXT_TOKENS = 48
#: Reference prompts kept per cached chain position (the first ones to extend it).
_CANDIDATES = 8

Decode = Callable[[list[int]], str]
"""Token ids to their text (the pinned tokenizer's decoder)."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a prompt first leaves its reference, what changed there, quoted."""

    position: int
    block: int
    against: str
    """"cache" (the longest cached prompt) or "previous turn"."""
    tokens: tuple[int, ...]
    reference_tokens: tuple[int, ...]
    inserted: int = 0
    """Tokens of the prompt from ``position`` the reference does not hold there."""
    removed: int = 0
    """Tokens of the reference from ``position`` the prompt no longer holds."""
    span: str = ""
    """The change in words (``6 tokens in place of 6``), empty when the rest differs."""
    text: str | None = None
    """The prompt's changed span, decoded (with a tokenizer)."""
    reference_text: str | None = None
    """The reference's span there, decoded (with a tokenizer)."""
    detail: str | None = None
    """What explains it other than tokens (a ``cache_salt``)."""

    def describe(self) -> str:
        """``token 496, block 31: [..] 'text' where the previous turn has [..]; 6 tokens
        in place of 6``."""
        where = f"token {self.position}, block {self.block}"
        if self.detail is not None:
            return f"{where}: {self.detail}"
        quote = _quoted(self.tokens, self.text)
        if not self.reference_tokens:
            return f"{where}: {quote}, past everything the {self.against} holds"
        reference = _quoted(self.reference_tokens, self.reference_text)
        span = f"; {self.span}" if self.span else ""
        return f"{where}: {quote} where the {self.against} has {reference}{span}"


def _quoted(tokens: tuple[int, ...], text: str | None) -> str:
    return f"{list(tokens)}" if text is None else f"{list(tokens)} {text!r}"


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
    hit_fraction: float = HIT_FRACTION

    @property
    def recomputed_tokens(self) -> int:
        """Prompt tokens the engine had to prefill."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit(self) -> bool:
        """True when the request skipped almost all of its prefill."""
        return self.cached_tokens >= self.hit_fraction * self.prompt_tokens


class References:
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


@dataclass(frozen=True, slots=True)
class Context:
    """What explaining a request reads besides the request: the requests replayed before
    it, the block size, whether the pool is bounded, and the tokenizer's decoder."""

    outcomes: list[Outcome]
    block_size: int
    bounded: bool
    decode: Decode | None = None


def extends(tokens: Tokens, previous: Tokens) -> bool:
    """True when a prompt starts with the whole of ``previous`` (its conversation's
    previous turn): the history is append-only there."""
    n = len(previous)
    return len(tokens) >= n and bool((tokens[:n] == previous).all())


def _words(change: Change, against: str) -> str:
    if change.reordered:
        return f"{change.inserted} tokens reordered"
    if not change.rejoins:
        return ""
    if change.inserted == 0:
        return f"{change.removed} tokens of the {against} dropped, the rest kept"
    if change.removed == 0:
        return f"{change.inserted} tokens inserted ahead of the rest of the {against}"
    return f"{change.inserted} tokens in place of {change.removed}, then the same again"


def quote(tokens: Tokens, ref: Tokens, change: Change, against: str, ctx: Context) -> Divergence:
    """The change from ``ref`` to ``tokens`` quoted: where, the ids, the words, the text."""
    position, decode = change.position, ctx.decode

    def text(ids: Tokens, count: int) -> str | None:
        if decode is None or count <= 0:
            return None
        return decode(ids[position : position + min(count, TEXT_TOKENS)].tolist())

    return Divergence(
        position=position,
        block=position // ctx.block_size,
        against=against,
        tokens=tuple(tokens[position : position + QUOTE_TOKENS].tolist()),
        reference_tokens=tuple(ref[position : position + QUOTE_TOKENS].tolist()),
        inserted=change.inserted,
        removed=change.removed,
        span=_words(change, against),
        text=text(tokens, change.inserted),
        reference_text=text(ref, change.removed),
    )


def _salted(outcome: Outcome, ctx: Context, start: int, same_start: list[int]) -> bool:
    """Name ``cache-salt`` when an earlier prompt under another salt holds at least one more
    block of this prompt's tokens than the cache gave it."""
    record = outcome.record
    for index in same_start:
        other = ctx.outcomes[index].record
        if other.cache_salt == record.cache_salt:
            continue
        shared = common_prefix(record.tokens, other.tokens)
        if shared >= start + ctx.block_size:
            detail = salt_detail(record.cache_salt, record.tenant, other.cache_salt, other.tenant)
            outcome.divergence = Divergence(
                position=0,
                block=0,
                against="cache",
                tokens=tuple(record.tokens[:QUOTE_TOKENS].tolist()),
                reference_tokens=tuple(other.tokens[:QUOTE_TOKENS].tolist()),
                detail=f"{detail}; the same first {shared} tokens are cached under it",
            )
            outcome.cause = "cache-salt"
            return True
    return False


def explain(
    outcome: Outcome,
    ctx: Context,
    prev: int | None,
    start: int,
    candidates: list[int],
    same_start: list[int],
) -> None:
    """Find what changed in a request's prompt and name the cause (or leave the block
    that holds its new content, decided after the run: reused later or not).

    ``start`` is how many leading tokens the cache is known to hold for this prompt,
    ``candidates`` the outcomes of cached prompts that share them and go on past them, and
    ``same_start`` earlier prompts whose first block holds the same tokens, any salt.
    """
    tokens, block_size = outcome.record.tokens, ctx.block_size
    if prev is not None:
        ref = ctx.outcomes[prev].record.tokens
        if not extends(tokens, ref):
            change = diff(tokens, ref, 0, block_size)
            outcome.divergence = quote(tokens, ref, change, "previous turn", ctx)
            outcome.cause = turn_cause(change)
            return
    if _salted(outcome, ctx, start, same_start):
        return
    best, best_ref = start, None
    for index in candidates:
        ref = ctx.outcomes[index].record.tokens
        position = common_prefix(tokens, ref, start)
        if best_ref is None or position > best:
            best, best_ref = position, ref
    if best >= len(tokens):
        return  # all of it is cached: only the engine's last-token cap recomputes
    if best_ref is None:
        change = Change(best, len(tokens) - best, 0, False, 0)
        outcome.divergence = quote(tokens, tokens[:0], change, "cache", ctx)
    else:
        change = diff(tokens, best_ref, best, block_size)
        outcome.divergence = quote(tokens, best_ref, change, "cache", ctx)
        if ctx.bounded and best >= start + block_size:
            outcome.cause = "evicted"
            return
        outcome.cause = cache_cause(change, block_size)
        if outcome.cause is not None:
            return
    new = start // block_size
    if new < len(outcome.chain):
        outcome.new_block = outcome.chain[new]
    else:
        outcome.cause = "unique"  # only a partial last block is new
