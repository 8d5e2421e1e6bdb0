"""Alerts: which diagnoses raise one, when it clears, and the Events each change makes.

An alert is a diagnosis that needs a human: a confirmed collapse, eviction pressure the
ceiling could not fix, a degraded cache that costs enough to matter, an SLO at risk with
replicas at the cap, a sustained budget overrun, missing metrics (``docs/decisions.md``,
"Alerts at a glance"). ``alert_rules`` says what this evaluation wants raised, kept or
cleared; ``reconcile_alerts`` applies it to the active alerts and returns what changed,
so each raise or clear is one Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide import words
from cachescale.decide.batching import BatchPlan, eviction_words
from cachescale.decide.checks import CollapseCheck, Finding, likely_cause
from cachescale.decide.clearing import cleared_words, fallback
from cachescale.decide.degraded import DEGRADED_ACTION, degraded_cause
from cachescale.decide.demand import ExtraCost
from cachescale.decide.envelope import EnvelopePlan
from cachescale.decide.healing import healed_words
from cachescale.decide.learned import LearnedAlert, LearnedState
from cachescale.decide.messages import collapse_action, sacrifice_words, sacrificed
from cachescale.decide.thresholds import RECOVERY_EVALUATIONS
from cachescale.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class AlertChange:
    """An alert raised or cleared by this evaluation (each becomes one Event)."""

    reason: Diagnosis
    message: str


@dataclass(frozen=True, slots=True)
class AlertRules:
    """What one evaluation wants done to the alerts."""

    wanted: dict[Diagnosis, str]
    """Raise or keep, with this fresh message."""
    quiet: set[Diagnosis]
    """The condition is absent this evaluation (clears after ``RECOVERY_EVALUATIONS``)."""
    clear_now: frozenset[Diagnosis]
    """Clear at once: its own recovery rule already held."""
    extra_cost: ExtraCost | None = None
    """The cost over the baseline the messages quote."""
    clear_messages: Mapping[Diagnosis, str] = field(default_factory=dict)
    """What a clearing alert's Event says (``decide.clearing``)."""


