"""Prometheus's ``histogram_quantile`` over classic histogram buckets, in Python.

Why a module of its own, below every layer that reads a histogram: a quantile computed
from buckets must be Prometheus's very answer, special cases included, wherever it is
computed. The gather layer computes the operator's latency quantiles with it from the
bucket rates its batch reads, rather than asking Prometheus for ``histogram_quantile``
over the same rates again (docs/signals.md, "Latency"), and the simulator's Prometheus
(``sim.observe``) answers its quantiles from its scraped buckets with it.

The steps are Prometheus's ``BucketQuantile`` (``promql/quantile.go``), in its order:

1. the buckets sorted by upper bound, equal bounds merged (their counts added);
2. no ``+Inf`` bucket: no quantile;
3. the counts made non-decreasing (``ensureMonotonicAndIgnoreSmallDeltas``): a count
   that differs from the last one kept below it by less than ``SMALL_DELTA_TOLERANCE``
   (relative to their sum: float noise, not observations), or that is below it, takes
   that count's value;
4. fewer than two buckets, or no observations (the ``+Inf`` count is 0): no quantile;
5. the rank ``q × observations`` lies in the first bucket whose count reaches it: the
   ``+Inf`` bucket answers the last finite bound, a first bucket bounded at or below 0
   answers its bound, and any other bucket interpolates linearly from the bound below it
   (0 below the first) to its own.

``histogram_quantile`` returns what PromQL returns (NaN for "no quantile");
``locate_quantile`` also says which bucket the rank fell in, or why there is no quantile;
``prepare`` does steps 1–4 once for several quantiles of one histogram (``Cumulative``).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

SMALL_DELTA_TOLERANCE = 1e-12
"""Relative difference under which adjacent bucket counts are taken as equal
(Prometheus's ``smallDeltaTolerance``)."""
_MIN_NORMAL = sys.float_info.min
"""The smallest positive normal float (``almost.Equal`` compares with 0 against it)."""


class NoQuantile(Enum):
    """Why a histogram has no quantile (PromQL's ``histogram_quantile`` returns NaN)."""

    NO_INF_BUCKET = "no +Inf bucket"
    NO_FINITE_BUCKET = "no finite bucket"
    NO_OBSERVATIONS = "no observations"


@dataclass(frozen=True)
class BucketQuantile:
    """A quantile and the bucket its rank fell in."""

    value: float
    lower: float
    """The bucket's lower edge: the bound below it (0 below the first bound)."""
    upper: float
    """The bucket's bound; +Inf when the rank is past the last finite bucket, where
    ``value`` is that bucket's bound and the quantile is only known to exceed it."""


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """PromQL's ``histogram_quantile(q, buckets)`` for classic buckets.

    ``buckets`` are ``(upper bound, cumulative count or rate)`` pairs in any order, with
    finite counts. NaN where there is no quantile (``locate_quantile``) and for no
    buckets at all (where Prometheus returns no sample); −Inf for q < 0, +Inf for q > 1.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    located = locate_quantile(q, buckets)
    return math.nan if isinstance(located, NoQuantile) else located.value


def locate_quantile(
    q: float, buckets: Iterable[tuple[float, float]]
) -> BucketQuantile | NoQuantile:
    """The ``q``-quantile (0 ≤ q ≤ 1) of ``buckets`` (as for ``histogram_quantile``) and
    the bucket it lies in, or why there is none."""
    prepared = prepare(buckets)
    return prepared if isinstance(prepared, NoQuantile) else prepared.locate(q)


@dataclass(frozen=True, slots=True)
class Cumulative:
    """Buckets past steps 1–4: sorted and merged bounds (``+Inf`` last, at least one
    finite) and their non-decreasing counts, the last one positive; ready for any number
    of quantiles (step 5)."""

    bounds: list[float]
    counts: list[float]

    def locate(self, q: float) -> BucketQuantile:
        """The ``q``-quantile (0 ≤ q ≤ 1) and the bucket it lies in (step 5)."""
        bounds, counts = self.bounds, self.counts
        rank = q * counts[-1]
        b = bisect.bisect_left(counts, rank, 0, len(counts) - 1)  # the first count >= rank
        if b == len(bounds) - 1:
            return BucketQuantile(bounds[-2], bounds[-2], math.inf)
        start, end = (bounds[b - 1], bounds[b]) if b > 0 else (0.0, bounds[0])
        if b == 0 and end <= 0:
            return BucketQuantile(end, start, end)
        below = counts[b - 1] if b > 0 else 0.0
        return BucketQuantile(
            _interpolated(start, end, rank - below, counts[b] - below), start, end
        )


def prepare(buckets: Iterable[tuple[float, float]]) -> Cumulative | NoQuantile:
    """``buckets`` (as for ``histogram_quantile``) through steps 1–4, or why they have no
    quantile: several quantiles of one histogram sort and merge it once."""
    ordered = sorted(buckets, key=lambda bucket: bucket[0])
    if not ordered or ordered[-1][0] != math.inf:
        return NoQuantile.NO_INF_BUCKET
    bounds, counts = _coalesced(ordered)
    counts = _non_decreasing(counts)
    if len(bounds) < 2:
        return NoQuantile.NO_FINITE_BUCKET
    if counts[-1] == 0:
        return NoQuantile.NO_OBSERVATIONS
    return Cumulative(bounds, counts)


def _interpolated(start: float, end: float, rank: float, count: float) -> float:
    """Linear interpolation in ``(start, end]`` at ``rank`` of the bucket's ``count``, with
    Prometheus's float operations in its order (so the result is bit for bit its own)."""
    if count == 0:  # q = 0 over an empty lowest bucket: 0/0, NaN in Go
        return math.nan
    return start + (end - start) * (rank / count)


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


def _non_decreasing(counts: list[float]) -> list[float]:
    """Each count that is almost equal to the last count kept, or below it, takes that
    count's value (``ensureMonotonicAndIgnoreSmallDeltas``: the last count kept, not the
    last one seen, is the reference)."""
    kept = counts[0]
    fixed = [kept]
    for count in counts[1:]:
        if count < kept or _almost_equal(kept, count):
            fixed.append(kept)
        else:
            fixed.append(count)
            kept = count
    return fixed


def _almost_equal(a: float, b: float) -> bool:
    """Prometheus's ``almost.Equal(a, b, SMALL_DELTA_TOLERANCE)`` for finite numbers: the
    difference relative to their sum, or (when either is 0 or both are tiny) absolute
    against the tolerance times the smallest normal float."""
    if a == b:
        return True
    total = abs(a) + abs(b)
    difference = abs(a - b)
    if a == 0 or b == 0 or total < _MIN_NORMAL:
        return difference < SMALL_DELTA_TOLERANCE * _MIN_NORMAL
    return difference / min(total, sys.float_info.max) < SMALL_DELTA_TOLERANCE
