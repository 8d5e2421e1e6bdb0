"""Alerts (``decide.alerts``): which diagnoses raise, keep or clear one and what it says,
through ``decide`` and as tables of ``alert_rules`` and ``reconcile_alerts`` cases."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from cachescale.api.reasons import Action, Diagnosis, Hold
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.alerts import alert_rules, reconcile_alerts
from cachescale.decide.batching import BatchPlan
from cachescale.decide.checks import CollapseCheck, Finding
from cachescale.decide.diagnosis import over_baseline
from cachescale.decide.envelope import Envelope, EnvelopePlan
from cachescale.decide.learned import LearnedAlert, LearnedBaseline, LearnedState, Streaks
from cachescale.decide.slo_guard import Drain
from cachescale.decide.thresholds import RECOVERY_EVALUATIONS
from cachescale.snapshot import Measured, Snapshot, Unit
from tests.decide.decide_builders import (
    T0,
    dearer_cache_without_a_queue,
    learned,
    run,
    signals,
    snapshot,
    spec,
    workload,
)


def test_slo_at_risk_at_the_budget_cap_while_pods_start_does_not_ask_for_a_budget() -> None:
    # 2 of the 12 pods still starting: what the 10 ready pods served needs no more than
    # the budget's 12, so no estimate, and the alert says no need beyond the 12 is
    # measured yet, not that the budget must grow.
    engine = dearer_cache_without_a_queue(running_per_pod=30.0)
    starting = snapshot(engine, workload(replicas=12, ready=10, hpa=(4, 12, 24.0)))
    *_, last = run(spec(), [starting] * 3)
    assert last.slo_needed_replicas is None
    message = next(a.message for a in last.alerts if a.reason == "SLOAtRisk")
    assert "with replicas at the 12 the budget of 780 GPU-s/1k allows while 2 of them start" in (
        message
    )
    assert "no need beyond it is measured yet" in message
    assert "larger budget" not in message


def test_slo_alert_names_the_trade_off_when_the_budget_forbids_scaling() -> None:
    # Prefill per request 1.5 × the 400 baseline: dearer requests, so the budget binds (at
    # a steady cost maxReplicas would leave the HPA room: decide.headroom.demand_headroom).
    engine = signals(ttft_p95_seconds=1.5, prefill_tokens_per_request=600.0)
    decisions = run(spec(), [snapshot(engine, workload(replicas=12, hpa=(4, 12, 24.0)))] * 3)
    (raised,) = decisions[-1].raised
    assert raised.reason == Diagnosis.SLO_AT_RISK
    assert "replicas at the 12 the budget of 780 GPU-s/1k allows" in raised.message


# --- alert_rules, case by case ----------------------------------------------------------
#
# Each found diagnosis carries the evidence "E"; the messages below are that evidence and
# the rule's words. The builders' defaults: a Hold policy (budget 780 GPU-s/1k, replicas
# 4..40, collapseWindows 3), 11 ready pods at the 680 GPU-s/1k baseline cost (no cost over
# it to quote), TTFT p95 0.5 s. ``MetricsUnavailable`` always clears at once: every
# evaluation that reaches the rules read its signals. An absent condition is *quiet*
# (cleared after RECOVERY_EVALUATIONS), a found one not yet sustained is neither.

COLLAPSE, EVICTION, DEGRADED, OVER, SLO = (
    Diagnosis.PREFIX_COLLAPSE,
    Diagnosis.EVICTION_PRESSURE,
    Diagnosis.CACHE_DEGRADED,
    Diagnosis.OVER_BUDGET,
    Diagnosis.SLO_AT_RISK,
)
ALL_QUIET = frozenset({EVICTION, DEGRADED, OVER, SLO})
METRICS = frozenset({Diagnosis.METRICS_UNAVAILABLE})
SUSTAINED = Streaks(eviction=3, over_budget=3, slo_breach=3)
"""Every streak the rules wait for at ``collapseWindows`` (3)."""
CLEARING_THRESHOLD = 0.6375
"""Halfway back from the collapse threshold 0.425 (0.85 × 0.5) to the 0.85 baseline."""


def envelope_plan(
    max_replicas: int = 12,
    *,
    budget_max: int | None = 12,
    held_by: Hold | None = None,
    slo_guard: bool = False,
    slo_needed: int | None = None,
    drain: Drain | None = None,
) -> EnvelopePlan:
    """The envelope 4..``max_replicas`` as planned."""
    return EnvelopePlan(
        Envelope(4, max_replicas, 24.0),
        budget_max,
        held_by,
        slo_guard,
        learned(),
        slo_needed=slo_needed,
        drain=drain,
    )


def at_replicas(replicas: int, ready: int | None = None, **values: float) -> Snapshot:
    """``replicas`` pods (``ready`` of them ready), the HPA at 4..40."""
    return snapshot(signals(**values), workload(replicas=replicas, ready=ready))


@dataclass(frozen=True)
class AlertCase:
    """One evaluation's findings and plans, and what ``alert_rules`` must want."""

    name: str
    found: tuple[Diagnosis, ...] = ()
    wanted: Mapping[Diagnosis, str] = field(default_factory=dict)
    """Raised or kept, with a message that starts so."""
    quiet: frozenset[Diagnosis] = ALL_QUIET
    clear_now: frozenset[Diagnosis] = METRICS
    clear_messages: Mapping[Diagnosis, str] = field(default_factory=dict)
    policy: CacheScalingPolicySpec = field(default_factory=spec)
    state: Snapshot = field(default_factory=snapshot)
    memory: LearnedState = field(default_factory=lambda: learned(streaks=SUSTAINED))
    plan: EnvelopePlan = field(default_factory=envelope_plan)
    batch: BatchPlan = field(default_factory=lambda: BatchPlan(32, None, ""))
    hpa_wanted: int | None = None


