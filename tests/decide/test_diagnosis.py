"""The diagnosis chain (``decide.diagnosis``): every finding of ``decide``, its evidence and
the boundaries of its rules."""

from __future__ import annotations

import pytest

from cachescale.api.reasons import ConditionReason, Diagnosis
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import LearnedState
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    BATCHING,
    T0,
    collapse_run,
    condition,
    run,
    signals,
    snapshot,
    spec,
    workload,
)


def test_healthy_fleet_is_healthy_and_learns() -> None:
    (decision,) = run(spec(), [snapshot(signals(hit=0.87))])
    assert decision.state is Diagnosis.HEALTHY
    assert decision.alerts == ()
    assert condition(decision, ConditionType.CACHE_HEALTHY) == (
        ConditionStatus.TRUE,
        ConditionReason.HIT_RATE_AT_BASELINE,
    )
    baseline = decision.memory.baseline
    # After 120 evaluations the baseline is a one-hour exponential average: 30 s / 3600 s.
    assert baseline.token_hit_rate == pytest.approx(0.85 + (30 / 3600) * (0.87 - 0.85))
    assert baseline.evaluations == 121


def test_collapse_needs_the_configured_number_of_windows() -> None:
    decisions = collapse_run([0.04, 0.04, 0.04], prefill_tokens_per_request=2000)
    assert [d.state for d in decisions] == [
        Diagnosis.HEALTHY,
        Diagnosis.HEALTHY,
        Diagnosis.PREFIX_COLLAPSE,
    ]
    assert [c.reason for c in decisions[2].raised] == [Diagnosis.PREFIX_COLLAPSE]
    assert not decisions[1].alerts


def test_collapse_message_carries_the_evidence() -> None:
    decisions = collapse_run([0.04] * 3, prefill_tokens_per_request=2000)
    message = decisions[-1].alerts[0].message
    for fragment in (
        "token hit rate 0.85 → 0.04 over 3 windows on 11 warm pods",
        "req/s stayed 32 ± 1 (served; arrivals unknown)",
        "prefill tokens per request rose 400 → 2,000",
        "preemptions stayed at 0/s",
        "replicas held at 11",
        "prompt layout, chunking",
    ):
        assert fragment in message


def test_collapse_message_quotes_arrivals_and_flags_the_served_rate() -> None:
    # Demand read as arrivals: traffic grew 32 → 48 while a saturated fleet served 32.
    grown = (
        collapse_run([0.04] * 3, prefill_tokens_per_request=2000, arrivals_per_second=48.0)[-1]
        .alerts[0]
        .message
    )
    assert "req/s moved 32 → 48 and" in grown
    # Without an arrival estimate the served rate stands in, and says so.
    served = collapse_run([0.04] * 3, prefill_tokens_per_request=2000)[-1].alerts[0].message
    assert "req/s stayed 32 ± 1 (served; arrivals unknown)" in served


@pytest.mark.parametrize(("hit", "collapsed"), [(0.426, False), (0.424, True)])
def test_collapse_threshold_boundary(hit: float, collapsed: bool) -> None:
    decisions = collapse_run([hit] * 3)
    assert decisions[-1].has(Diagnosis.PREFIX_COLLAPSE) is collapsed


def test_cold_pods_missing_is_not_a_collapse() -> None:
    engine = signals(hit=0.5, warm_pods=6, cold_pods=5, cold_hit=0.05)
    fleet = workload(cold_pods=5)
    decisions = run(spec(), [snapshot(engine, fleet)] * 4)
    assert all(not d.has(Diagnosis.PREFIX_COLLAPSE) for d in decisions)
    assert decisions[-1].state is Diagnosis.COLD_FLEET
    assert "5 of 11 ready pods younger than 600 s" in decisions[-1].message


def test_no_baseline_no_collapse() -> None:
    decisions = run(spec(), [snapshot(signals(hit=0.04))] * 4, memory=LearnedState(data_since=T0))
    assert all(not d.has(Diagnosis.PREFIX_COLLAPSE) for d in decisions)


def pressure(preemptions: float, running: float = 48.0, hit: float = 0.3) -> Snapshot:
    engine = signals(hit=hit, preemptions_per_second=preemptions, running_requests_per_pod=running)
    return snapshot(engine, workload(max_num_seqs=128))


