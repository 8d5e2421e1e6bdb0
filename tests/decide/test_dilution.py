"""``CacheDiluted``: pods that joined the fleet explain a lower hit rate; it is said, with
what a prefix-aware router would save, instead of ``CacheDegraded``, and the baseline is
re-learned for the grown fleet once the joined pods have been warm for a window.

The default policy: a 600 s warm-up, a 5 min window read every 30 s, so a pod has joined
for 600 + 2 × 300 = 1,200 s and settles at 900 s. The baseline is 0.85, 400 prefill
tokens per request and 680 GPU-s/1k (``decide_builders``). Two old pods (two hours old)
and six that joined, like a round-robin scale-out from 2 to 8 pods.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cachescale.api.reasons import ConditionReason, Diagnosis
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import Decision, words
from cachescale.decide.checks import Finding, check_collapse
from cachescale.decide.dilution import DilutionInputs, check_dilution
from cachescale.decide.learned import LearnedAlert
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    INTERVAL,
    T0,
    learned,
    pod,
    run,
    signals,
    snapshot,
    spec,
    workload,
)
from tests.decide.test_degraded import raised_at
from tests.decide.test_diagnosis import condition

OLD_AGE = 7200.0
STEP = INTERVAL.total_seconds()


def fleet(
    joined_age: float,
    hit: float,
    *,
    old: int = 2,
    joined: int = 6,
    old_hit: float = 0.85,
    cold_hit: float = 0.1,
    rollout: bool = False,
    **values: float | None,
) -> Snapshot:
    """``old`` pods two hours old hitting ``old_hit``, and ``joined`` pods ``joined_age``
    old hitting ``hit`` once warm (``cold_hit`` before); by default each request prefills
    700 tokens at 760 GPU-s/1k (a material drop, were it degraded)."""
    values.setdefault("prefill_tokens_per_request", 700.0)
    values.setdefault("gpu_seconds_per_1k_requests", 760.0)
    young_hit = hit if joined_age >= 600 else cold_hit
    pooled = (old * old_hit + joined * young_hit) / (old + joined)
    values.setdefault("token_hit_rate_local", pooled)
    engine = signals(hit=hit, warm_pods=0, **values)
    pods = [pod(f"old-{i}", OLD_AGE, old_hit) for i in range(old)]
    pods += [pod(f"new-{i}", joined_age, young_hit) for i in range(joined)]
    ages = (OLD_AGE,) * old + (joined_age,) * joined
    replicas = old + joined
    state = replace(workload(replicas=replicas, rollout=rollout), pod_ages_seconds=ages)
    return snapshot(replace(engine, pods=tuple(pods)), state)


JOINED_HIT = 0.54
"""The joined pods' rate: with two old pods at 0.85, the warm pods pool to 0.6175."""
POOLED = (2 * 0.85 + 6 * JOINED_HIT) / 8


def scale_out(
    first_age: float, evaluations: int, hit: float, **kwargs: float | None
) -> list[Snapshot]:
    """The joined pods ageing one interval per evaluation from ``first_age``."""
    return [fleet(first_age + i * STEP, hit, **kwargs) for i in range(evaluations)]


def diluted(decision: Decision) -> bool:
    return decision.has(Diagnosis.CACHE_DILUTED)


def dilution(decision: Decision) -> Finding:
    return next(f for f in decision.findings if f.diagnosis is Diagnosis.CACHE_DILUTED)


def degraded_raised(decisions: list[Decision]) -> bool:
    return bool(raised_at(decisions))


def test_a_drop_after_a_scale_out_is_dilution_then_the_baseline_follows_the_fleet() -> None:
    # Cold from 300 s to 600 s (the fleet's rate falls), warm from 600 s, settled at 900 s:
    # 24 evaluations, more than the 11 a degraded cache needs.
    decisions = run(spec(), scale_out(300.0, 24, JOINED_HIT))
    assert not degraded_raised(decisions)
    assert not any(d.has(Diagnosis.CACHE_DEGRADED) for d in decisions)
    rates = [d.memory.baseline.token_hit_rate for d in decisions]
    relearned = next(i for i, rate in enumerate(rates) if rate == pytest.approx(POOLED))
    # At 300 + 20 × 30 = 900 s: the joined pods have been warm for a window.
    assert relearned == 20
    assert all(diluted(d) for d in decisions[: relearned + 1])
    assert not any(diluted(d) for d in decisions[relearned + 1 :])
    assert decisions[relearned].memory.baseline.prefill_tokens_per_request == 700.0
    assert decisions[relearned].memory.streaks.degraded == 0
    finding = next(
        f for f in decisions[relearned].findings if f.diagnosis is Diagnosis.CACHE_DILUTED
    )
    assert finding.evidence.endswith(
        "the pods that joined first have been warm for a window: the hit-rate baseline is "
        "re-learned at "
        "0.62 for 8 pods (a later fall is measured from it)"
    )
    assert decisions[-1].state is Diagnosis.HEALTHY