AT_THE_BUDGET = "E with replicas at the 12 the budget of 780 GPU-s/1k allows"

ALERT_CASES = [
    AlertCase("healthy: every alert's condition is absent"),
    AlertCase(
        "a collapse says what was done and the likely cause, and supersedes a degraded cache",
        found=(COLLAPSE,),
        wanted={
            COLLAPSE: "E; replicas held at 11 instead of the 14 the HPA wanted; likely cause: "
            "requests stopped sharing prefixes without more prefill per request"
        },
        quiet=frozenset({EVICTION, OVER, SLO}),
        clear_now=METRICS | {DEGRADED},
        plan=envelope_plan(11, budget_max=19, held_by=Hold.COLLAPSE),
        hpa_wanted=14,
    ),
    AlertCase(
        "a collapse quotes what it costs over the baseline",
        # 1,100 − 680 = 420 GPU-s/1k; 420 × 32 × 86,400 / 1,000 / 3,600 = 322.56 GPU-h/day.
        found=(COLLAPSE,),
        wanted={
            COLLAPSE: "E; this costs 420 GPU-s per 1k requests over the baseline, 323 "
            "GPU-hours per day (learned baseline 680 GPU-s/1k); replicas held at 11"
        },
        quiet=frozenset({EVICTION, OVER, SLO}),
        clear_now=METRICS | {DEGRADED},
        state=snapshot(signals(gpu_seconds_per_1k_requests=1100.0)),
        plan=envelope_plan(11, budget_max=19, held_by=Hold.COLLAPSE),
    ),
    AlertCase(
        "a collapse the hit rate recovered from clears at once, as healed",
        clear_now=METRICS | {COLLAPSE},
        clear_messages={
            COLLAPSE: "healed after 14 min (onset 11:46) with no human action: warm-pod token hit "
            "rate back to 0.85"
        },
        memory=learned(
            streaks=Streaks(recovered=RECOVERY_EVALUATIONS),
            alerts=[LearnedAlert(reason=COLLAPSE, since=T0 - timedelta(minutes=14), message="m")],
        ),
    ),
    AlertCase(
        "a quiet alert's clearing words quote the reading that cleared it",
        clear_messages={
            OVER: "cleared: 680 GPU-s per 1k requests, within the budget of 780",
            SLO: "cleared: TTFT p95 0.50 s, within the 1.00 s SLO",
            EVICTION: "cleared: preemptions 0.0% of requests, no sustained eviction pressure",
            DEGRADED: "cleared: warm-pod token hit rate 0.85, back within 0.05 of its baseline "
            "0.85",
        },
        memory=learned(
            streaks=SUSTAINED,
            alerts=[
                LearnedAlert(reason=reason, since=T0, message="held")
                for reason in (OVER, SLO, EVICTION, DEGRADED)
            ],
        ),
    ),
    AlertCase(
        "a quiet alert with no reading to quote says nothing of its own",
        memory=learned(
            streaks=SUSTAINED, alerts=[LearnedAlert(reason=OVER, since=T0, message="held")]
        ),
        state=snapshot(signals(gpu_seconds_per_1k_requests=None)),
    ),
    AlertCase(
        "a recovery with no collapse alert has nothing to say",
        clear_now=METRICS | {COLLAPSE},
        memory=learned(streaks=Streaks(recovered=RECOVERY_EVALUATIONS)),
    ),
    AlertCase(
        "a rebaseline clears what was measured against the old hit rate",
        quiet=frozenset({EVICTION, OVER, SLO}),
        clear_now=METRICS | {COLLAPSE, DEGRADED},
        memory=learned(baseline=LearnedBaseline(gpu_seconds_per_1k_requests=680.0)),
    ),
    AlertCase(
        "sustained eviction the ceiling is not lowered for",
        found=(EVICTION,),
        wanted={
            EVICTION: "E; ceiling not lowered now: --max-num-seqs is not managed by this policy"
        },
        quiet=frozenset({DEGRADED, OVER, SLO}),
    ),
    AlertCase(
        "sustained eviction with a change blocked says what blocks it",
        found=(EVICTION,),
        wanted={EVICTION: "E; ceiling not lowered now: a rollout is in progress"},
        quiet=frozenset({DEGRADED, OVER, SLO}),
        batch=BatchPlan(128, None, "why; blocked", "a rollout is in progress"),
    ),
    AlertCase(
        "sustained eviction the ceiling is being lowered for raises nothing",
        found=(EVICTION,),
        quiet=frozenset({DEGRADED, OVER, SLO}),
        batch=BatchPlan(96, Action.LOWERED_MAX_NUM_SEQS, "--max-num-seqs 128 → 96"),
    ),
    AlertCase(
        "an active eviction alert says the ceiling is being lowered, never that it is not",
        found=(EVICTION,),
        wanted={EVICTION: "E; --max-num-seqs 128 → 96"},
        quiet=frozenset({DEGRADED, OVER, SLO}),
        memory=learned(
            streaks=SUSTAINED,
            alerts=[LearnedAlert(reason=EVICTION, since=T0, message="E; ceiling not lowered")],
        ),
        batch=BatchPlan(96, Action.LOWERED_MAX_NUM_SEQS, "--max-num-seqs 128 → 96"),
    ),
    AlertCase(
        "eviction not yet sustained raises nothing and clears nothing",
        found=(EVICTION,),
        quiet=frozenset({DEGRADED, OVER, SLO}),
        memory=learned(streaks=Streaks(eviction=2)),
    ),
    AlertCase(
        "a degraded cache says scaling is unchanged and what to check",
        found=(DEGRADED,),
        wanted={
            DEGRADED: "E; scaling is unchanged (a finding, not a hold or a cap: the HPA scales "
            "on its own metric inside the envelope); likely cause: the cache keeps or finds less"
        },
        quiet=frozenset({EVICTION, OVER, SLO}),
    ),
    AlertCase(
        "a collapse building keeps a degraded alert",
        quiet=frozenset({EVICTION, OVER, SLO}),
        memory=learned(streaks=Streaks(collapse=1)),
    ),
    AlertCase(
        "sustained over budget says where maxReplicas is capped",
        found=(OVER,),
        wanted={OVER: "E; maxReplicas capped at 12"},
        quiet=frozenset({EVICTION, DEGRADED, SLO}),
    ),
    AlertCase(
        "over budget quotes the learned baseline its extra cost is counted from",
        # 1,100 − 680 = 420 GPU-s/1k over the baseline the decision learned, quoted as such.
        found=(OVER,),
        wanted={
            OVER: "E; this costs 420 GPU-s per 1k requests over the baseline, 323 GPU-hours "
            "per day (learned baseline 680 GPU-s/1k); maxReplicas capped at 12"
        },
        quiet=frozenset({EVICTION, DEGRADED, SLO}),
        state=snapshot(signals(gpu_seconds_per_1k_requests=1100.0)),
    ),
    AlertCase(
        "over budget with maxReplicas at what the SLO needs says so",
        found=(OVER,),
        wanted={OVER: "E; maxReplicas 17, what the SLO needs at the current cost (SLO first)"},
        quiet=frozenset({EVICTION, DEGRADED, SLO}),
        plan=envelope_plan(17, slo_guard=True, slo_needed=17),
    ),
    AlertCase(
        "over budget not yet sustained raises nothing",
        found=(OVER,),
        quiet=frozenset({EVICTION, DEGRADED, SLO}),
        memory=learned(streaks=Streaks(over_budget=2)),
    ),
    AlertCase(
        "a breach at the budget's cap names the budget",
        found=(SLO,),
        wanted={SLO: f"{AT_THE_BUDGET}: meeting the SLO needs a larger budget or cheaper requests"},
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(12),
    ),
    AlertCase(
        "a breach below the cap is the HPA's to answer",
        found=(SLO,),
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(11),
    ),
    AlertCase(
        "a breach not yet sustained raises nothing",
        found=(SLO,),
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(12),
        memory=learned(streaks=Streaks(slo_breach=2)),
    ),
    AlertCase(
        "a breach at budget.maxReplicas names the hard cap",
        found=(SLO,),
        wanted={
            SLO: "E with replicas at budget.maxReplicas 40, the hard cap: meeting the SLO needs "
            "a larger maxReplicas or cheaper requests"
        },
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(40),
        plan=envelope_plan(40),
    ),
    AlertCase(
        "a breach while a backlog drains names the drain",
        found=(SLO,),
        wanted={
            SLO: "E with replicas at 18, to drain 1,800 waiting requests within 10 min (the SLO "
            "needs 17 once they are served; the budget allows 12)"
        },
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(18),
        plan=envelope_plan(18, slo_guard=True, slo_needed=17, drain=Drain(1800, 18)),
    ),
    AlertCase(
        "a breach at what the SLO needed names the estimate",
        found=(SLO,),
        wanted={
            SLO: "E with replicas at 17, what the SLO needed at the last estimate (the budget "
            "allows 12)"
        },
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(17),
        plan=envelope_plan(17, slo_guard=True, slo_needed=17),
    ),
    AlertCase(
        "a breach at the budget's cap while pods start asks for nothing yet",
        found=(SLO,),
        wanted={SLO: f"{AT_THE_BUDGET} while 2 of them start: no need beyond it is measured yet"},
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        state=at_replicas(12, ready=10),
    ),
    AlertCase(
        "a breach under CapAtBudget says latency is sacrificed",
        found=(SLO,),
        wanted={
            SLO: "E with replicas capped at the budget's 12: latency is being sacrificed to the "
            "budget (onCollapse: CapAtBudget): TTFT p95 2.50 s against the 1.00 s SLO; the "
            "SLO needs 17 replicas at the current cost"
        },
        quiet=frozenset({EVICTION, DEGRADED, OVER}),
        policy=spec(cache={"onCollapse": "CapAtBudget"}),
        state=at_replicas(12, ttft_p95_seconds=2.5),
        plan=envelope_plan(12, slo_needed=17),
    ),
]


