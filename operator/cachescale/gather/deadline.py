"""One evaluation's time budget for reading Prometheus, on a monotonic clock.

Why a budget and not a timeout per query: an evaluation sends a detection query, a batch
and perhaps the policy's demand query, each retried on some failures, so a timeout per
query lets one evaluation last several times as long as configured, and a message saying
"no answer within 10s" would then be false. A ``Deadline`` is started once per
evaluation; every request made for it gets only the time that remains, and a report of
it (``reached``) gives the budget and the time actually spent. The clock is passed in
(``time.monotonic`` by default) so wall-clock jumps cannot stretch or cut it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    """A budget of ``budget_seconds`` that started at ``started`` on ``clock``."""

    budget_seconds: float
    started: float
    clock: Callable[[], float]

    @classmethod
    def start(cls, budget_seconds: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """A budget starting now."""
        return cls(budget_seconds, clock(), clock)

    def elapsed(self) -> float:
        """Seconds spent since the start."""
        return self.clock() - self.started

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.budget_seconds - self.elapsed())

    def reached(self) -> str:
        """What to say when the budget ran out: the budget and the real time spent."""
        return (
            f"no answer within {self.budget_seconds:g}s: the deadline was reached after "
            f"{self.elapsed():.1f}s"
        )
