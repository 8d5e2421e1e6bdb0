"""The whole incident in the loop: the onset no slower than the HPA alone's, and the
recovery reported (``sim.incident``; the rule: docs/design/acceptance.md).

The last-third acceptance (``test_closed_loop.py``) can miss a slow start: an incident
over by the last third leaves no trace there. These read every request from the change to
the end, on the same requests for both runs.
"""

from __future__ import annotations

import pytest

from cachescale.sim.incident import p95_limit
from tests.sim.closed_loop import LoopSummary

ONSETS = [
    "shuffled-tools",  # a degraded cache pushing the cost over a tight budget
    "scaleout-round-robin",  # 5 → 22 req/s from 2 pods behind round-robin
    "traffic-doubling",  # 16 → 32 req/s, no budget pressure
    "demand-step",  # +50% at a steady cost under a tight budget
]


@pytest.mark.parametrize("name", ONSETS)
def test_the_onset_is_no_slower_than_the_hpa_alone(
    loops: dict[str, LoopSummary], name: str
) -> None:
    # TTFT p95 of every request from the change to the end, against the HPA alone's on
    # the same requests: within max(1.2×, +0.2 s) (none of these is under CapAtBudget).
    alone, loop = loops[f"{name}/hpa"], loops[f"{name}/cachescale"]
    assert alone.from_change.ttft_p95_s is not None
    assert loop.from_change.ttft_p95_s is not None
    assert loop.from_change.ttft_p95_s <= p95_limit(alone.from_change.ttft_p95_s)


def test_a_demand_step_at_a_steady_cost_is_followed_at_once(
    loops: dict[str, LoopSummary],
) -> None:
    # The budget's windowed allowance trails the step; at a steady cost the envelope keeps
    # room over the current replicas as it comes (later, starting pods push the cost over
    # the budget and the SLO guard takes over), the HPA is never held by the budget, and
    # the fleet grows no larger than the HPA alone's.
    alone, loop = loops["demand-step/hpa"], loops["demand-step/cachescale"]
    change = loop.scenario.change_at_s
    assert change is not None
    onset = [r for r in loop.policy if change <= r.t_s < change + 120.0]
    assert onset
    assert all("room for rising demand" in r.message for r in onset)
    assert all(r.reason != "CappedAtBudget" for r in loop.policy if r.t_s >= change)
    assert max(s.replicas for s in loop.samples) <= max(s.replicas for s in alone.samples)
    assert loop.after.replicas is not None
    assert alone.after.replicas is not None
    assert loop.after.replicas <= alone.after.replicas
    assert loop.after.ttft_p95_s is not None
    assert alone.after.ttft_p95_s is not None
    assert loop.after.ttft_p95_s <= p95_limit(alone.after.ttft_p95_s)


@pytest.mark.parametrize("autoscaler", ["hpa", "cachescale"])
def test_a_rolling_deploy_reports_when_it_recovered(
    loops: dict[str, LoopSummary], autoscaler: str
) -> None:
    # Every pod replaced by a cold one: TTFT p95 rises above the SLO during the rollout
    # and is back within it, for good, before the end; so is the hit rate. The report
    # carries the same recovery.
    loop = loops[f"rolling-deploy/{autoscaler}"]
    change = loop.scenario.change_at_s
    assert change is not None
    assert loop.recovery is not None
    assert loop.recovery.slo_s is not None
    assert 0 < loop.recovery.slo_s < loop.scenario.duration_s - change
    assert loop.recovery.hit_rate_s is not None
    if loop.report is not None:
        assert loop.report["recovery"] == loop.recovery.as_dict()