def alert_rules(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    findings: tuple[Finding, ...],
    plan: EnvelopePlan,
    batch: BatchPlan,
    hpa_wanted: int | None,
    *,
    collapse_check: CollapseCheck,
    extra: ExtraCost | None,
    now: datetime,
) -> AlertRules:
    """Which alerts to raise (or keep, with a fresh message) and which to clear; a
    collapse alert the hit rate recovered from clears as healed (``decide.healing``)."""
    by = {f.diagnosis: f for f in findings}
    windows = spec.cache.collapse_windows
    streaks = learned.streaks
    wanted: dict[Diagnosis, str] = {}
    clear_now = {Diagnosis.METRICS_UNAVAILABLE}
    clear_messages: dict[Diagnosis, str] = dict(metrics_back(learned, now))
    clearing: set[Diagnosis] = set()
    costs = f"; {extra.words()}" if extra is not None else ""
    p95 = snapshot.signals.ttft_p95_seconds
    collapse = by.get(Diagnosis.PREFIX_COLLAPSE)
    if collapse is not None:
        wanted[Diagnosis.PREFIX_COLLAPSE] = (
            f"{collapse.evidence}{costs}; {collapse_action(spec, plan, hpa_wanted, p95)}; "
            f"likely cause: {likely_cause(snapshot, learned.baseline)}"
        )
    elif learned.baseline.token_hit_rate is None:  # a rebaseline accepted the new rate
        clear_now.add(Diagnosis.PREFIX_COLLAPSE)
    elif streaks.recovered >= RECOVERY_EVALUATIONS:
        clear_now.add(Diagnosis.PREFIX_COLLAPSE)
        alert = learned.alert(Diagnosis.PREFIX_COLLAPSE)
        if alert is not None:
            clear_messages[Diagnosis.PREFIX_COLLAPSE] = healed_words(
                alert, learned.collapse_evidence, collapse_check, now
            )
    eviction = by.get(Diagnosis.EVICTION_PRESSURE)
    evicting = eviction is not None and streaks.eviction >= windows
    if evicting and (batch.reason is None or learned.alert(Diagnosis.EVICTION_PRESSURE)):
        # Raised when the ceiling could not be lowered; an active one says what this
        # evaluation did to it, a lowering included.
        assert eviction is not None
        wanted[Diagnosis.EVICTION_PRESSURE] = f"{eviction.evidence}; {eviction_words(batch)}"
    elif eviction is None:
        clearing.add(Diagnosis.EVICTION_PRESSURE)
    degraded = by.get(Diagnosis.CACHE_DEGRADED)
    if degraded is not None:
        wanted[Diagnosis.CACHE_DEGRADED] = (
            f"{degraded.evidence}; {DEGRADED_ACTION}; likely cause: "
            f"{degraded_cause(snapshot, learned)}"
        )
    elif collapse is not None or learned.baseline.token_hit_rate is None:
        # A collapse supersedes it; a rebaseline accepts the new rate.
        clear_now.add(Diagnosis.CACHE_DEGRADED)
    elif not streaks.collapse:  # a collapse building keeps it until it supersedes it
        clearing.add(Diagnosis.CACHE_DEGRADED)
    over = by.get(Diagnosis.OVER_BUDGET)
    if over is not None and streaks.over_budget >= windows:
        wanted[Diagnosis.OVER_BUDGET] = (
            f"{over.evidence}{costs}; maxReplicas {_max_replicas_words(spec, plan)}"
        )
    elif over is None:
        clearing.add(Diagnosis.OVER_BUDGET)
    slo = by.get(Diagnosis.SLO_AT_RISK)
    at_cap = snapshot.workload.replicas >= plan.envelope.max_replicas
    max_replicas = plan.envelope.max_replicas
    if slo is not None and streaks.slo_breach >= windows and at_cap:
        if sacrificed(spec, plan):
            wanted[Diagnosis.SLO_AT_RISK] = (
                f"{slo.evidence} with replicas capped at the budget's {max_replicas}: "
                f"{sacrifice_words(spec, plan, p95)}"
            )
        elif max_replicas >= spec.budget.max_replicas:
            wanted[Diagnosis.SLO_AT_RISK] = (
                f"{slo.evidence} with replicas at budget.maxReplicas {max_replicas}, the hard cap: "
                "meeting the SLO needs a larger maxReplicas or cheaper requests"
            )
        elif plan.drain is not None and max_replicas >= plan.drain.replicas:
            wanted[Diagnosis.SLO_AT_RISK] = (
                f"{slo.evidence} with replicas at {max_replicas}, {plan.drain.purpose()} (the SLO "
                f"needs {plan.slo_needed} once they are served; the budget allows "
                f"{plan.budget_max})"
            )
        elif plan.slo_needed is not None and max_replicas >= plan.slo_needed:
            wanted[Diagnosis.SLO_AT_RISK] = (
                f"{slo.evidence} with replicas at {max_replicas}, what the SLO needed at the last "
                f"estimate (the budget allows {plan.budget_max}); the estimate is raised "
                "while requests keep arriving faster than they are served, or the HPA "
                "asks for more replicas than the envelope allows"
            )
        elif (starting := snapshot.workload.replicas - snapshot.workload.ready_replicas) > 0:
            wanted[Diagnosis.SLO_AT_RISK] = (
                f"{slo.evidence} with replicas at the {max_replicas} the budget of "
                f"{words.cost(spec.budget.gpu_seconds_per_1k_requests)} GPU-s/1k allows "
                f"while {starting} of them start: no need beyond it is measured yet "
                "(requests arrive no faster than the ready pods serve them, or what those "
                "pods served needs no more)"
            )
        else:
            wanted[Diagnosis.SLO_AT_RISK] = (
                f"{slo.evidence} with replicas at the {max_replicas} the budget of "
                f"{words.cost(spec.budget.gpu_seconds_per_1k_requests)} GPU-s/1k allows: "
                "meeting the SLO needs a larger budget or cheaper requests"
            )
    elif slo is None:
        clearing.add(Diagnosis.SLO_AT_RISK)
    held = [reason for reason in clearing if learned.alert(reason) is not None]
    clear_messages.update(cleared_words(held, spec, snapshot, collapse_check))
    return AlertRules(wanted, clearing, frozenset(clear_now), extra, clear_messages)


