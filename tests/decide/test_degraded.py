"""``CacheDegraded``: a costly hit-rate fall above the collapse threshold, named with its
cost, never a collapse, never on cold pods or eviction, never a scaling change.

The default policy reads a 5 min window every 30 s, so the drop must hold for 11
evaluations (more than one window); the baseline is 0.85 (collapse threshold 0.425),
400 prefill tokens per request and 680 GPU-s/1k at 32 req/s (``decide_builders``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from cachescale.api.reasons import AlertCleared, Diagnosis, cleared
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import Decision, LearnedState, diagnosis, words
from cachescale.decide.checks import check_collapse
from cachescale.decide.clearing import REBASELINED
from cachescale.decide.degraded import degraded_evaluations, in_band
from cachescale.decide.thresholds import DEARER_PREFILL_FACTOR, DEGRADED_COST_SHARE
from cachescale.snapshot import HumanRequests, Snapshot
from tests.decide.decide_builders import (
    BATCHING,
    INTERVAL,
    T0,
    learned,
    signals,
    snapshot,
    spec,
    workload,
)
from tests.decide.test_diagnosis import condition, run

SETTLE = 11
"""Evaluations a drop must hold under the default 5 m window and 30 s interval."""
WINDOW = timedelta(minutes=5)


def degraded(hit: float = 0.56, cost: float = 760.0, **values: float | None) -> Snapshot:
    """Warm pods at ``hit``, requests dearer: 1,300 prefill tokens, ``cost`` GPU-s/1k
    (within the 780 budget unless told)."""
    values.setdefault("prefill_tokens_per_request", 1300.0)
    return snapshot(signals(hit=hit, gpu_seconds_per_1k_requests=cost, **values))


def raised_at(decisions: Sequence[Decision]) -> list[int]:
    return [
        i
        for i, d in enumerate(decisions)
        if any(c.reason is Diagnosis.CACHE_DEGRADED for c in d.raised)
    ]


def test_the_drop_must_hold_for_more_than_a_window() -> None:
    assert degraded_evaluations(spec()) == SETTLE
    assert degraded_evaluations(spec(cache={"collapseWindows": 20})) == 20
    assert degraded_evaluations(spec(metrics={"window": "1m", "interval": "30s"})) == 3


def test_a_costly_drop_above_the_collapse_threshold_is_named() -> None:
    decisions = run(spec(), [degraded()] * SETTLE)
    assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions[:-1])
    last = decisions[-1]
    assert last.state is Diagnosis.CACHE_DEGRADED
    assert raised_at(decisions) == [SETTLE - 1]
    assert not last.alert_active(Diagnosis.PREFIX_COLLAPSE)
    status, reason = condition(last, ConditionType.CACHE_HEALTHY)
    assert (status, reason) == (ConditionStatus.FALSE, Diagnosis.CACHE_DEGRADED)


def test_the_message_quotes_the_numbers_the_decision_used() -> None:
    last = run(spec(), [degraded()] * SETTLE)[-1]
    (alert,) = last.alerts
    baseline = last.memory.baseline
    assert baseline.token_hit_rate is not None
    assert baseline.prefill_tokens_per_request is not None
    assert last.extra_cost is not None
    # The extra cost is current minus baseline at the demand the decision read.
    assert last.demand is not None
    assert last.demand.per_second == 32.0
    assert last.extra_cost.gpu_seconds_per_1k == pytest.approx(760.0 - 680.0)
    assert last.extra_cost.gpu_hours_per_day == pytest.approx(80 * 32 * 86_400 / 1000 / 3600)
    for fragment in (
        f"warm-pod token hit rate {words.ratio(baseline.token_hit_rate)} → 0.56 over 11 "
        "evaluations on 11 warm pods, above the collapse threshold 0.42",
        f"prefill tokens per request {words.tokens(baseline.prefill_tokens_per_request)} → "
        "1,300 (+900)",
        last.extra_cost.words(),
        "this costs 80 GPU-s per 1k requests over the baseline, 61 GPU-hours per day",
        "scaling is unchanged",
        "history truncation or context windows",
    ):
        assert fragment in alert.message
    finding = next(f for f in last.findings if f.diagnosis is Diagnosis.CACHE_DEGRADED)
    assert alert.message.startswith(finding.evidence)


@pytest.mark.parametrize(
    ("cost", "prefill", "named"),
    [
        (680.0 * (1 + DEGRADED_COST_SHARE) - 0.1, 450.0, False),
        (680.0 * (1 + DEGRADED_COST_SHARE), 450.0, True),
        # Prefill per request 1.25 × the baseline's 400 is material on its own.
        (680.0, 400.0 * DEARER_PREFILL_FACTOR - 1, False),
        (680.0, 400.0 * DEARER_PREFILL_FACTOR, True),
    ],
)
def test_a_cheap_drop_is_not_named(cost: float, prefill: float, named: bool) -> None:
    snapshots = [degraded(cost=cost, prefill_tokens_per_request=prefill)] * SETTLE
    decisions = run(spec(), snapshots)
    assert decisions[-1].has(Diagnosis.CACHE_DEGRADED) is named


def test_recomputed_prefill_the_cost_does_not_show_yet_is_said_so() -> None:
    last = run(spec(), [degraded(cost=680.0)] * SETTLE)[-1]
    (alert,) = last.alerts
    assert last.extra_cost is None
    assert (
        "GPU-s per 1k requests 680 against the baseline's 680: the recomputed prefill does "
        "not show in the cost yet" in alert.message
    )


@pytest.mark.parametrize(("hit", "named"), [(0.76, False), (0.74, True), (0.424, False)])
def test_the_band_is_under_baseline_less_the_drop_and_above_the_collapse(
    hit: float, named: bool
) -> None:
    # Not at the edge: above the clearing threshold (0.6375) the baseline still learns a
    # little while the streak builds, as it does while a collapse's streak has not started.
    decisions = run(spec(), [degraded(hit=hit)] * SETTLE)
    assert decisions[-1].has(Diagnosis.CACHE_DEGRADED) is named


@pytest.mark.parametrize(("hit", "inside"), [(0.75, False), (0.7499, True), (0.425, True)])
def test_the_band_edges(hit: float, inside: bool) -> None:
    check = check_collapse(spec(), snapshot(signals(hit=hit)), learned())
    assert check.threshold == pytest.approx(0.425)
    assert in_band(check) is inside


def test_a_collapse_is_a_collapse_not_a_degraded_cache() -> None:
    decisions = run(spec(), [degraded(hit=0.04)] * SETTLE)
    assert decisions[-1].alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions)


def test_a_windowed_rate_falling_to_a_collapse_is_never_named_degraded() -> None:
    # A 5-minute window falls 0.85 → 0.04 over 10 evaluations, the cost rising with it.
    falling = [0.85 - 0.081 * i for i in range(1, 11)]
    decisions = run(spec(), [degraded(hit=h, cost=1100.0) for h in falling + [0.04] * 4])
    assert decisions[-1].alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions)


def test_a_degraded_cache_that_collapses_is_superseded_at_once() -> None:
    decisions = run(spec(), [degraded()] * SETTLE + [degraded(hit=0.04)] * 3)
    assert decisions[SETTLE - 1].alert_active(Diagnosis.CACHE_DEGRADED)
    last = decisions[-1]
    assert last.alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert not last.alert_active(Diagnosis.CACHE_DEGRADED)
    assert [c.reason for c in last.cleared] == [Diagnosis.CACHE_DEGRADED]


def test_eviction_pressure_is_not_a_degraded_cache() -> None:
    pressure = degraded(preemptions_per_second=1.0, running_requests_per_pod=30.0)
    decisions = run(spec(), [pressure] * SETTLE)
    assert decisions[-1].has(Diagnosis.EVICTION_PRESSURE)
    assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions)


def test_cold_pods_hold_the_raise_but_not_a_raised_alert() -> None:
    cold = snapshot(
        signals(
            hit=0.56,
            cold_pods=2,
            gpu_seconds_per_1k_requests=800.0,
            prefill_tokens_per_request=1300.0,
        ),
        workload(replicas=13, cold_pods=2),
    )
    rollout = snapshot(degraded().signals, workload(rollout=True))
    for state in (cold, rollout):
        decisions = run(spec(), [state] * (SETTLE + 3))
        assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions)
    # Raised on warm pods, then a scale-out adds two cold ones: the alert stays, and the
    # drop is not called dilution (the old pods fell before the new ones joined).
    decisions = run(spec(), [degraded()] * SETTLE + [cold] * 4)
    assert all(d.alert_active(Diagnosis.CACHE_DEGRADED) for d in decisions[SETTLE - 1 :])
    assert not any(d.has(Diagnosis.CACHE_DILUTED) for d in decisions)


def test_it_clears_halfway_back_and_on_a_rebaseline() -> None:
    # Raised at 0.56; 0.78 is within the drop but not halfway back (0.80): kept.
    hits = [0.56] * SETTLE + [0.78] * 3 + [0.82] * 2
    decisions = run(spec(), [degraded(hit=h) for h in hits])
    active = [d.alert_active(Diagnosis.CACHE_DEGRADED) for d in decisions[SETTLE - 1 :]]
    assert active == [True, True, True, True, True, False]
    assert [c.reason for c in decisions[-1].cleared] == [Diagnosis.CACHE_DEGRADED]
    assert decisions[-1].cleared[0].message == (
        "cleared: warm-pod token hit rate 0.82, back within 0.05 of its baseline 0.85"
    )
    assert cleared(Diagnosis.CACHE_DEGRADED) is AlertCleared.CACHE_DEGRADED
    # A rebaseline accepts the new rate: cleared in that same evaluation.
    human = HumanRequests(rebaseline_at=T0 + SETTLE * INTERVAL)
    again = run(spec(), [degraded()] * SETTLE + [snapshot(degraded().signals, human=human)])
    assert [c.reason for c in again[-1].cleared] == [Diagnosis.CACHE_DEGRADED]
    assert again[-1].cleared[0].message == REBASELINED


def test_the_baseline_is_not_taught_the_degraded_rate() -> None:
    # 0.7 is above the collapse's clearing threshold (0.6375), so only the finding and its
    # alert keep it out of the baseline.
    decisions = run(spec(), [degraded(hit=0.7)] * (SETTLE + 20))
    assert decisions[SETTLE - 1].alert_active(Diagnosis.CACHE_DEGRADED)
    learned_rates = [d.memory.baseline.token_hit_rate for d in decisions[SETTLE - 1 :]]
    assert learned_rates == [learned_rates[0]] * len(learned_rates)
    assert learned_rates[0] == pytest.approx(0.85, abs=0.02)


def test_it_never_changes_scaling(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same evaluations with the check left out of the chain decide the same envelope,
    # batch ceiling and action: the finding pages, it does not act.
    states = [degraded()] * SETTLE + [degraded(ttft_p95_seconds=1.5)] * 4
    policies = (spec(), spec(batching=BATCHING))
    for policy in policies:
        named = run(policy, states)
        assert named[-1].has(Diagnosis.CACHE_DEGRADED)
        without = tuple(c for c in diagnosis.CHECKS if c.__name__ != "_cache_degraded")
        with monkeypatch.context() as patch:
            patch.setattr(diagnosis, "CHECKS", without)
            plain = run(policy, states, learned())
        assert not plain[-1].has(Diagnosis.CACHE_DEGRADED)
        for a, b in zip(named, plain, strict=True):
            assert (a.envelope, a.max_num_seqs, a.reason) == (b.envelope, b.max_num_seqs, b.reason)


def test_without_a_baseline_nothing_is_degraded() -> None:
    # The first evaluation learns 0.56 as the baseline: nothing to fall from.
    decisions = run(spec(), [degraded()] * SETTLE, LearnedState(data_since=T0 - 2 * WINDOW))
    assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions)
