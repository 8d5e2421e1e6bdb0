"""``decide(spec, snapshot, memory, now) -> Decision``: one evaluation of one policy.

Pure by construction: the inputs are values, the clock is the ``now`` argument, and the
result says what the HPA envelope and ``--max-num-seqs`` should be, which alerts are
active, what each status condition reads and the memory (a ``LearnedState``) for the next
evaluation. The operator (``gather`` → ``decide`` → ``act``) and the simulator's closed
loop call the same function, which is why the simulator can prove the policy before a
cluster sees it.

This module is the orchestrator (what it returns is ``decision.py``); each step lives
beside it:

1. human requests (acknowledge, rebaseline: ``learned.py``), then two gates here. Anything
   the decision needs unknown means *fail open*: nothing is lowered, maxReplicas returns
   to the user's original (or stays, if higher) so the HPA can scale up on its own
   metric, and ``MetricsUnavailable`` is raised. A window still spanning blank time, or
   only warming pods, means *wait*: report, change nothing;
2. the checks (collapse, eviction, SLO, budget, cold pods, demand) and their streaks, and
   the findings, ordered by ``PRECEDENCE`` (the measurements in ``checks.py``, the chain
   of findings in ``diagnosis.py``);
3. baseline learning (only while healthy) and the pre-collapse mark (``learned.py``);
4. the batch ceiling (``batching.py``), the envelope (``envelope.py``, with the SLO guard in
   ``slo_guard.py`` and its floors in ``slo_floors.py``), the alerts (``alerts.py``), the
   conditions (``conditions.py``) and the words (``messages.py``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from cachescale.api.reasons import Action, Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.alerts import alert_rules, metrics_back, reconcile_alerts
from cachescale.decide.batching import BatchFacts, plan_max_num_seqs, remember_change
from cachescale.decide.checks import Finding
from cachescale.decide.clearing import REBASELINED
from cachescale.decide.conditions import conditions, frozen_conditions
from cachescale.decide.decision import Decision
from cachescale.decide.demand import demand
from cachescale.decide.diagnosis import facts_of, findings, next_streaks, run_checks
from cachescale.decide.dilution import relearn_for_fleet
from cachescale.decide.envelope import (
    Envelope,
    EnvelopeFacts,
    EnvelopePlan,
    frozen_envelope,
    mark_unchanged,
    open_envelope,
    original_envelope,
    plan_envelope,
)
from cachescale.decide.follow_through import tally_step
from cachescale.decide.hpa_metric import hpa_wanted_replicas
from cachescale.decide.learned import (
    REBASELINE_CLEARS,
    LearnedState,
    apply_human_requests,
    learn,
    track_collapse_evidence,
)
from cachescale.decide.messages import action
from cachescale.decide.thresholds import READ_FAILURES_TO_FREEZE, SHORT_GAP_SHARE
from cachescale.snapshot import EngineSignals, FetchFailure, Snapshot

REQUIRED_SIGNALS = ("requests_per_second", "ttft_p95_seconds", "token_hit_rate_local")
"""Without these nothing can be decided; unknown opens the envelope (``open_envelope``)."""


def decide(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: LearnedState, now: datetime
) -> Decision:
    """One evaluation: diagnose, reshape the envelope, manage the ceiling, alert."""
    memory, notes, rebaselined = apply_human_requests(memory, snapshot.human)
    missing = _missing(snapshot)
    if missing:
        memory = memory.model_copy(update={"missing_since": memory.missing_since or now})
        return _frozen(spec, snapshot, memory, now, missing, notes)
    since = _data_since(spec, memory, now)
    memory = memory.model_copy(update={"data_since": since, "missing_since": None})
    if (now - since).total_seconds() < spec.metrics.window_seconds:
        ready_at = since + timedelta(seconds=spec.metrics.window_seconds)
        wait = (
            f"waiting for a full {spec.metrics.window} window of data (until {ready_at:%H:%M:%S})"
        )
        return _waiting(spec, snapshot, memory, now, notes, Action.WAITING_FOR_FULL_WINDOW, wait)
    workload = snapshot.workload
    if workload.ready_replicas and not workload.warm_replicas(spec.cache.pod_warmup_seconds):
        wait = (
            f"waiting for a pod older than {spec.cache.pod_warmup_seconds} s: every cache is "
            "still filling, so hit rates and costs describe the warm-up, not the workload"
        )
        return _waiting(spec, snapshot, memory, now, notes, Action.WAITING_FOR_WARM_PODS, wait)
    return _evaluate(spec, snapshot, memory, now, notes, rebaselined)


# --- the gates --------------------------------------------------------------------------


def _data_since(spec: CacheScalingPolicySpec, memory: LearnedState, now: datetime) -> datetime:
    """Where the trusted data starts: now for a new policy or after a long gap, unchanged
    after a gap of at most ``SHORT_GAP_SHARE`` of the window (bounded by the time since
    the last evaluation with data: the first blind one plus one interval)."""
    since, gap_from = memory.data_since, memory.missing_since
    if since is None or gap_from is None:
        return since or now
    blank = (now - gap_from).total_seconds() + spec.metrics.interval_seconds
    return now if blank > SHORT_GAP_SHARE * spec.metrics.window_seconds else since


RETRIED_FAILURES = frozenset(
    {FetchFailure.UNREACHABLE, FetchFailure.TIMEOUT, FetchFailure.BAD_RESPONSE}
)
"""Read failures that may pass (``READ_FAILURES_TO_FREEZE``); a query Prometheus rejects
or credentials that cannot be read are not retried: they stay until someone fixes them."""


def read_retried(signals: EngineSignals, failed_in_a_row: int, memory: LearnedState) -> bool:
    """Whether an evaluation ends before deciding, its read retried at the next interval:
    the read failed (``RETRIED_FAILURES``) fewer than ``READ_FAILURES_TO_FREEZE`` times in
    a row, this one included, and no ``MetricsUnavailable`` is raised already (an outage
    known before a restart stays frozen)."""
    return (
        signals.failure in RETRIED_FAILURES
        and failed_in_a_row < READ_FAILURES_TO_FREEZE
        and memory.alert(Diagnosis.METRICS_UNAVAILABLE) is None
    )


def _missing(snapshot: Snapshot) -> list[str]:
    """``"signal: why"`` for each required signal that is unknown (all, on a failed read)."""
    signals = snapshot.signals
    if signals.failure is not None:
        reason = signals.token_hit_rate_local.reason or signals.failure.value
        return [f"Prometheus: {reason}"]
    measured = signals.signals()
    return [
        f"{name}: {measured[name].reason}"
        for name in REQUIRED_SIGNALS
        if not measured[name].is_known
    ]


def _frozen(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: LearnedState,
    now: datetime,
    missing: list[str],
    notes: tuple[str, ...],
) -> Decision:
    """Missing data: fail open (``open_envelope``: lower nothing, let the HPA scale up to
    the original envelope), raise MetricsUnavailable, keep every other alert."""
    evidence = "; ".join(missing)
    diagnosis = Diagnosis.METRICS_UNAVAILABLE
    envelope = open_envelope(spec, snapshot, memory)
    reopened = original_envelope(snapshot, memory).max_replicas
    up_to = _open_max_replicas_words(spec, envelope, reopened)
    message = (
        f"not scaling on missing data, nothing lowered; HPA may scale up to {up_to} until "
        f"data returns: {evidence}"
    )
    active, raised, cleared = reconcile_alerts(
        memory.alerts, {diagnosis: message}, set(), now, keep_counters=True
    )
    memory = mark_unchanged(memory, envelope.max_replicas, now)
    memory = memory.model_copy(update={"alerts": list(active)})
    return Decision(
        state=diagnosis,
        findings=(Finding(diagnosis, evidence),),
        envelope=envelope,
        max_num_seqs=snapshot.workload.max_num_seqs,
        reason=Action.FROZEN_ON_MISSING_METRICS,
        message=message,
        alerts=active,
        raised=raised,
        cleared=cleared,
        conditions=frozen_conditions(spec, snapshot, message, evidence),
        memory=memory,
        notes=notes,
    )


def _open_max_replicas_words(
    spec: CacheScalingPolicySpec, envelope: Envelope, original_max: int
) -> str:
    """Where the fail-open maxReplicas comes from: the original envelope, the original
    within the budget's maxReplicas, or the current one kept because it is higher."""
    max_replicas = envelope.max_replicas
    reopened = min(original_max, spec.budget.max_replicas)
    if max_replicas > reopened:
        return f"{max_replicas} (kept: already above the original envelope's {original_max})"
    if reopened < original_max:
        return f"{max_replicas} (the original envelope's {original_max}, within budget.maxReplicas)"
    return f"{max_replicas} (the original envelope)"