def metrics_back(learned: LearnedState, now: datetime) -> Mapping[Diagnosis, str]:
    """What a clearing ``MetricsUnavailable`` says: cleared, and why (every required
    signal read again, after how long), never the failure it quoted while it held."""
    alert = learned.alert(Diagnosis.METRICS_UNAVAILABLE)
    if alert is None:
        return {}
    gap = (now - alert.since).total_seconds()
    after = f"{gap:.0f} s" if gap < 120 else f"{gap / 60:.0f} min"
    return {
        Diagnosis.METRICS_UNAVAILABLE: (
            f"cleared: every required signal is read again, {after} after data went "
            f"missing at {alert.since:%H:%M}"
        )
    }


def _max_replicas_words(spec: CacheScalingPolicySpec, plan: EnvelopePlan) -> str:
    """What maxReplicas is, and why, for the OverBudget message."""
    max_replicas = plan.envelope.max_replicas
    if plan.drain is not None and max_replicas >= plan.drain.replicas and plan.slo_guard:
        return f"{max_replicas}, {plan.drain.purpose()} (SLO first)"
    if plan.slo_needed is not None and max_replicas >= plan.slo_needed and plan.slo_guard:
        return f"{max_replicas}, what the SLO needs at the current cost (SLO first)"
    if sacrificed(spec, plan):
        return f"capped at {max_replicas} (onCollapse: CapAtBudget)"
    return f"capped at {max_replicas}"


def reconcile_alerts(
    active: list[LearnedAlert],
    wanted: dict[Diagnosis, str],
    quiet: set[Diagnosis],
    now: datetime,
    clear_now: frozenset[Diagnosis] = frozenset(),
    *,
    keep_counters: bool = False,
    clear_messages: Mapping[Diagnosis, str] | None = None,
) -> tuple[tuple[LearnedAlert, ...], tuple[AlertChange, ...], tuple[AlertChange, ...]]:
    """Raise new alerts, refresh kept ones, clear the ones quiet long enough.

    ``wanted``: raise or keep, with a fresh message. ``quiet``: the condition is absent
    this evaluation; the alert clears after ``RECOVERY_EVALUATIONS`` such evaluations in a
    row, so a value hovering at a threshold cannot raise and clear on alternate
    evaluations. ``clear_now``: clear at once (its own recovery rule already held).
    ``clear_messages``: the clearing Event's words (``decide.clearing``; where none, it no
    longer holds and what it last read).
    """
    clear_messages = clear_messages or {}
    result: list[LearnedAlert] = []
    raised: list[AlertChange] = []
    cleared: list[AlertChange] = []
    for alert in active:
        quiet_for = alert.quiet_evaluations + 1 if alert.reason in quiet else 0
        if keep_counters:
            quiet_for = alert.quiet_evaluations
        if alert.reason in clear_now or quiet_for >= RECOVERY_EVALUATIONS:
            message = clear_messages.get(alert.reason) or fallback(alert.message)
            cleared.append(AlertChange(alert.reason, message))
            continue
        message = wanted.pop(alert.reason, alert.message)
        result.append(alert.model_copy(update={"message": message, "quiet_evaluations": quiet_for}))
    for reason, message in wanted.items():
        result.append(LearnedAlert(reason=reason, since=now, message=message))
        raised.append(AlertChange(reason, message))
    return tuple(result), tuple(raised), tuple(cleared)
