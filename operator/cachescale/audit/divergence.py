"""How two prompts differ, token by token: where they part, what changed, where they rejoin.

These are the token-level questions behind every cause the audit names, asked of a prompt
and a reference (its conversation's previous turn, or the longest cached prompt it could
have matched), wherever in the prompt the change sits:

* the first position at which the prompt leaves the reference (:func:`common_prefix`);
* whether the region from there holds the same tokens in another order before the two
  agree again (:func:`reordered_until`: tool definitions or JSON keys out of order);
* otherwise where the two rejoin (:func:`realign`: the first run of
  :data:`ANCHOR_TOKENS` tokens the prompt holds again from the reference, past the
  divergence), which says how many tokens were inserted and how many were removed there
  (:func:`diff`). A span replaced by another of a few tokens is a variable value; a span
  removed is dropped history; a span inserted or a long one replaced is new text ahead of
  what follows. Naming those is ``explain.py``'s work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int32]

#: How far past the divergence a reordered region or a rejoining run is looked for (tokens).
REORDER_SCAN_TOKENS = 8192
#: A reordering is at least this many tokens long (shorter is a coincidence of ids).
MIN_REORDERED_TOKENS = 4
#: Two prompts rejoin where they agree again on this many consecutive tokens.
ANCHOR_TOKENS = 16
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def common_prefix(a: Tokens, b: Tokens, start: int = 0) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, known equal up to ``start``."""
    n = min(len(a), len(b))
    if start >= n:
        return n
    differ = np.flatnonzero(a[start:n] != b[start:n])
    return start + int(differ[0]) if len(differ) else n


def reordered_until(a: Tokens, b: Tokens, start: int, agree: int) -> int | None:
    """The end of a reordered region of ``a`` and ``b`` beginning at ``start``, or None.

    The region ``[start, end)`` is reordered when both prompts hold the same multiset of
    tokens there, and afterwards agree for ``agree`` tokens (or both end). The shortest
    such region within :data:`REORDER_SCAN_TOKENS` is returned.
    """
    stop = min(len(a), len(b), start + REORDER_SCAN_TOKENS)
    left = a[start:stop].tolist()
    right = b[start:stop].tolist()
    balance: dict[int, int] = {}
    unbalanced = 0
    for offset, (x, y) in enumerate(zip(left, right, strict=True)):
        if x == y:
            continue
        for token, step in ((x, 1), (y, -1)):
            before = balance.get(token, 0)
            after = before + step
            if before == 0:
                unbalanced += 1
            elif after == 0:
                unbalanced -= 1
            balance[token] = after
        end = start + offset + 1
        if unbalanced == 0 and end - start >= MIN_REORDERED_TOKENS:
            tail = min(agree, len(a) - end, len(b) - end)
            both_end = len(a) == end and len(b) == end
            if both_end or (tail > 0 and np.array_equal(a[end : end + tail], b[end : end + tail])):
                return end
    return None


def _grams(tokens: Tokens) -> npt.NDArray[np.uint64]:
    """A hash of every run of :data:`ANCHOR_TOKENS` tokens, by its first position."""
    values = tokens.astype(np.uint64)
    count = len(values) - ANCHOR_TOKENS + 1
    grams = np.zeros(count, dtype=np.uint64)
    for offset in range(ANCHOR_TOKENS):
        grams = grams * _MULTIPLIER + values[offset : offset + count]
    return grams


def realign(a: Tokens, b: Tokens, start: int) -> tuple[int, int] | None:
    """Where ``a`` and ``b`` agree again past ``start``: positions ``i`` of ``a`` and ``j``
    of ``b`` from which :data:`ANCHOR_TOKENS` tokens are equal, the closest such pair
    (the least ``i + j``: the smallest change), within :data:`REORDER_SCAN_TOKENS` of
    ``start``; None when they never agree again."""
    left = a[start : start + REORDER_SCAN_TOKENS + ANCHOR_TOKENS]
    right = b[start : start + REORDER_SCAN_TOKENS + ANCHOR_TOKENS]
    if min(len(left), len(right)) < ANCHOR_TOKENS:
        return None
    ga, gb = _grams(left), _grams(right)
    order = np.argsort(gb, kind="stable")
    ranked = gb[order]
    slot = np.minimum(np.searchsorted(ranked, ga), len(ranked) - 1)
    found = np.flatnonzero(ranked[slot] == ga)
    if not len(found):
        return None
    first_j = order[slot[found]]
    for k in np.argsort(found + first_j, kind="stable").tolist():
        i, j = int(found[k]), int(first_j[k])
        if np.array_equal(left[i : i + ANCHOR_TOKENS], right[j : j + ANCHOR_TOKENS]):
            return start + i, start + j
    return None


@dataclass(frozen=True, slots=True)
class Change:
    """How a prompt differs from a reference from the first token where they part."""

    position: int
    """The first token where they differ."""
    inserted: int
    """Tokens of the prompt from ``position`` that the reference does not hold there."""
    removed: int
    """Tokens of the reference from ``position`` that the prompt no longer holds."""
    reordered: bool
    """The tokens there are the reference's, in another order."""
    rejoined: int
    """Tokens the two agree on again after the change (0 when they never rejoin)."""
    keeps_rest: bool = False
    """After the change, the prompt holds all the rest of the reference, to its end."""

    @property
    def rejoins(self) -> bool:
        """True when the prompt holds the reference's text again after the change."""
        return self.rejoined > 0


def diff(a: Tokens, b: Tokens, start: int, agree: int) -> Change:
    """How ``a`` differs from ``b`` (known equal up to ``start``): a reordering that agrees
    again for ``agree`` tokens, a span inserted or removed or replaced, then rejoined, or
    all of the rest replaced."""
    position = common_prefix(a, b, start)
    end = reordered_until(a, b, position, agree)
    if end is not None:
        rejoined = common_prefix(a[end:], b[end:])
        keeps = end + rejoined == len(b)
        return Change(position, end - position, end - position, True, max(rejoined, 1), keeps)
    meet = realign(a, b, position)
    if meet is None:
        return Change(position, len(a) - position, len(b) - position, False, 0)
    i, j = meet
    rejoined = common_prefix(a[i:], b[j:])
    return Change(position, i - position, j - position, False, rejoined, j + rejoined == len(b))
