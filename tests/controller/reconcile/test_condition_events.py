"""A condition's Events (``controller/reconcile/condition_events.py``): a Warning when it
turns bad (an SLO breach, a budget overrun or eviction pressure only once sustained for
``collapseWindows`` evaluations), a Normal ``<Condition>Recovered`` quoting the reading
when it is good again, and nothing while it stays as it was or while an alert of the same
reason speaks for it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cachescale.api.reasons import ConditionReason, Diagnosis, Problem
from cachescale.api.status import Condition, ConditionStatus, ConditionType
from cachescale.controller.reconcile.condition_events import (
    ConditionEvent,
    Episode,
    condition_events,
)
from cachescale.controller.reconcile.context import Operator
from cachescale.decide.learned import Streaks
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import SETTLE, run, stack
from tests.gather.gather_fakes import FakePrometheus

SINCE = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NOW = SINCE + timedelta(minutes=12)
SLO = ConditionType.SLO_MET
TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def condition(
    kind: ConditionType, status: ConditionStatus, reason: str, message: str = ""
) -> Condition:
    return Condition(
        type=kind, status=status, reason=reason, message=message, last_transition_time=SINCE
    )


def breach(message: str = "TTFT p95 29 s above the 0.50 s SLO") -> Condition:
    return condition(SLO, FALSE, Diagnosis.SLO_AT_RISK, message)


def within() -> Condition:
    return condition(SLO, TRUE, ConditionReason.TTFT_WITHIN_SLO, "TTFT p95 0.42 s within SLO")


def episode(
    before: int = 0, after: int = 0, alerts: frozenset[str] = frozenset(), windows: int = 3
) -> Episode:
    return Episode(windows, Streaks(slo_breach=before), Streaks(slo_breach=after), alerts)


def test_an_slo_breach_warns_once_it_holds_for_collapse_windows_evaluations() -> None:
    assert condition_events([within()], [breach()], episode(0, 1), NOW) == []
    assert condition_events([breach()], [breach()], episode(1, 2), NOW) == []
    (warning,) = condition_events([breach()], [breach()], episode(2, 3), NOW)
    assert warning == ConditionEvent(
        "Warning",
        Diagnosis.SLO_AT_RISK,
        "SLOMet=False: TTFT p95 29 s above the 0.50 s SLO, 3 evaluations in a row",
    )
    assert condition_events([breach()], [breach("TTFT p95 31 s")], episode(3, 4), NOW) == []


def test_a_breach_warned_at_its_first_evaluation_says_one_evaluation() -> None:
    (warning,) = condition_events([within()], [breach()], episode(0, 1, windows=1), NOW)
    assert warning.message.endswith("SLO, 1 evaluation in a row"), warning.message


def test_a_sustained_breach_that_ends_posts_a_normal_event_quoting_the_reading() -> None:
    (recovered,) = condition_events([breach()], [within()], episode(5, 0), NOW)
    assert recovered == ConditionEvent(
        "Normal",
        "SLOMetRecovered",
        "SLOMet=True: TTFT p95 0.42 s within SLO; it was False (SLOAtRisk) for 12 min "
        "from 12:00 UTC",
    )


def test_a_breach_too_short_to_warn_recovers_silently() -> None:
    assert condition_events([breach()], [within()], episode(2, 0), NOW) == []


def test_an_alert_of_the_same_reason_speaks_for_the_condition() -> None:
    raised = frozenset({Diagnosis.SLO_AT_RISK.value})
    assert condition_events([breach()], [breach()], episode(2, 3, raised), NOW) == []
    assert condition_events([breach()], [within()], episode(5, 0, raised), NOW) == []


def test_a_condition_without_a_streak_warns_and_recovers_at_its_flips() -> None:
    kind = ConditionType.CACHE_ISOLATION
    safe = condition(kind, TRUE, ConditionReason.SINGLE_TENANT, "prefix caching on")
    unsafe = condition(kind, FALSE, ConditionReason.NON_CRYPTOGRAPHIC_PREFIX_HASH, "xxhash")
    (warning,) = condition_events([], [unsafe], episode(), NOW)
    assert (warning.kind, warning.reason) == ("Warning", "NonCryptographicPrefixHash")
    assert warning.message == "CacheIsolation=False: xxhash"
    (normal,) = condition_events([unsafe], [safe], episode(), NOW)
    assert (normal.kind, normal.reason) == ("Normal", "CacheIsolationRecovered")


def test_unknown_is_neither_bad_nor_good() -> None:
    kind = ConditionType.CACHE_HEALTHY
    bad = condition(kind, FALSE, Diagnosis.CACHE_DEGRADED)
    unknown = condition(kind, UNKNOWN, Diagnosis.METRICS_UNAVAILABLE)
    good = condition(kind, TRUE, ConditionReason.HIT_RATE_AT_BASELINE)
    assert condition_events([bad], [unknown], episode(), NOW) == []
    assert condition_events([unknown], [good], episode(), NOW) == []
    assert condition_events([unknown], [unknown], episode(), NOW) == []


def test_a_problem_cleared_is_one_recovery_however_many_conditions_it_held_false() -> None:
    """``NoPrometheusURL`` holds Ready and MetricsAvailable False; its Warning came with the
    problem. Fixed, it is one Normal Event: Ready's."""
    ready, metrics = ConditionType.READY, ConditionType.METRICS_AVAILABLE
    before = [
        condition(ready, FALSE, Problem.NO_PROMETHEUS_URL, "no Prometheus URL"),
        condition(metrics, FALSE, Problem.NO_PROMETHEUS_URL, "no Prometheus URL"),
    ]
    after = [
        condition(ready, TRUE, ConditionReason.EVALUATED, "the last evaluation completed"),
        condition(metrics, TRUE, ConditionReason.SIGNALS_READ, "every required signal was read"),
    ]
    (normal,) = condition_events(before, after, episode(), NOW)
    assert normal.reason == "ReadyRecovered"
    assert "it was False (NoPrometheusURL) for 12 min" in normal.message


def test_scaling_held_has_no_good_state_and_posts_nothing() -> None:
    kind = ConditionType.SCALING_HELD
    held = condition(kind, TRUE, "CollapseHold")
    free = condition(kind, FALSE, ConditionReason.NOT_HELD)
    assert condition_events([free], [held], episode(), NOW) == []
    assert condition_events([held], [free], episode(), NOW) == []


def condition_events_posted(cluster: FakeCluster) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        if e["reason"] in ("SLOAtRisk", "SLOMetRecovered")
    ]


def test_an_operator_warns_of_a_sustained_slo_breach_and_says_when_it_ends(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)
    posted = len(cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events"))
    run(operator, cluster, clock, rounds=10)
    steady = cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
    assert len(steady) == posted, "a steady policy posts nothing"
    numbers.ttft_p95_s = 29.0
    run(operator, cluster, clock, rounds=2)
    assert condition_events_posted(cluster) == [], "not yet collapseWindows evaluations"
    run(operator, cluster, clock, rounds=5)
    ((kind, reason, message),) = condition_events_posted(cluster)
    assert (kind, reason) == ("Warning", "SLOAtRisk")
    assert message.startswith("SLOMet=False: TTFT p95 ")
    assert message.endswith("3 evaluations in a row")
    numbers.ttft_p95_s = 0.4
    run(operator, cluster, clock, rounds=5)
    (_, (kind, reason, message)) = condition_events_posted(cluster)
    assert (kind, reason) == ("Normal", "SLOMetRecovered")
    assert message.startswith("SLOMet=True: TTFT p95 ")
    assert "it was False (SLOAtRisk) for " in message