def test_the_message_says_dilution_and_what_prefix_aware_routing_would_save() -> None:
    decisions = run(spec(), scale_out(600.0, 4, JOINED_HIT))
    last = decisions[-1]
    assert last.state is Diagnosis.CACHE_DILUTED
    finding = dilution(last)
    assert last.extra_cost is not None
    assert last.extra_cost.gpu_seconds_per_1k == pytest.approx(760.0 - 680.0)
    for fragment in (
        "warm-pod token hit rate 0.85 → 0.62 since 6 of 8 ready pods joined in the last 12 min "
        "(the 2 that served before hit 0.85): dilution, not a degraded cache",
        f"a prefix-aware router would save up to {words.ratio(0.85 - POOLED)} of the prompt "
        "tokens and 300 prefill tokens per request (400 → 700)",
        last.extra_cost.words(),
        "re-learned for the grown fleet once the pods that joined first have been warm for a "
        "window",
    ):
        assert fragment in finding.evidence
    assert not last.alerts
    status, reason = condition(last, ConditionType.CACHE_HEALTHY)
    assert (status, reason) == (ConditionStatus.TRUE, Diagnosis.CACHE_DILUTED)


def test_while_pods_warm_the_fleet_rate_is_named_with_the_cold_count() -> None:
    # Old pods at their baseline, the fleet's rate pulled down by six cold caches.
    (decision,) = run(spec(), [fleet(300.0, JOINED_HIT)])
    finding = dilution(decision)
    fleet_rate = (2 * 0.85 + 6 * 0.1) / 8
    assert finding.evidence.startswith(
        f"fleet token hit rate {words.ratio(fleet_rate)} against a warm-pod baseline of 0.85 "
        "since 6 of 8 ready pods joined in the last 5 min, 6 still warming"
    )
    assert f"save up to {words.ratio(0.85 - fleet_rate)} of the prompt tokens" in finding.evidence
    assert decision.has(Diagnosis.COLD_FLEET)


def test_only_a_diluted_warm_rate_is_relearned() -> None:
    # The first six joined pods settled at 0.80 (warm pods pool to 0.81, within the drop);
    # two more are still cold and pull the fleet's rate down: dilution is said, and the
    # baseline stays (it learns as usual, a 120th of the gap).
    base = fleet(1000.0, 0.80, token_hit_rate_local=(2 * 0.85 + 6 * 0.80 + 2 * 0.1) / 10)
    cold = (pod("cold-0", 60.0, 0.1), pod("cold-1", 60.0, 0.1))
    ages = (*base.workload.pod_ages_seconds, 60.0, 60.0)
    state = snapshot(
        replace(base.signals, pods=base.signals.pods + cold),
        replace(base.workload, replicas=10, ready_replicas=10, pod_ages_seconds=ages),
    )
    (decision,) = run(spec(), [state])
    assert dilution(decision).evidence.startswith("fleet token hit rate 0.67")
    assert decision.memory.baseline.token_hit_rate == pytest.approx(0.85, abs=0.001)


def test_a_degradation_on_the_grown_fleet_is_still_named() -> None:
    # Re-learned at 0.62 at 900 s; the rate holds, then every pod falls to 0.45 with more
    # prefill after the joined pods settled: measured from 0.62, a degraded cache.
    settled = scale_out(300.0, 21, JOINED_HIT)
    steady = [fleet(930.0 + i * STEP, JOINED_HIT) for i in range(4)]
    fall = [
        fleet(1050.0 + i * STEP, 0.45, old_hit=0.45, prefill_tokens_per_request=950.0)
        for i in range(11)
    ]
    decisions = run(spec(), settled + steady + fall)
    assert decisions[20].memory.baseline.token_hit_rate == pytest.approx(POOLED)
    assert not any(diluted(d) for d in decisions[21:])
    last = decisions[-1]
    assert last.alert_active(Diagnosis.CACHE_DEGRADED)
    (alert,) = last.alerts
    assert "warm-pod token hit rate 0.62 → 0.45 over 11 evaluations" in alert.message


