"""The measurements a diagnosis is named from (``decide.checks``): the budget's allowance
at the demand, read through ``decide`` and as a table of ``budget_replicas`` cases."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.checks import budget_replicas, collapse_thresholds
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    run,
    signals,
    snapshot,
    spec,
    workload,
)


def test_a_saturated_fleet_over_budget_is_held_at_its_replicas() -> None:
    # Requests queue and each costs more than the budget: 27 req/s is what 15 pods manage,
    # not the demand; the formula (10) would cut a saturated fleet and serve even fewer.
    engine = signals(
        requests_per_second=27.0, waiting_requests_per_pod=3.0, gpu_seconds_per_1k_requests=1111
    )
    (decision,) = run(spec(), [snapshot(engine, workload(replicas=15, hpa=(4, 15, 24.0)))])
    assert decision.budget_max_replicas == 15
    assert decision.envelope.max_replicas == 15


def test_a_saturated_fleet_within_budget_is_not_capped_by_what_it_serves() -> None:
    # Demand grew at a steady cost: the queue says the HPA must scale, inside the budget.
    engine = signals(requests_per_second=27.0, waiting_requests_per_pod=3.0)
    (decision,) = run(spec(), [snapshot(engine, workload(replicas=10, hpa=(4, 10, 24.0)))])
    assert decision.budget_max_replicas == 40
    assert decision.envelope.max_replicas == 40  # the budget's range, not what it serves


def test_with_arrivals_known_the_budget_reads_them_even_while_requests_queue() -> None:
    # 15 saturated pods serve 27 req/s of the 41 arriving: the allowance is read at the
    # arrivals, 780 × 41 / (1000 × 2) = 15.99 → 15, not pinned at the replicas.
    engine = signals(
        requests_per_second=27.0,
        arrivals_per_second=41.0,
        waiting_requests_per_pod=3.0,
        gpu_seconds_per_1k_requests=1111,
    )
    (decision,) = run(spec(), [snapshot(engine, workload(replicas=9, hpa=(4, 9, 24.0)))])
    assert decision.budget_max_replicas == 15
    assert "budget allows 15" in decision.message
    # Within budget at a steady cost, demand growth is the arrivals' allowance (20), not
    # the budget's whole range.
    growth = signals(
        requests_per_second=27.0, arrivals_per_second=52.0, waiting_requests_per_pod=3.0
    )
    (grown,) = run(spec(), [snapshot(growth, workload(replicas=10, hpa=(4, 10, 24.0)))])
    assert grown.budget_max_replicas == 20


@pytest.mark.parametrize(
    ("baseline", "relative", "absolute", "threshold"),
    [
        (0.85, 0.5, 0.2, 0.425),  # the relative drop is the stricter one
        (0.3, 0.5, 0.2, 0.1),  # the absolute drop is
        (0.15, 0.5, 0.2, -0.05),  # a low baseline can never collapse
    ],
)
def test_both_drops_are_required(
    baseline: float, relative: float, absolute: float, threshold: float
) -> None:
    cache = spec(cache={"collapseRelativeDrop": relative, "collapseAbsoluteDrop": absolute}).cache
    assert collapse_thresholds(cache, baseline)[0] == pytest.approx(threshold)


# --- budget_replicas, case by case ------------------------------------------------------
#
# The builders' policy: 780 GPU-s/1k, replicas up to 40; 2 GPUs per pod. The rule:
# floor(budget × demand / (1000 × 2)); with only the served rate known and requests
# queueing (≥ 1 per pod, or unknown), the served rate is not the demand: within budget
# the budget's maxReplicas, else no lower than the current replicas.


def fleet(replicas: int = 11, **values: float | None) -> Snapshot:
    """``replicas`` pods reading ``values`` (fleet signals by name)."""
    return snapshot(signals(**values), workload(replicas=replicas, hpa=(4, replicas, 24.0)))


QUEUED = {"requests_per_second": 27.0, "waiting_requests_per_pod": 3.0}


@dataclass(frozen=True)
class BudgetCase:
    """A fleet and the most replicas the budget allows it."""

    name: str
    state: Snapshot
    allows: int | None
    dearer: bool = False
    policy: CacheScalingPolicySpec = field(default_factory=spec)


BUDGET_CASES = [
    # 780 × 32 / 2,000 = 12.48.
    BudgetCase("the allowance at the served rate, floored", fleet(), 12),
    # 750 × 32 / 2,000 = 12 exactly.
    BudgetCase(
        "an exact allowance is itself",
        fleet(),
        12,
        policy=spec(budget={"gpuSecondsPer1kRequests": 750}),
    ),
    BudgetCase("no cap from an unknown rate", fleet(requests_per_second=None), None),
    BudgetCase("no cap from a zero rate", fleet(requests_per_second=0.0), None),
    # 780 × 41 / 2,000 = 15.99: arrivals are the demand, queue or not, cost or not.
    BudgetCase(
        "arrivals are the demand even while requests queue",
        fleet(15, arrivals_per_second=41.0, gpu_seconds_per_1k_requests=1111.0, **QUEUED),
        15,
    ),
    BudgetCase("a queue within budget opens the budget's range", fleet(10, **QUEUED), 40),
    BudgetCase(
        "one request waiting per pod is a queue",
        fleet(10, requests_per_second=27.0, waiting_requests_per_pod=1.0),
        40,
    ),
    BudgetCase(
        "a waiting count unknown is read as a queue",
        fleet(10, requests_per_second=27.0, waiting_requests_per_pod=None),
        40,
    ),
    # The formula would say floor(780 × 27 / 2,000) = 10.
    BudgetCase(
        "a queue over budget holds the current replicas",
        fleet(15, gpu_seconds_per_1k_requests=1111.0, **QUEUED),
        15,
    ),
    BudgetCase(
        "a queue of dearer requests holds the replicas though the cost has not caught up",
        fleet(15, **QUEUED),
        15,
        dearer=True,
    ),
    BudgetCase(
        "a queue at an unknown cost holds the current replicas",
        fleet(15, gpu_seconds_per_1k_requests=None, **QUEUED),
        15,
    ),
    # 780 × 27 / 2,000 = 10.53, more than the replicas: the allowance stands.
    BudgetCase(
        "a queue over budget never lowers the allowance",
        fleet(8, gpu_seconds_per_1k_requests=1111.0, **QUEUED),
        10,
    ),
    # 0.5 waiting per pod is no queue: the served rate is the demand, 780 × 27 / 2,000.
    BudgetCase(
        "without a queue the served rate is the demand",
        fleet(15, requests_per_second=27.0, waiting_requests_per_pod=0.5),
        10,
    ),
]


@pytest.mark.parametrize("case", BUDGET_CASES, ids=lambda case: case.name)
def test_budget_replicas(case: BudgetCase) -> None:
    assert budget_replicas(case.policy, case.state, case.dearer) == case.allows
