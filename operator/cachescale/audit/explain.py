"""Why a replayed request missed: where its prompt first diverges, and the cause's name.

A missed request is compared at token level with its conversation's previous turn (when
it does not extend it), otherwise with the longest cached prompt it could have matched,
and the first divergence is classified (``replay.CAUSES``): at the top, a reordering, a
history that is not append-only, an eviction, or new content (decided at the run's end:
reused by a later request, it heals; never reused, it is unique). The replay (``replay.py``)
supplies the cache's answers; this module holds the per-request outcome and the words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cachescale.audit.corpus import Record
from cachescale.audit.divergence import Tokens, common_prefix, reordered_until

#: A request "hits" (request hit share) when at least this fraction of its prompt tokens
#: came from the cache: it skipped almost all of its prefill.
HIT_FRACTION = 0.8
#: Tokens quoted at a divergence.
QUOTE_TOKENS = 8
#: Reference prompts kept per cached chain position (the first ones to extend it).
_CANDIDATES = 8


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


def explain(
    outcome: Outcome,
    outcomes: list[Outcome],
    prev: int | None,
    start: int,
    candidates: list[int],
    block_size: int,
    bounded: bool,
) -> None:
    """Find where a missed request diverges and name the cause (or leave the block that
    holds its new content, decided after the run: reused later or not).

    ``start`` is how many leading tokens the cache is known to hold for this prompt, and
    ``candidates`` the outcomes of cached prompts that share them and go on past them.
    """
    tokens = outcome.record.tokens
    if prev is not None:
        ref = outcomes[prev].record.tokens
        position = common_prefix(tokens, ref)
        if position < len(ref):
            outcome.divergence = _quote(tokens, ref, position, block_size, "previous turn")
            outcome.cause = _shape(tokens, ref, position, block_size) or "not-append-only"
            return
    best, best_ref = start, None
    for index in candidates:
        ref = outcomes[index].record.tokens
        position = common_prefix(tokens, ref, start)
        if best_ref is None or position > best:
            best, best_ref = position, ref
    if best >= len(tokens):
        return  # all of it is cached: only the engine's last-token cap recomputes
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
    new = start // block_size
    if new < len(outcome.chain):
        outcome.new_block = outcome.chain[new]
    else:
        outcome.cause = "unique"  # only a partial last block is new
