"""Every diagnosis of ``decide``, its evidence and the boundaries of its rules."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from cachescale.api.reasons import Action, ConditionReason, Diagnosis
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import Decision, LearnedState
from cachescale.decide.checks import collapse_thresholds
from cachescale.decide.engine import read_retried
from cachescale.decide.envelope import Envelope
from cachescale.decide.learned import OriginalEnvelope
from cachescale.snapshot import EngineSignals, FetchFailure, Snapshot
from tests.decide.decide_builders import (
    BATCHING,
    T0,
    condition,
    learned,
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


@pytest.mark.parametrize(
    ("engine", "reason"),
    [
        (signals(requests_per_second=None), "requests_per_second: series absent"),
        (signals(ttft_p95_seconds=None), "ttft_p95_seconds: series absent"),
        (signals(hit=None), "token_hit_rate_local: series absent"),
        (
            EngineSignals.all_unknown(
                "Prometheus is unreachable at http://prometheus:9090",
                observed_at=T0,
                window_seconds=300,
                failure=FetchFailure.UNREACHABLE,
            ),
            "Prometheus is unreachable",
        ),
    ],
)
def test_missing_data_freezes_the_envelope(engine: EngineSignals, reason: str) -> None:
    current = workload(hpa=(4, 14, 24.0))
    (decision,) = run(spec(), [snapshot(engine, current)])
    assert decision.state is Diagnosis.METRICS_UNAVAILABLE
    assert (decision.envelope.min_replicas, decision.envelope.max_replicas) == (4, 14)
    assert decision.envelope.target_average_value == 24.0
    assert decision.reason == Action.FROZEN_ON_MISSING_METRICS
    assert reason in decision.message
    assert [change.reason for change in decision.raised] == [Diagnosis.METRICS_UNAVAILABLE]
    assert condition(decision, ConditionType.METRICS_AVAILABLE)[0] is ConditionStatus.FALSE


def test_missing_data_fails_open_to_the_original_envelope() -> None:
    """A cap set on data that is now stale must not block the HPA's own scale-up: the top
    returns to the user's original maxReplicas (within the budget's), nothing is lowered."""
    blind = EngineSignals.all_unknown("down", observed_at=T0, window_seconds=300)
    capped = workload(replicas=12, hpa=(5, 12, 20.0))
    original = OriginalEnvelope(min_replicas=4, max_replicas=30, target_average_value=24.0)
    (decision,) = run(spec(), [snapshot(blind, capped)], learned(original_envelope=original))
    assert decision.envelope == Envelope(5, 30, 20.0)
    assert "HPA may scale up to 30 (the original envelope) until data returns" in (decision.message)
    assert condition(decision, ConditionType.SCALING_HELD)[0] is ConditionStatus.FALSE
    # Within the budget's range, and never below where it is now.
    (narrow,) = run(
        spec(budget={"maxReplicas": 20}),
        [snapshot(blind, capped)],
        learned(original_envelope=original),
    )
    assert narrow.envelope.max_replicas == 20
    assert "up to 20 (the original envelope's 30, within budget.maxReplicas)" in narrow.message
    above = workload(replicas=12, hpa=(5, 36, 20.0))
    (kept,) = run(spec(), [snapshot(blind, above)], learned(original_envelope=original))
    assert kept.envelope == Envelope(5, 36, 20.0)
    assert "up to 36 (kept: already above the original envelope's 30)" in kept.message


def test_metrics_unavailable_clears_when_data_returns_but_waits_a_window() -> None:
    """Five blind evaluations 30 s apart: up to 180 s of the 5m window may be blank (from
    the last evaluation with data), more than half of it, so the window fills again."""
    blind = EngineSignals.all_unknown("down", observed_at=T0, window_seconds=300)
    decisions = run(spec(), [snapshot(blind)] * 5 + [snapshot()] * 11)
    frozen, back, filling = decisions[:5], decisions[5], decisions[6:]
    assert all(d.alert_active(Diagnosis.METRICS_UNAVAILABLE) for d in frozen)
    assert [c.reason for c in back.cleared] == [Diagnosis.METRICS_UNAVAILABLE]
    assert back.reason == Action.WAITING_FOR_FULL_WINDOW
    assert [d.reason for d in filling[:9]] == [Action.WAITING_FOR_FULL_WINDOW] * 9
    assert filling[-1].reason != Action.WAITING_FOR_FULL_WINDOW  # 300 s after the data came back


@pytest.mark.parametrize("blind_evaluations", [1, 4])
def test_a_short_gap_does_not_restart_the_window(blind_evaluations: int) -> None:
    """A timed-out read, or up to 4 blind evaluations (at most 150 s of a 5m window blank):
    MetricsUnavailable is raised and cleared, and the first evaluation with data decides
    again, since Prometheus's window still holds at least half its samples."""
    blind = EngineSignals.all_unknown("timed out", observed_at=T0, window_seconds=300)
    steady = [snapshot()] * 11
    decisions = run(spec(), steady + [snapshot(blind)] * blind_evaluations + [snapshot()])
    frozen, back = decisions[11:-1], decisions[-1]
    assert decisions[10].reason != Action.WAITING_FOR_FULL_WINDOW  # the window was full
    assert all(d.reason == Action.FROZEN_ON_MISSING_METRICS for d in frozen)
    assert [c.reason for c in back.cleared] == [Diagnosis.METRICS_UNAVAILABLE]
    assert back.reason != Action.WAITING_FOR_FULL_WINDOW
    assert back.memory.missing_since is None


