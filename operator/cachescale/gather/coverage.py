"""How much of a history window Prometheus holds for an engine's series.

Why a module of its own: a rate over a window that reaches back before the first sample
divides what the samples hold by the whole window, and Prometheus says nothing about it.
With minutes of data, a rate over an hour reads a fraction of the traffic, and a cost per
request becomes as many times too large. ``cachescale init`` proposes a budget from such
figures, so before trusting them it asks when the series it measured begin and end inside
the window (``first_sample_query``), and measures only over what they cover.

The series asked about are the engine's served-requests counter under the selector, the
denominator of every per-request figure. Their first sample time is read with
``timestamp()`` at subquery steps of the window over ``STEPS`` (at least a second), so it
is exact to one step, and a window counts as covered when its first sample falls within
one step of its start. Where they end needs no query: series without a sample in
Prometheus' lookback before the window's end are not found at all (the generation
detection says so first). Pure: the query text and the reading of the answer;
``read_coverage`` sends it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from cachescale.api.spec import Engine
from cachescale.gather.engine_series import SGLANG, VLLM
from cachescale.gather.promql import duration
from cachescale.gather.selector import QueryScope, ResultSeries, Selector

if TYPE_CHECKING:
    from cachescale.gather.prometheus import PrometheusClient

STEPS = 1000
"""Subquery steps across the window: the first sample is found to within a thousandth of
it (at least a second)."""


@dataclass(frozen=True)
class Coverage:
    """Where the series begin in the window of ``window_seconds`` ending at ``at`` (Unix
    seconds; ``first`` precedes the window when Prometheus holds samples from before it)."""

    at: float
    window_seconds: float
    step_seconds: float
    first: float

    @property
    def starts_late(self) -> bool:
        """Whether the first sample comes more than a step after the window's start."""
        return self.first > self.at - self.window_seconds + self.step_seconds

    @property
    def covered_seconds(self) -> float:
        """The part of the window, ending at ``at``, that the samples reach back over: the
        whole window unless it starts late; else from the first sample, in whole seconds
        rounded up (so that sample is inside)."""
        if not self.starts_late:
            return self.window_seconds
        return float(min(math.ceil(self.at - self.first), self.window_seconds))


def step_seconds(window_seconds: float) -> float:
    """The subquery step for a window: ``window / STEPS`` rounded up to whole seconds."""
    return float(max(1, math.ceil(window_seconds / STEPS)))


def first_sample_query(engine: Engine, selector: Selector, window_seconds: float) -> str:
    """The earliest sample time of the engine's served-requests series under ``selector``
    in the window: one series, or none without samples."""
    counter = (SGLANG if engine is Engine.SGLANG else VLLM).requests
    scope = QueryScope.for_selector(selector)
    matchers = ",".join(part for part in (scope.matchers, counter.matchers) if part)
    steps = f"[{duration(window_seconds)}:{duration(step_seconds(window_seconds))}]"
    return f"min(min_over_time(timestamp({counter.metric}{{{matchers}}}){steps}))"


def coverage_from(
    series: Sequence[ResultSeries], at: datetime, window_seconds: float
) -> Coverage | None:
    """The coverage in ``first_sample_query``'s answer at ``at``; None without samples."""
    if len(series) != 1 or not math.isfinite(series[0].value):
        return None
    return Coverage(at.timestamp(), window_seconds, step_seconds(window_seconds), series[0].value)


def read_coverage(
    client: PrometheusClient,
    engine: Engine,
    selector: Selector,
    window_seconds: float,
    at: datetime,
) -> Coverage | None:
    """Ask Prometheus how much of the window ending at ``at`` it holds for the engine's
    series under ``selector`` (raises a ``PrometheusError`` when it cannot be read)."""
    series = client.query(first_sample_query(engine, selector, window_seconds), at)
    return coverage_from(series, at, window_seconds)
