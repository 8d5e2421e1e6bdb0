"""The incident from the change on: its onset against the HPA alone, and the recovery.

The last third of a run can start after an incident is over, and then hides how its start
was served. Two judgements read the whole span from the change to the end instead:

- **The onset** (``Onset``): cachescale's TTFT p95 over every request that finished from
  the change to the end, against the HPA alone's on the same requests. The bound is the
  report's "served users alike" margin, ``p95_limit``: worse by at most
  ``SAME_LATENCY_SHARE`` of the HPA alone's p95 or ``SAME_LATENCY_S``, whichever is
  larger. ``onCollapse: CapAtBudget`` is exempt: the user chose cost over latency.
- **The recovery** (``Recovery``): how long after the change the fleet was back, for good,
  where users and the cache had been. Per timeline window (``report.timeline_s``) from
  the change on: TTFT p95 within the SLO, and the token hit rate within
  ``HIT_RATE_RECOVERED_WITHIN`` of the steady window's before the change. The recovery
  time is from the change to the end of the last window that was not (a window where
  nothing finished counts as not): 0 when none was, unknown (None) when the run's last
  window still was not, or when there is no hit rate before the change to return to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cachescale.api.spec import CollapseAction
from cachescale.sim.policy_loop import scenario_policy
from cachescale.sim.report import Signals, Windows, rounded
from cachescale.sim.run import RunResult
from cachescale.sim.scenario import Scenario

SAME_LATENCY_SHARE = 0.2
"""Two TTFT p95s within 20% (or ``SAME_LATENCY_S``) of each other serve users alike."""
SAME_LATENCY_S = 0.2
HIT_RATE_RECOVERED_WITHIN = 0.05
"""A window's token hit rate is back when it is at most this far under the one before."""


def p95_limit(alone_p95_s: float) -> float:
    """The highest TTFT p95 cachescale may have against the HPA alone's on the same span:
    worse by no more than ``SAME_LATENCY_SHARE`` of it or ``SAME_LATENCY_S``, whichever
    is larger (the acceptance bound of the last third and of the onset alike)."""
    return max(alone_p95_s * (1 + SAME_LATENCY_SHARE), alone_p95_s + SAME_LATENCY_S)


@dataclass(frozen=True)
class Recovery:
    """Seconds from the change until each signal was back for good (None: not by the end,
    or nothing to return to)."""

    slo_s: float | None
    """Until the timeline's TTFT p95 stayed within the SLO."""
    hit_rate_s: float | None
    """Until the timeline's token hit rate stayed within ``HIT_RATE_RECOVERED_WITHIN`` of
    the steady window's before the change."""

    def as_dict(self) -> dict[str, object]:
        """The ``recovery`` object of ``--json``."""
        return rounded({"slo_s": self.slo_s, "hit_rate_s": self.hit_rate_s})


def recovery(result: RunResult, before: Signals) -> Recovery | None:
    """How long after the change the run took to recover; None without a change."""
    change = result.scenario.change_at_s
    if change is None:
        return None
    windows = Windows(result)
    spans = _windows_from(result, change)
    slo = result.scenario.report.slo_ttft_p95_s
    signals = [(end, windows.signals(start, end)) for start, end in spans]
    late = [end for end, s in signals if s.ttft_p95_s is None or s.ttft_p95_s > slo]
    hit_rate_s = None
    if before.token_hit_rate is not None:
        floor = before.token_hit_rate - HIT_RATE_RECOVERED_WITHIN
        cold = [end for end, s in signals if s.token_hit_rate is None or s.token_hit_rate < floor]
        hit_rate_s = _back_after(cold, change, result.scenario.duration_s)
    return Recovery(_back_after(late, change, result.scenario.duration_s), hit_rate_s)


def _windows_from(result: RunResult, change: float) -> list[tuple[float, float]]:
    """The timeline windows (``report.timeline_s``) that end after ``change``."""
    step, duration = result.scenario.report.timeline_s, result.scenario.duration_s
    starts = [i * step for i in range(math.ceil(duration / step - 1e-9))]
    return [(s, min(s + step, duration)) for s in starts if min(s + step, duration) > change]