@pytest.mark.parametrize("case", ALERT_CASES, ids=lambda case: case.name)
def test_alert_rules(case: AlertCase) -> None:
    check = CollapseCheck(Measured.known(0.85, Unit.RATIO), 11, 0.85, 0.425, CLEARING_THRESHOLD)
    found = tuple(Finding(diagnosis, "E") for diagnosis in case.found)
    rules = alert_rules(
        case.policy,
        case.state,
        case.memory,
        found,
        case.plan,
        case.batch,
        case.hpa_wanted,
        collapse_check=check,
        extra=over_baseline(case.state, case.memory),
        now=T0,
    )
    assert rules.wanted.keys() == case.wanted.keys()
    for reason, start in case.wanted.items():
        assert rules.wanted[reason].startswith(start), rules.wanted[reason]
    assert (rules.quiet, rules.clear_now) == (case.quiet, case.clear_now)
    assert rules.clear_messages.keys() == case.clear_messages.keys()
    for reason, start in case.clear_messages.items():
        assert rules.clear_messages[reason].startswith(start), rules.clear_messages[reason]


# --- reconcile_alerts, case by case -----------------------------------------------------
#
# RECOVERY_EVALUATIONS is 2: an alert clears on its second quiet evaluation in a row.

RAISED_AT = T0 - timedelta(hours=1)


