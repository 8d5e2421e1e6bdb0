"""What a simulated Prometheus holds for each scraped pod, and what it answers over a window.

One sample per exporting pod per scrape: every counter the pod exports (cumulative, bucket
counts included, in a fixed ``CounterLayout``) and its gauges; each pod its own series.
``PodWindow.read`` answers for one pod over ``(now − w, now]`` with Prometheus' range
functions:

* **Counters**: ``rate(x[w])`` with Prometheus' ``extrapolatedRate``: the samples in the
  window (at least ``MIN_SAMPLES_FOR_RATE``), resets corrected, the increase extrapolated
  to the window's edges — or by half a sample interval where the series starts or ends
  inside the window, and never back past the counter's zero — divided by ``w``. This
  matters after a scale-out: a pod that became ready mid-window adds its share of the
  window's requests, not its current rate.
* **Gauges**: ``avg_over_time`` (one sample suffices), and ``delta()`` of waiting plus
  running (``extrapolatedRate`` for gauges: the change from the first to the last sample,
  extended to the window's edges as for a rate, no reset or zero-point handling).

How the fleet's signals are made from these is :mod:`cachescale.sim.observe`'s.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, islice, repeat
from operator import add, attrgetter, lt, mul, sub
from typing import NamedTuple

from cachescale.sim.fleet import Pod

MIN_SAMPLES_FOR_RATE = 2
"""Samples a series needs in the window for ``rate()`` to return anything (Prometheus)."""
EXTRAPOLATION_THRESHOLD = 1.1
"""``rate()`` extrapolates to a window edge only if the sample nearest to it lies within
this many average sample intervals of it; otherwise by half an interval."""


# --- what a scrape stores ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistogramColumns:
    """Where one histogram's cumulative bucket counts sit in a sample's counters."""

    bounds: tuple[float, ...]
    """Finite upper bounds; the ``+Inf`` bucket (the ``_count``) follows the last."""
    start: int

    @property
    def stop(self) -> int:
        """The position just past the ``+Inf`` bucket."""
        return self.start + len(self.bounds) + 1

    def buckets(self, counters: Sequence[float]) -> list[tuple[float, float]]:
        """``(le, value)`` for every bucket, ``+Inf`` included."""
        return list(zip((*self.bounds, math.inf), counters[self.start : self.stop], strict=True))

    def observations(self, counters: Sequence[float]) -> float:
        """The ``+Inf`` bucket: the number of observations."""
        return counters[self.stop - 1]


# Positions in a sample's counters; the three histograms' buckets follow (``CounterLayout``).
QUERIES_AT = 0
HITS_AT = 1
PREEMPTIONS_AT = 2
SUCCESS_AT = 3
PROMPT_TOKENS_AT = 4
GENERATION_TOKENS_AT = 5
COMPUTED_SUM_AT = 6
ABORTED_AT = 7
_FIRST_BUCKET_AT = 8


@dataclass(frozen=True, slots=True)
class CounterLayout:
    """The counters of a sample, fixed by the pods' histogram bucket bounds."""

    computed: HistogramColumns
    ttft: HistogramColumns
    itl: HistogramColumns

    @classmethod
    def of(cls, pod: Pod) -> CounterLayout:
        """The layout of the pod's histograms' bucket bounds."""
        series = pod.series
        computed = HistogramColumns(series.prefill_kv_computed.bounds, _FIRST_BUCKET_AT)
        ttft = HistogramColumns(series.ttft.bounds, computed.stop)
        itl = HistogramColumns(series.inter_token_latency.bounds, ttft.stop)
        return cls(computed, ttft, itl)


def _counters(pod: Pod) -> tuple[float, ...]:
    """Every counter the pod exports, in ``CounterLayout`` order (bucket counts cumulative)."""
    engine, series = pod.engine, pod.series
    return (
        engine.prefix_cache_queries_tokens,
        engine.prefix_cache_hits_tokens,
        engine.num_preemptions_total,
        series.success_total,
        engine.prompt_tokens_total,
        engine.generation_tokens_total,
        series.prefill_kv_computed.total,
        series.aborted_total,
        *accumulate(series.prefill_kv_computed.counts),
        *accumulate(series.ttft.counts),
        *accumulate(series.inter_token_latency.counts),
    )


class Gauges(NamedTuple):
    """The gauges a sample holds."""

    waiting: float
    running: float
    kv_usage: float


class Sample(NamedTuple):
    """One scrape of one pod."""

    t: float
    counters: tuple[float, ...]
    reset_offsets: tuple[float, ...]
    """Per counter, the values it had before each decrease (reset) so far, summed: what
    ``rate()`` adds back. The same tuple object from one sample to the next until a reset."""
    gauges: Gauges


_sample_time = attrgetter("t")