def _back_after(out_ends: list[float], change: float, duration: float) -> float | None:
    """Seconds from ``change`` to the end of the last window out of bounds (0: none; None:
    the run's last window is)."""
    if not out_ends:
        return 0.0
    last = max(out_ends)
    return None if last >= duration else last - change


def recovery_words(found: Recovery) -> str:
    """``TTFT p95 back within the SLO for good 4 min after the change, the token hit rate
    within 0.05 of its level before for good 90 s after the change``."""
    return (
        f"TTFT p95 {_back('back within the SLO', found.slo_s)}, the token hit rate "
        f"{_back(f'within {HIT_RATE_RECOVERED_WITHIN:g} of its level before', found.hit_rate_s)}"
    )


def _back(what: str, seconds: float | None) -> str:
    if seconds is None:
        return f"not {what} by the end of the run (or unknown)"
    if seconds == 0:
        return f"{what} throughout"
    after = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
    return f"{what} for good {after} after the change"


@dataclass(frozen=True)
class Onset:
    """cachescale's TTFT p95 from the change to the end against the HPA alone's."""

    alone_p95_s: float | None
    cachescale_p95_s: float | None
    cap_at_budget: bool
    """``onCollapse: CapAtBudget``: latency traded for cost by the user's choice."""

    @property
    def limit_s(self) -> float | None:
        """The highest p95 from the change cachescale may have (``p95_limit``)."""
        return None if self.alone_p95_s is None else p95_limit(self.alone_p95_s)

    @property
    def within(self) -> bool | None:
        """cachescale's p95 within ``limit_s`` (None: either p95 unknown)."""
        if self.limit_s is None or self.cachescale_p95_s is None:
            return None
        return self.cachescale_p95_s <= self.limit_s

    def as_dict(self) -> dict[str, Any]:
        """The ``onset`` object of ``--json``."""
        return {
            **rounded(
                {
                    "hpa_p95_from_change_s": self.alone_p95_s,
                    "cachescale_p95_from_change_s": self.cachescale_p95_s,
                    "limit_s": self.limit_s,
                }
            ),
            "within": self.within,
            "cap_at_budget": self.cap_at_budget,
        }

    def words(self) -> str:
        """The onset's verdict in a sentence."""
        if self.within is None:
            return "onset: TTFT p95 from the change unknown for one of the runs"
        state = "within" if self.within else "above"
        excuse = (
            " (onCollapse: CapAtBudget, latency traded for cost)"
            if self.cap_at_budget and not self.within
            else ""
        )
        return (
            f"onset: TTFT p95 from the change {self.cachescale_p95_s:.2f} s with cachescale "
            f"against {self.alone_p95_s:.2f} s alone, {state} the bound of {self.limit_s:.2f} s "
            f"(the larger of {1 + SAME_LATENCY_SHARE:g}× and +{SAME_LATENCY_S:g} s){excuse}"
        )


def onset(alone: RunResult, cachescale: RunResult) -> Onset:
    """The onset of the two runs' incident (from the change to the end of each)."""
    start = change_s(alone.scenario)
    duration = alone.scenario.duration_s
    return Onset(
        Windows(alone).signals(start, duration).ttft_p95_s,
        Windows(cachescale).signals(start, duration).ttft_p95_s,
        _capped_at_budget(cachescale.scenario),
    )


def _capped_at_budget(scenario: Scenario) -> bool:
    """The policy chose ``onCollapse: CapAtBudget`` (a fixed fleet has no policy)."""
    if scenario.autoscaler is None:
        return False
    return scenario_policy(scenario).cache.on_collapse is CollapseAction.CAP_AT_BUDGET


def change_s(scenario: Scenario) -> float:
    """The first change's time (the middle of the run when nothing changes)."""
    return scenario.change_at_s if scenario.change_at_s is not None else scenario.duration_s / 2
