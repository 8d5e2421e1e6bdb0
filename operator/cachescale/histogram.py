"""Prometheus's ``histogram_quantile`` over classic histogram buckets, in Python.

Why a module of its own, below every layer that reads a histogram: a quantile computed
from buckets must be Prometheus's very answer, special cases included, wherever it is
computed. The simulator's Prometheus (``sim.observe``) answers its quantiles from its
scraped buckets with it, and the gather layer, above the simulator, is to do the same.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from itertools import accumulate

PRECISION_TOLERANCE = 1e-12
"""Relative difference under which ``histogram_quantile`` treats adjacent buckets as equal."""


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` over classic buckets (``bucketQuantile``).

    ``buckets`` are ``(upper bound, cumulative count or rate)`` pairs in any order. The
    result interpolates linearly inside the bucket holding rank ``q × total``, from 0 in the
    lowest bucket (or returns that bucket's bound if it is ≤ 0); a rank in the ``+Inf``
    bucket returns the highest finite bound. NaN without a ``+Inf`` bucket, with fewer than
    two buckets or without observations (and for no buckets at all, where Prometheus returns
    no sample); −Inf for q < 0, +Inf for q > 1. As in Prometheus, equal bounds are merged,
    a count within 1e-12 (relative) of the one below takes its value, and a count below the
    one before it is raised to it.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda bucket: bucket[0])
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    bounds, counts = _coalesced(ordered)
    counts = _monotonic(_without_precision_errors(counts))
    if len(bounds) < 2 or counts[-1] == 0:
        return math.nan
    rank = q * counts[-1]
    b = bisect.bisect_left(counts, rank, 0, len(counts) - 1)  # first count >= rank
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, count = 0.0, counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # q = 0 and an empty lowest bucket: 0/0, NaN in Go
        return math.nan
    return start + (bounds[b] - start) * (rank / count)


def _coalesced(ordered: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Bounds and counts of sorted buckets, equal bounds merged (counts added)."""
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in ordered:
        if bounds and bounds[-1] == bound:
            counts[-1] += count
        else:
            bounds.append(bound)
            counts.append(count)
    return bounds, counts


def _without_precision_errors(counts: list[float]) -> list[float]:
    """Each count within ``PRECISION_TOLERANCE`` (relative) of the last distinct one below
    it takes that one's value (Prometheus' ``correctPrecisionErrors``)."""
    fixed = counts[:1]
    previous = counts[0]
    for count in counts[1:]:
        delta = abs(count - previous)
        if delta and count and delta / count <= PRECISION_TOLERANCE:  # x/0 is +Inf in Go
            fixed.append(previous)
        else:
            fixed.append(count)
            previous = count
    return fixed


def _monotonic(counts: list[float]) -> list[float]:
    """Cumulative counts with every decrease raised to the running maximum."""
    return list(accumulate(counts, max))