def test_eviction_pressure_is_named_instead_of_collapse() -> None:
    decisions = run(spec(batching=BATCHING), [pressure(0.5)] * 3)
    final = decisions[-1]
    assert final.state is Diagnosis.EVICTION_PRESSURE
    assert not final.has(Diagnosis.PREFIX_COLLAPSE)
    assert "cache-friendly ceiling B_max of 50" in final.findings[0].evidence
    assert final.ceiling == 50


@pytest.mark.parametrize(("preemptions", "held"), [(0.31, False), (0.32, True)])
def test_preemption_share_boundary(preemptions: float, held: bool) -> None:
    (decision,) = run(spec(batching=BATCHING), [pressure(preemptions)])
    assert decision.has(Diagnosis.EVICTION_PRESSURE) is held  # 1% of 32 req/s


@pytest.mark.parametrize(("running", "held"), [(44.9, False), (45.0, True)])
def test_batch_must_be_near_the_ceiling(running: float, held: bool) -> None:
    (decision,) = run(spec(batching=BATCHING), [pressure(1.0, running=running)])
    assert decision.has(Diagnosis.EVICTION_PRESSURE) is held  # 0.9 × B_max 50


@pytest.mark.parametrize(("cost", "over"), [(780.0, False), (781.0, True)])
def test_over_budget_boundary(cost: float, over: bool) -> None:
    (decision,) = run(spec(), [snapshot(signals(gpu_seconds_per_1k_requests=cost))])
    assert decision.has(Diagnosis.OVER_BUDGET) is over
    status = ConditionStatus.FALSE if over else ConditionStatus.TRUE
    assert condition(decision, ConditionType.WITHIN_BUDGET)[0] is status


def test_over_budget_alerts_only_when_it_persists() -> None:
    decisions = run(spec(), [snapshot(signals(gpu_seconds_per_1k_requests=900))] * 3)
    assert [bool(d.raised) for d in decisions] == [False, False, True]
    assert "900 GPU-s per 1k requests against a budget of 780" in decisions[-1].alerts[0].message


@pytest.mark.parametrize(("p95", "breach"), [(1.0, False), (1.01, True)])
def test_slo_boundary(p95: float, breach: bool) -> None:
    (decision,) = run(spec(), [snapshot(signals(ttft_p95_seconds=p95))])
    assert decision.has(Diagnosis.SLO_AT_RISK) is breach


def test_p99_objective_counts_when_set() -> None:
    policy = spec(slo={"ttftP95Seconds": 1.0, "ttftP99Seconds": 2.0})
    (decision,) = run(policy, [snapshot(signals(ttft_p99_seconds=2.5))])
    assert decision.has(Diagnosis.SLO_AT_RISK)


@pytest.mark.parametrize(
    ("rps", "cost", "growth"),
    [(38.3, 680.0, False), (38.5, 680.0, True), (40.0, 790.0, False)],
)
def test_demand_growth_needs_steady_cost(rps: float, cost: float, growth: bool) -> None:
    engine = signals(requests_per_second=rps, gpu_seconds_per_1k_requests=cost)
    (decision,) = run(spec(budget={"gpuSecondsPer1kRequests": 2000}), [snapshot(engine)])
    assert decision.has(Diagnosis.DEMAND_GROWTH) is growth


def test_precedence_orders_the_findings() -> None:
    engine = signals(hit=0.04, ttft_p95_seconds=3.0, gpu_seconds_per_1k_requests=1100)
    decisions = run(spec(), [snapshot(engine, workload(cold_pods=2))] * 3)
    assert [f.diagnosis for f in decisions[-1].findings] == [
        Diagnosis.PREFIX_COLLAPSE,
        Diagnosis.SLO_AT_RISK,
        Diagnosis.OVER_BUDGET,
        Diagnosis.COLD_FLEET,
    ]
    assert decisions[-1].state is Diagnosis.PREFIX_COLLAPSE


def test_collapse_clears_only_after_recovering_past_the_midpoint() -> None:
    hits = [0.04] * 3 + [0.6] * 3 + [0.7, 0.7]
    decisions = collapse_run(hits)
    active = [d.alert_active(Diagnosis.PREFIX_COLLAPSE) for d in decisions]
    assert active == [False, False, True, True, True, True, True, False]  # midpoint 0.6375
