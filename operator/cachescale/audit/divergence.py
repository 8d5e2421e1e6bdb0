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
_MIXERS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
#: The first window :func:`realign` searches (tokens); it widens fourfold as needed.
_FIRST_WINDOW = 512


def common_prefix(a: Tokens, b: Tokens, start: int = 0) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, known equal up to ``start``."""
    n = min(len(a), len(b))
    if start >= n:
        return n
    differ = np.flatnonzero(a[start:n] != b[start:n])
    return start + int(differ[0]) if len(differ) else n


def _weights(tokens: Tokens, multiplier: np.uint64) -> npt.NDArray[np.uint64]:
    """A per-token hash whose sums (wrapping) are equal over equal multisets of tokens."""
    values = tokens.astype(np.uint64) + np.uint64(1)
    mixed: npt.NDArray[np.uint64] = (values * multiplier) ^ (values >> np.uint64(7))
    return mixed * _MULTIPLIER


def reordered_until(a: Tokens, b: Tokens, start: int, agree: int) -> int | None:
    """The end of a reordered region of ``a`` and ``b`` beginning at ``start``, or None.

    The region ``[start, end)`` is reordered when both prompts hold the same multiset of
    tokens there, and afterwards agree for ``agree`` tokens (or both end). The shortest
    such region within :data:`REORDER_SCAN_TOKENS` is returned. The multisets are
    compared by wrapping sums of two token hashes at every end at once, then exactly.
    """
    stop = min(len(a), len(b), start + REORDER_SCAN_TOKENS)
    left, right = a[start:stop], b[start:stop]
    ends = np.flatnonzero(left != right) + 1
    ends = ends[ends >= MIN_REORDERED_TOKENS]
    if not len(ends):
        return None
    for multiplier in _MIXERS:
        running = np.cumsum(_weights(left, multiplier) - _weights(right, multiplier))
        ends = ends[running[ends - 1] == 0]
        if not len(ends):
            return None
    offsets: list[int] = ends.tolist()
    for offset in offsets:
        end = start + offset
        if not np.array_equal(np.sort(left[:offset]), np.sort(right[:offset])):
            continue
        tail = min(agree, len(a) - end, len(b) - end)
        both_end = len(a) == end and len(b) == end
        if both_end or (tail > 0 and np.array_equal(a[end : end + tail], b[end : end + tail])):
            return end
    return None


def _grams(tokens: Tokens) -> npt.NDArray[np.uint64]:
    """A hash of every run of :data:`ANCHOR_TOKENS` tokens (a power of two), by its first
    position: runs of 1, 2, 4, ... tokens combined pairwise."""
    grams = tokens.astype(np.uint64)
    width = 1
    while width < ANCHOR_TOKENS:
        grams = grams[:-width] * _MULTIPLIER + (grams[width:] ^ np.uint64(width))
        width *= 2
    return grams


def _closest(left: Tokens, right: Tokens) -> tuple[int, int] | None:
    """The equal runs of :data:`ANCHOR_TOKENS` tokens of ``left`` and ``right`` with the
    least ``i + j``."""
    ga, gb = _grams(left), _grams(right)
    order = np.argsort(gb, kind="stable")
    ranked = gb[order]
    slot = np.minimum(np.searchsorted(ranked, ga), len(ranked) - 1)
    found = np.flatnonzero(ranked[slot] == ga)
    first_j = order[slot[found]]
    for k in np.argsort(found + first_j, kind="stable").tolist():
        i, j = int(found[k]), int(first_j[k])
        if np.array_equal(left[i : i + ANCHOR_TOKENS], right[j : j + ANCHOR_TOKENS]):
            return i, j
    return None


def realign(a: Tokens, b: Tokens, start: int) -> tuple[int, int] | None:
    """Where ``a`` and ``b`` agree again past ``start``: positions ``i`` of ``a`` and ``j``
    of ``b`` from which :data:`ANCHOR_TOKENS` tokens are equal, the closest such pair
    (the least ``i + j``: the smallest change), within :data:`REORDER_SCAN_TOKENS` of
    ``start``; None when they never agree again. A short window is tried first: a pair
    found there with ``i + j`` within it is the closest anywhere."""
    window = _FIRST_WINDOW
    while True:
        left = a[start : start + window + ANCHOR_TOKENS]
        right = b[start : start + window + ANCHOR_TOKENS]
        if min(len(left), len(right)) < ANCHOR_TOKENS:
            return None
        pair = _closest(left, right)
        whole = len(left) < window + ANCHOR_TOKENS and len(right) < window + ANCHOR_TOKENS
        if pair is not None and (sum(pair) <= window or whole):
            return start + pair[0], start + pair[1]
        if whole or window >= REORDER_SCAN_TOKENS:
            return None if pair is None else (start + pair[0], start + pair[1])
        window = min(4 * window, REORDER_SCAN_TOKENS)


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