def active(reason: Diagnosis, quiet_evaluations: int = 0) -> LearnedAlert:
    """An alert raised an hour ago saying "old"."""
    return LearnedAlert(
        reason=reason, since=RAISED_AT, message="old", quiet_evaluations=quiet_evaluations
    )


@dataclass(frozen=True)
class ReconcileCase:
    """The active alerts and one evaluation's rules, and what reconciling them leaves."""

    name: str
    alerts: tuple[LearnedAlert, ...]
    wanted: Mapping[Diagnosis, str]
    quiet: frozenset[Diagnosis]
    after: tuple[tuple[Diagnosis, str, int], ...]
    """Each alert left: reason, message, quiet evaluations."""
    raised: tuple[tuple[Diagnosis, str], ...] = ()
    cleared: tuple[tuple[Diagnosis, str], ...] = ()
    clear_now: frozenset[Diagnosis] = frozenset()
    keep_counters: bool = False


RECONCILE_CASES = [
    ReconcileCase(
        "a new condition raises an alert",
        (),
        {SLO: "new"},
        frozenset(),
        after=((SLO, "new", 0),),
        raised=((SLO, "new"),),
    ),
    ReconcileCase(
        "a kept alert takes the fresh message",
        (active(SLO),),
        {SLO: "new"},
        frozenset(),
        after=((SLO, "new", 0),),
    ),
    ReconcileCase(
        "one quiet evaluation is counted",
        (active(SLO),),
        {},
        frozenset({SLO}),
        after=((SLO, "old", 1),),
    ),
    ReconcileCase(
        "the second quiet evaluation in a row clears it",
        (active(SLO, quiet_evaluations=1),),
        {},
        frozenset({SLO}),
        after=(),
        cleared=((SLO, "cleared: it no longer holds (it last read: old)"),),
    ),
    ReconcileCase(
        "the condition back resets the count",
        (active(SLO, quiet_evaluations=1),),
        {SLO: "again"},
        frozenset(),
        after=((SLO, "again", 0),),
    ),
    ReconcileCase(
        "neither wanted nor quiet: kept as it is, the count reset",
        (active(OVER, quiet_evaluations=1),),
        {},
        frozenset(),
        after=((OVER, "old", 0),),
    ),
    ReconcileCase(
        "clear now clears at once",
        (active(COLLAPSE), active(SLO)),
        {SLO: "new"},
        frozenset(),
        after=((SLO, "new", 0),),
        cleared=((COLLAPSE, "cleared: it no longer holds (it last read: old)"),),
        clear_now=frozenset({COLLAPSE}),
    ),
    ReconcileCase(
        "keeping the counters holds a quiet alert where it was",
        (active(SLO, quiet_evaluations=1),),
        {},
        frozenset({SLO}),
        after=((SLO, "old", 1),),
        keep_counters=True,
    ),
]


@pytest.mark.parametrize("case", RECONCILE_CASES, ids=lambda case: case.name)
def test_reconcile_alerts(case: ReconcileCase) -> None:
    left, raised, cleared = reconcile_alerts(
        list(case.alerts),
        dict(case.wanted),
        set(case.quiet),
        T0,
        case.clear_now,
        keep_counters=case.keep_counters,
    )
    assert tuple((a.reason, a.message, a.quiet_evaluations) for a in left) == case.after
    assert all(a.since == (T0 if (a.reason, a.message) in case.raised else RAISED_AT) for a in left)
    assert tuple((c.reason, c.message) for c in raised) == case.raised
    assert tuple((c.reason, c.message) for c in cleared) == case.cleared


def test_a_clearing_alert_says_what_it_was_told() -> None:
    _, _, cleared = reconcile_alerts(
        [active(COLLAPSE)],
        {},
        set(),
        T0,
        frozenset({COLLAPSE}),
        clear_messages={COLLAPSE: "healed"},
    )
    assert [(c.reason, c.message) for c in cleared] == [(COLLAPSE, "healed")]