def _waiting(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: LearnedState,
    now: datetime,
    notes: tuple[str, ...],
    reason: Action,
    wait: str,
) -> Decision:
    """Signals exist but cannot be trusted yet: the window still spans blank time (data is
    back, or the policy is new), or every pod is warming up. Report what is seen, clear
    MetricsUnavailable, and change nothing (no streak, no baseline, no envelope)."""
    results = run_checks(spec, snapshot, memory)
    facts = facts_of(spec, snapshot, memory, results)
    found = findings(facts)
    active, raised, cleared = reconcile_alerts(
        memory.alerts,
        {},
        set(),
        now,
        frozenset({Diagnosis.METRICS_UNAVAILABLE}),
        keep_counters=True,
        clear_messages=metrics_back(memory, now),
    )
    memory = mark_unchanged(memory, snapshot.workload.hpa.max_replicas, now)
    memory = memory.model_copy(update={"alerts": list(active)})
    message = f"{found[0].evidence}; {wait} before changing anything"
    plan = EnvelopePlan(frozen_envelope(snapshot), None, None, False, memory)
    hpa_wanted = hpa_wanted_replicas(snapshot, snapshot.workload.hpa.target_average_value)
    return Decision(
        state=found[0].diagnosis,
        findings=found,
        envelope=plan.envelope,
        max_num_seqs=snapshot.workload.max_num_seqs,
        reason=reason,
        message=message,
        alerts=active,
        raised=raised,
        cleared=cleared,
        conditions=conditions(spec, snapshot, memory, results, found, plan, hpa_wanted),
        memory=memory,
        ceiling=results.ceiling,  # the B_max an eviction finding quotes
        demand=demand(snapshot),
        notes=notes,
        extra_cost=facts.extra,
    )