def test_a_drop_that_began_before_the_pods_joined_stays_degraded() -> None:
    # Eight old pods fall to 0.56 (a truncation); 3 minutes later the HPA adds two pods
    # for the dearer requests: the fall is not theirs, and it is named once they are warm.
    def truncated(age: float, joined: int) -> Snapshot:
        return fleet(
            age, 0.56, old=8, joined=joined, old_hit=0.56, prefill_tokens_per_request=1300.0
        )

    before = [truncated(0.0, 0) for _ in range(6)]
    with_pods = [truncated(STEP + i * STEP, 2) for i in range(20)]
    decisions = run(spec(), before + with_pods)
    assert not any(diluted(d) for d in decisions)
    assert raised_at(decisions) == [len(decisions) - 1]  # the first with both pods warm


def test_a_fall_of_the_pods_that_served_before_is_not_dilution() -> None:
    # Pods joined and the warm rate fell with them, but the old pods fell as far: the
    # joined pods do not explain it.
    joined_only = scale_out(600.0, 3, JOINED_HIT)
    everyone = scale_out(600.0, 3, JOINED_HIT, old_hit=JOINED_HIT)
    assert diluted(run(spec(), joined_only)[-1])
    assert not any(diluted(d) for d in run(spec(), everyone))


@pytest.mark.parametrize(("arrivals", "named"), [(32.0 * 1.2 - 0.1, False), (32.0 * 1.2, True)])
def test_old_pods_that_fell_with_demand_growth_are_dilution(arrivals: float, named: bool) -> None:
    # Demand at 1.2 × the baseline's 32 req/s called the pods in: the old pods lost their
    # share of each prefix's requests to them (a session's next turn lands elsewhere).
    states = scale_out(600.0, 3, JOINED_HIT, old_hit=JOINED_HIT, arrivals_per_second=arrivals)
    assert diluted(run(spec(), states)[-1]) is named


@pytest.mark.parametrize("case", ["rollout", "no old pods", "collapse", "eviction"])
def test_nothing_else_is_called_dilution(case: str) -> None:
    if case == "rollout":
        states = scale_out(600.0, 3, JOINED_HIT, rollout=True)
    elif case == "no old pods":
        states = [fleet(700.0 + i * STEP, JOINED_HIT, old=0, joined=8) for i in range(3)]
    elif case == "collapse":
        states = scale_out(600.0, 6, 0.04, old_hit=0.04)
    else:
        states = scale_out(
            600.0, 3, JOINED_HIT, preemptions_per_second=1.0, running_requests_per_pod=30.0
        )
    decisions = run(spec(), states)
    assert not any(diluted(d) for d in decisions)


def test_an_active_degraded_alert_is_never_called_dilution() -> None:
    # Once raised, a scale-out does not turn CacheDegraded into dilution.
    state = fleet(600.0, JOINED_HIT)
    memory = learned()
    check = check_collapse(spec(), state, memory)
    inputs = DilutionInputs(collapse=check, explained=False, streak=1, extra=None)
    assert check_dilution(spec(), state, memory, inputs) is not None
    alert = LearnedAlert(reason=Diagnosis.CACHE_DEGRADED, since=T0, message="degraded")
    alerted = memory.model_copy(update={"alerts": [alert]})
    assert check_dilution(spec(), state, alerted, inputs) is None


def test_it_never_changes_scaling_before_the_baseline_follows() -> None:
    # Until the re-learn, the same evaluations on a fleet of old pods decide the same
    # envelope and ceiling: the finding itself does not act.
    joined = run(spec(), scale_out(600.0, 8, JOINED_HIT))
    old = run(spec(), [fleet(0.0, POOLED, old=8, joined=0, old_hit=POOLED) for _ in range(8)])
    for a, b in zip(joined, old, strict=True):
        assert (a.envelope, a.max_num_seqs) == (b.envelope, b.max_num_seqs)
        assert a.memory.baseline.token_hit_rate == b.memory.baseline.token_hit_rate


def test_a_cleared_metrics_alert_says_it_is_cleared_and_why() -> None:
    missing = snapshot(signals(requests_per_second=None))
    decisions = run(spec(), [missing] * 3 + [snapshot()])
    (change,) = decisions[-1].cleared
    assert change.reason is Diagnosis.METRICS_UNAVAILABLE
    assert change.message == (
        f"cleared: every required signal is read again, 90 s after data went missing at {T0:%H:%M}"
    )
    assert "series absent" not in change.message
    assert ConditionReason.SIGNALS_READ in {c.reason for c in decisions[-1].conditions}