@pytest.mark.parametrize(
    ("failure", "in_a_row", "retried"),
    [
        (FetchFailure.TIMEOUT, 1, True),
        (FetchFailure.UNREACHABLE, 1, True),
        (FetchFailure.BAD_RESPONSE, 1, True),
        (FetchFailure.TIMEOUT, 2, False),
        (FetchFailure.QUERY_ERROR, 1, False),
        (FetchFailure.CREDENTIALS_UNREADABLE, 1, False),
        (None, 0, False),
    ],
)
def test_a_first_failed_read_is_retried(
    failure: FetchFailure | None, in_a_row: int, retried: bool
) -> None:
    """A read that timed out, found nothing listening or got an unusable answer is retried
    once before the evaluation freezes on it; a query Prometheus rejects and unreadable
    credentials are not passing trouble, and freeze at once."""
    read = (
        signals()
        if failure is None
        else EngineSignals.all_unknown("x", observed_at=T0, window_seconds=300, failure=failure)
    )
    assert read_retried(read, in_a_row, LearnedState()) is retried


def test_a_known_outage_is_not_retried_after_a_restart() -> None:
    """A process that starts during an outage its predecessor froze on stays frozen: the
    stored alert says the data is missing, so its own first failed read is not retried."""
    blind = EngineSignals.all_unknown(
        "down", observed_at=T0, window_seconds=300, failure=FetchFailure.UNREACHABLE
    )
    (frozen,) = run(spec(), [snapshot(blind)])
    assert frozen.alert_active(Diagnosis.METRICS_UNAVAILABLE)
    assert not read_retried(blind, 1, frozen.memory)


def collapse_run(hits: Sequence[float], **kwargs: float | None) -> list[Decision]:
    return run(spec(), [snapshot(signals(hit=hit, **kwargs)) for hit in hits])


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


def test_no_warm_pod_means_the_cache_is_unknown_and_nothing_changes() -> None:
    engine = signals(hit=0.04, warm_pods=0, cold_pods=11, gpu_seconds_per_1k_requests=3000)
    fleet = workload(cold_pods=11, hpa=(4, 40, 24.0))
    decisions = run(spec(), [snapshot(engine, fleet)] * 4)
    assert not decisions[-1].has(Diagnosis.PREFIX_COLLAPSE)
    assert {d.reason for d in decisions} == {Action.WAITING_FOR_WARM_PODS}
    assert {d.envelope.max_replicas for d in decisions} == {40}  # no budget cap from warm-up costs
    assert not any(d.raised for d in decisions)
    assert condition(decisions[-1], ConditionType.CACHE_HEALTHY) == (
        ConditionStatus.UNKNOWN,
        ConditionReason.NO_WARM_PODS,
    )


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


def test_baseline_is_frozen_while_unhealthy() -> None:
    # 0.5 is under the clearing threshold (0.6375): not learned, even before a collapse.
    decisions = collapse_run([0.5, 0.04, 0.04, 0.04])
    assert {d.memory.baseline.token_hit_rate for d in decisions} == {0.85}


def test_a_slow_decline_is_caught_not_learned() -> None:
    # 0.85 → 0.04 over 40 minutes: the baseline barely moves, the collapse is raised.
    hits = [0.85 - (0.81 * i / 80) for i in range(80)] + [0.04] * 4
    decisions = collapse_run(hits)
    assert decisions[-1].alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert decisions[-1].memory.baseline.token_hit_rate > 0.8


def test_the_first_hour_is_a_plain_mean() -> None:
    memory = LearnedState(data_since=T0 - timedelta(hours=1))
    decisions = run(spec(), [snapshot(signals(hit=h)) for h in (0.8, 0.9)], memory)
    assert decisions[-1].memory.baseline.token_hit_rate == pytest.approx(0.85)