class PodSeries:
    """The samples a Prometheus holds for one pod, oldest first."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.samples: deque[Sample] = deque()

    def record(self, now_s: float) -> None:
        """Append one sample of the pod as it is at ``now_s``."""
        pod = self.pod
        counters = _counters(pod)
        engine = pod.engine
        gauges = Gauges(engine.num_waiting, engine.num_running, engine.kv_usage)
        if not self.samples:
            self.samples.append(Sample(now_s, counters, (0.0,) * len(counters), gauges))
            return
        previous = self.samples[-1]
        offsets = previous.reset_offsets
        if any(map(lt, counters, previous.counters)):
            offsets = tuple(
                offset + before if value < before else offset
                for offset, value, before in zip(offsets, counters, previous.counters, strict=True)
            )
        self.samples.append(Sample(now_s, counters, offsets, gauges))

    def forget_before(self, t: float) -> None:
        """Drop the samples older than ``t`` (retention)."""
        while self.samples and self.samples[0].t < t:
            self.samples.popleft()

    def in_window(self, start_s: float, end_s: float) -> list[Sample]:
        """The samples with ``start_s < t <= end_s`` (what a range selector returns)."""
        first = bisect.bisect_right(self.samples, start_s, key=_sample_time)
        last = bisect.bisect_right(self.samples, end_s, key=_sample_time)
        return list(islice(self.samples, first, last))


# --- reading one pod over a window -----------------------------------------------------------


class _Extension(NamedTuple):
    """The sampled span of a window and how far ``rate()`` extends it at each edge (s)."""

    sampled: float
    to_start: float
    to_end: float


def _extension(samples: Sequence[Sample], start_s: float, end_s: float) -> _Extension:
    """How far Prometheus' ``extrapolatedRate`` extends the first-to-last-sample change
    toward the edges of ``(start_s, end_s]`` (≥ 2 samples): to an edge when it is within
    ``EXTRAPOLATION_THRESHOLD`` average sample intervals, else half an interval."""
    first, last = samples[0], samples[-1]
    sampled = last.t - first.t
    average = sampled / (len(samples) - 1)
    to_start = first.t - start_s
    if to_start >= average * EXTRAPOLATION_THRESHOLD:
        to_start = average / 2
    to_end = end_s - last.t
    if to_end >= average * EXTRAPOLATION_THRESHOLD:
        to_end = average / 2
    return _Extension(sampled, to_start, to_end)


def _extrapolated_growth(samples: Sequence[Sample], start_s: float, end_s: float) -> float:
    """``delta(waiting) + delta(running)`` of one pod over ``(start_s, end_s]`` (≥ 2 samples).

    Prometheus' ``extrapolatedRate`` for a gauge: the change from the first to the last
    sample, extended toward the window edges as ``rate()`` is (``_extension``), without
    reset or zero-point handling.
    """
    first, last = samples[0], samples[-1]
    sampled, to_start, to_end = _extension(samples, start_s, end_s)
    change = (last.gauges.waiting + last.gauges.running) - (
        first.gauges.waiting + first.gauges.running
    )
    return change * (sampled + to_start + to_end) / sampled


def _extrapolated_rates(samples: Sequence[Sample], start_s: float, end_s: float) -> list[float]:
    """``rate()`` of every counter of one pod over ``(start_s, end_s]`` (≥ 2 samples).

    Prometheus' ``extrapolatedRate``: the reset-corrected increase from the first to the
    last sample, extended toward the window edges (``_extension``) — at the start never
    past the point where the counter would have been 0 — per window second.
    """
    first, last = samples[0], samples[-1]
    sampled, to_start, to_end = _extension(samples, start_s, end_s)
    window = end_s - start_s
    increases = list(map(sub, last.counters, first.counters))
    if last.reset_offsets is not first.reset_offsets:
        increases = list(map(add, increases, map(sub, last.reset_offsets, first.reset_offsets)))
    rates = list(map(mul, increases, repeat((sampled + to_start + to_end) / sampled / window)))
    # A counter whose zero point lies less than to_start before the first sample (one that
    # started counting recently) is extended back to that point only. The candidates are
    # found at C speed, so the loop body runs for them alone.
    zero_point_closer = map(lt, first.counters, map(mul, increases, repeat(to_start / sampled)))
    for i in compress(range(len(rates)), zero_point_closer):
        increase, value_first = increases[i], first.counters[i]
        if increase > 0 and value_first >= 0:
            to_zero = sampled * (value_first / increase)
            extend_start = min(to_start, to_zero)
            rates[i] = increase * ((sampled + extend_start + to_end) / sampled / window)
    return rates


@dataclass(frozen=True, slots=True)
class PodWindow:
    """One pod's series read over the window."""

    pod: Pod
    samples: int
    rates: list[float] | None
    """Every counter's ``rate()``; None with fewer than ``MIN_SAMPLES_FOR_RATE`` samples."""
    growth: float | None
    """``delta()`` of waiting + running; None when ``rates`` is."""
    means: Gauges
    """Every gauge's ``avg_over_time``."""

    @classmethod
    def read(cls, series: PodSeries, start_s: float, end_s: float) -> PodWindow | None:
        """None when the pod has no sample in the window (Prometheus shows no series)."""
        samples = series.in_window(start_s, end_s)
        if not samples:
            return None
        rates = growth = None
        if len(samples) >= MIN_SAMPLES_FOR_RATE:
            rates = _extrapolated_rates(samples, start_s, end_s)
            growth = _extrapolated_growth(samples, start_s, end_s)
        columns = zip(*(sample.gauges for sample in samples), strict=True)
        means = Gauges(*(sum(column) / len(samples) for column in columns))
        return cls(series.pod, len(samples), rates, growth, means)
