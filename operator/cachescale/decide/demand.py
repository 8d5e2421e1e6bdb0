"""Demand: the request rate every decision reads, arrivals when known.

A saturated fleet finishes what it manages to serve, not what arrives: reading the
finished-request rate as demand makes a queue look like flat traffic, so a budget cap or
a collapse hold computed from it pins the fleet exactly when more replicas are needed.
So demand is the arrival rate (``EngineSignals.arrivals_per_second``: every finished
request plus the growth of the requests in the system, or the policy's ``demandQuery``)
and only when that is unknown the served rate, which a message then names as such
(``docs/decisions.md``, "Demand").
"""

from __future__ import annotations

from dataclasses import dataclass

from cachescale.decide import words
from cachescale.snapshot import Snapshot

SERVED_ONLY = " (served; arrivals unknown)"
"""What a message adds to a request rate that is the served one, not arrivals."""


@dataclass(frozen=True, slots=True)
class Demand:
    """The request rate the decision used, and whether it is the arrival rate."""

    per_second: float | None
    arrivals: bool
    """True: the arrival rate; False: the served rate stands in (or nothing is known)."""

    def rate(self, value: float | None = None) -> str:
        """``value`` (default: this demand) in req/s words, flagged when it is served."""
        shown = self.per_second if value is None else value
        text = words.rate(shown) if shown is not None else "unknown"
        return text if self.arrivals else text + SERVED_ONLY


def demand(snapshot: Snapshot) -> Demand:
    """Arrivals per second when known, else requests served per second."""
    signals = snapshot.signals
    arrivals = signals.arrivals_per_second.value
    if arrivals is not None:
        return Demand(arrivals, True)
    return Demand(signals.requests_per_second.value, False)


@dataclass(frozen=True, slots=True)
class ExtraCost:
    """What requests cost over the healthy baseline, at the demand."""

    gpu_seconds_per_1k: float
    """Current minus baseline GPU-seconds per 1k requests."""
    gpu_hours_per_day: float
    """``gpu_seconds_per_1k × req/s × 86,400 / 1,000 / 3,600``."""
    baseline_gpu_seconds_per_1k: float
    """The learned baseline the extra is counted from."""

    def words(self) -> str:
        """``this costs X GPU-s per 1k requests over the baseline, Y GPU-hours per day
        (learned baseline B GPU-s/1k)``: the baseline quoted is the one subtracted, so a
        reader never has to infer it from the current cost."""
        return (
            f"this costs {words.cost(self.gpu_seconds_per_1k)} GPU-s per 1k requests over "
            f"the baseline, {self.gpu_hours_per_day:,.0f} GPU-hours per day (learned baseline "
            f"{words.cost(self.baseline_gpu_seconds_per_1k)} GPU-s/1k)"
        )


def extra_cost(cost: float | None, baseline_cost: float | None, need: Demand) -> ExtraCost | None:
    """The cost over the baseline (None when unknown or not over it)."""
    if cost is None or baseline_cost is None or need.per_second is None:
        return None
    extra = cost - baseline_cost
    if extra <= 0:
        return None
    return ExtraCost(extra, extra * need.per_second * 86_400 / 1000 / 3600, baseline_cost)