# --- a full evaluation ------------------------------------------------------------------


def _evaluate(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: LearnedState,
    now: datetime,
    notes: tuple[str, ...],
    rebaselined: bool,
) -> Decision:
    """A full evaluation. ``memory`` is threaded through the steps, each reading what the
    steps before it left, so their order is part of the rules:

    1. the checks read the memory *as received*: the collapse thresholds come from the
       baseline learned before this evaluation, so a falling hit rate is measured against
       what healthy looked like, not against itself;
    2. the streaks advance, and the collapse evidence widens with them; the findings read
       the new streaks (the ``collapseWindows``-th low evaluation is the one that confirms);
    3. learning comes after the findings, so an unhealthy evaluation never teaches the
       baseline; it also sets the pre-collapse mark the envelope's hold returns to; a
       dilution whose joined pods have settled re-learns the cache half for the grown
       fleet (``dilution.py``);
    4. the batch ceiling is planned before the envelope (a running-requests HPA target is
       kept under the new ceiling), and its change goes into memory, with the cache before
       it, for the cooldown and the follow-through rule;
    5. the envelope planner returns the memory with its stabilization marks, SLO-guard
       factor and hold release;
    6. the alerts read that memory (streaks, baseline) and are written back last, with the
       collapse evidence dropped when the collapse alert clears.
    """
    results = run_checks(spec, snapshot, memory)
    streaks = next_streaks(results, snapshot, memory.streaks)
    memory = memory.model_copy(update={"streaks": streaks})
    memory = track_collapse_evidence(
        memory, demand(snapshot).per_second, results.collapse.warm_hit_rate.value, now
    )
    windows = spec.cache.collapse_windows
    facts = facts_of(spec, snapshot, memory, results)  # before learning moves the baseline
    active_collapse, extra = facts.collapse_active, facts.extra
    found = findings(facts)
    memory = learn(
        memory,
        snapshot,
        frozenset(f.diagnosis for f in found),
        warm_hit_rate=results.collapse.warm_hit_rate.value,
        below_clearing=(
            results.collapse.clear_threshold is not None and not results.collapse.recovered
        ),
        interval_seconds=spec.metrics.interval_seconds,
        now=now,
    )
    memory = relearn_for_fleet(
        spec,
        snapshot,
        memory,
        frozenset(f.diagnosis for f in found),
        results.collapse,
    )
    acknowledged = any(
        a.acknowledged for a in memory.alerts if a.reason == Diagnosis.PREFIX_COLLAPSE
    )
    batch_facts = BatchFacts(
        ceiling=results.ceiling,
        eviction_sustained=streaks.eviction >= windows,
        collapse_active=active_collapse,
        slo_at_risk_sustained=streaks.slo_breach >= windows,
        warm_hit_rate=results.collapse.warm_hit_rate.value,
        baseline_hit_rate=results.collapse.baseline,
        warming=bool(results.cold_pods) or snapshot.workload.rollout_in_progress,
    )
    memory = tally_step(
        memory, snapshot, batch_facts.warm_hit_rate, now, spec.cache.pod_warmup_seconds
    )
    batch = plan_max_num_seqs(spec, snapshot, memory, now, batch_facts)
    memory = remember_change(memory, snapshot, batch_facts, batch, now)
    plan = plan_envelope(
        spec,
        snapshot,
        memory,
        now,
        EnvelopeFacts(
            collapse_held=active_collapse and not acknowledged,
            slo_breached=results.slo_breach,
            budget_max=results.budget_max,
            max_num_seqs=batch.desired,
            over_budget=results.over_budget,
            collapse_active=active_collapse,
            requests_got_dearer=results.requests_got_dearer,
        ),
    )
    memory = plan.learned
    hpa_wanted = hpa_wanted_replicas(snapshot, plan.envelope.target_average_value)
    rules = alert_rules(
        spec,
        snapshot,
        memory,
        found,
        plan,
        batch,
        hpa_wanted,
        collapse_check=results.collapse,
        extra=extra,
        now=now,
    )
    if rebaselined:
        rules = replace(
            rules,
            clear_now=rules.clear_now | REBASELINE_CLEARS,
            clear_messages={
                **rules.clear_messages,
                **dict.fromkeys(REBASELINE_CLEARS, REBASELINED),
            },
        )
    active, raised, cleared = reconcile_alerts(
        memory.alerts,
        rules.wanted,
        rules.quiet,
        now,
        rules.clear_now,
        clear_messages=rules.clear_messages,
    )
    if Diagnosis.PREFIX_COLLAPSE in rules.clear_now:
        memory = memory.model_copy(update={"collapse_evidence": None})
    memory = memory.model_copy(update={"alerts": list(active)})
    reason, words = action(snapshot, plan, batch, hpa_wanted)
    leading = found[0]
    message = f"{leading.evidence}; {words}" if leading.evidence else words
    return Decision(
        state=leading.diagnosis,
        findings=found,
        envelope=plan.envelope,
        max_num_seqs=batch.desired,
        reason=reason,
        message=message,
        alerts=active,
        raised=raised,
        cleared=cleared,
        conditions=conditions(spec, snapshot, memory, results, found, plan, hpa_wanted),
        memory=memory,
        budget_max_replicas=plan.budget_max,
        hpa_wanted_replicas=hpa_wanted,
        ceiling=results.ceiling,
        demand=demand(snapshot),
        slo_needed_replicas=plan.slo_needed,
        demand_replicas=plan.demand_replicas,
        drain_replicas=plan.drain.replicas if plan.drain else None,
        headroom_replicas=plan.headroom,
        extra_cost=rules.extra_cost,
        notes=notes + ((batch.blocked,) if batch.blocked else ()),
    )
