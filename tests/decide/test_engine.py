"""One evaluation's gates (``decide.engine``): missing data fails open and raises
``MetricsUnavailable``, a first failed read is retried, a window still spanning blank time
or only warming pods waits, and a short gap does not restart the window."""

from __future__ import annotations

import pytest

from cachescale.api.reasons import Action, ConditionReason, Diagnosis
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import LearnedState
from cachescale.decide.engine import read_retried
from cachescale.decide.envelope import Envelope
from cachescale.decide.learned import OriginalEnvelope
from cachescale.snapshot import EngineSignals, FetchFailure
from tests.decide.decide_builders import (
    T0,
    condition,
    learned,
    run,
    signals,
    snapshot,
    spec,
    workload,
)


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
    """A cap set on data that is now stale must not block the HPA's own scale-up:
    maxReplicas returns to the user's original (within the budget's), nothing is lowered."""
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
