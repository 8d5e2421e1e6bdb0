"""Where two prompts part, and whether the part that differs is only a reordering.

These are the token-level questions behind every cause the audit names: the first
position at which a prompt leaves a reference (a cached prompt, or the conversation's
previous turn), and whether the region from there holds the same tokens in another order
(tool definitions or JSON keys whose order is not stable) before the two agree again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int32]

#: How far past the divergence a reordered region is looked for (tokens).
REORDER_SCAN_TOKENS = 8192
#: A reordering is at least this many tokens long (shorter is a coincidence of ids).
MIN_REORDERED_TOKENS = 4


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
