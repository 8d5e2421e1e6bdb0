"""``decide(spec, snapshot, memory, now) -> Decision``: one evaluation of one policy.

Pure by construction: the inputs are values, the clock is the ``now`` argument, and the
result says what the HPA envelope and ``--max-num-seqs`` should be, which alerts are
active, what each status condition reads and the memory for the next evaluation. The
operator (``gather`` → ``decide`` → ``act``) and the simulator's closed loop call the same
function, which is why the simulator can prove the policy before a cluster sees it.

Order of one evaluation:

1. human requests (acknowledge, rebaseline), then the missing-data gate — anything the
   decision needs unknown means *freeze*: the envelope stays as it is, nothing scales
   down, ``MetricsUnavailable`` is raised;
2. the tests (collapse, eviction, SLO, budget, cold pods, demand) and their streaks;
3. the findings, ordered by ``PRECEDENCE``;
4. baseline learning (only while healthy) and the pre-collapse mark;
5. the envelope, the batch ceiling, the alerts, the conditions and the words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cachescale.api.spec import CacheScalingPolicySpec, CollapseAction
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import words
from cachescale.decide.batching import BatchFacts, BatchPlan, plan_max_num_seqs
from cachescale.decide.diagnosis import (
    COST_STEADY_FACTOR,
    DEMAND_GROWTH_FACTOR,
    LOW_HIT_RATE,
    PRECEDENCE,
    CollapseTest,
    Diagnosis,
    EvictionTest,
    Finding,
    batch_ceiling,
    budget_replicas,
    collapse_evidence,
    collapse_test,
    eviction_test,
    likely_cause,
)
from cachescale.decide.envelope import (
    SLO_COMFORTABLE_SHARE,
    Envelope,
    EnvelopeInputs,
    EnvelopePlan,
    Hold,
    frozen_envelope,
    mark_unchanged,
    plan_envelope,
)
from cachescale.decide.inputs import Snapshot
from cachescale.decide.memory import (
    AlertMemory,
    BaselineMemory,
    CollapseEvidence,
    Memory,
    ReplicaMark,
    Streaks,
)

DEARER_PREFILL_FACTOR = 1.25
"""Prefill tokens per request this far above baseline: requests got dearer, so a queue
is not read as demand (lower than the collapse message's PREFILL_UP_FACTOR: it must
react within a window, before the windowed cost shows it)."""
AT_BASELINE_SHARE = 0.9
"""A warm hit rate at 90% of baseline or more still marks the pre-collapse replica level."""
RECOVERY_EVALUATIONS = 2
"""Evaluations above the clearing threshold before a collapse alert clears."""
REQUIRED_SIGNALS = ("requests_per_second", "ttft_p95_seconds", "token_hit_rate_local")
"""Without these nothing can be decided; unknown freezes the envelope."""


@dataclass(frozen=True, slots=True)
class ConditionVerdict:
    """One status condition as this evaluation sees it (transition times are the writer's)."""

    type: ConditionType
    status: ConditionStatus
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class AlertChange:
    """An alert raised or cleared by this evaluation (each becomes one Event)."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    """Everything one evaluation decided."""

    state: Diagnosis
    """The leading diagnosis (``kubectl get`` shows it)."""
    findings: tuple[Finding, ...]
    envelope: Envelope
    max_num_seqs: int | None
    """The batch ceiling to run with (the current one when unchanged or unmanaged)."""
    reason: str
    """CamelCase reason of the action taken."""
    message: str
    alerts: tuple[AlertMemory, ...]
    raised: tuple[AlertChange, ...]
    cleared: tuple[AlertChange, ...]
    conditions: tuple[ConditionVerdict, ...]
    memory: Memory
    budget_max_replicas: int | None = None
    hpa_wanted_replicas: int | None = None
    """What the HPA's own metric asks for at the current target (an estimate)."""
    ceiling: int | None = None
    """B_max, when known."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def has(self, diagnosis: Diagnosis) -> bool:
        """Whether ``diagnosis`` is among the findings."""
        return any(f.diagnosis is diagnosis for f in self.findings)

    def alert_active(self, reason: str) -> bool:
        """Whether an alert with this reason is active after the evaluation."""
        return any(a.reason == reason for a in self.alerts)


def decide(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: Memory, now: datetime
) -> Decision:
    """One evaluation: diagnose, reshape the envelope, manage the ceiling, alert."""
    memory, notes, rebaselined = _human_requests(snapshot, memory, now)
    missing = _missing(snapshot)
    if missing:
        memory = memory.model_copy(update={"data_since": None})
        return _frozen(spec, snapshot, memory, now, missing, notes)
    since = memory.data_since or now
    memory = memory.model_copy(update={"data_since": since})
    if (now - since).total_seconds() < spec.metrics.window_seconds:
        ready_at = since + timedelta(seconds=spec.metrics.window_seconds)
        wait = (
            f"waiting for a full {spec.metrics.window} window of data (until {ready_at:%H:%M:%S})"
        )
        return _waiting(spec, snapshot, memory, now, notes, "WaitingForFullWindow", wait)
    workload = snapshot.workload
    if workload.ready_replicas and not workload.warm_replicas(spec.cache.pod_warmup_seconds):
        wait = (
            f"waiting for a pod older than {spec.cache.pod_warmup_seconds} s: every cache is "
            "still filling, so hit rates and costs describe the warm-up, not the workload"
        )
        return _waiting(spec, snapshot, memory, now, notes, "WaitingForWarmPods", wait)
    return _evaluate(spec, snapshot, memory, now, notes, rebaselined)


# --- human requests -----------------------------------------------------------------


def _human_requests(
    snapshot: Snapshot, memory: Memory, now: datetime
) -> tuple[Memory, tuple[str, ...], bool]:
    """Apply new acknowledge/rebaseline requests; True in the last place on a rebaseline."""
    human = snapshot.human
    notes: list[str] = []
    rebaselined = False
    if human.rebaseline_at is not None and (
        memory.rebaselined_at is None or human.rebaseline_at > memory.rebaselined_at
    ):
        memory = memory.model_copy(
            update={
                "baseline": BaselineMemory(),
                "streaks": memory.streaks.model_copy(update={"collapse": 0, "recovered": 0}),
                "collapse_evidence": None,
                "rebaselined_at": human.rebaseline_at,
                "pre_collapse": None,
            }
        )
        notes.append("baseline reset on request; relearning from the current hit rate")
        rebaselined = True
    if human.acknowledge_at is not None and (
        memory.acknowledged_at is None or human.acknowledge_at > memory.acknowledged_at
    ):
        alerts = [
            a.model_copy(update={"acknowledged": True})
            if a.reason == Diagnosis.PREFIX_COLLAPSE
            else a
            for a in memory.alerts
        ]
        memory = memory.model_copy(
            update={"alerts": alerts, "acknowledged_at": human.acknowledge_at}
        )
        if any(a.reason == Diagnosis.PREFIX_COLLAPSE for a in alerts):
            notes.append("collapse acknowledged: replicas are no longer held")
    return memory, tuple(notes), rebaselined


# --- missing data -------------------------------------------------------------------


def _missing(snapshot: Snapshot) -> list[str]:
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
    memory: Memory,
    now: datetime,
    missing: list[str],
    notes: tuple[str, ...],
) -> Decision:
    """Missing data: change nothing, raise MetricsUnavailable, keep every other alert."""
    evidence = "; ".join(missing)
    reason = Diagnosis.METRICS_UNAVAILABLE
    message = f"not scaling on missing data, HPA envelope left as it is: {evidence}"
    active, raised, cleared = _reconcile_alerts(
        memory.alerts, {reason: message}, set(), now, keep_counters=True
    )
    memory = mark_unchanged(memory, snapshot.workload.hpa.max_replicas, now)
    memory = memory.model_copy(update={"alerts": list(active)})
    envelope = frozen_envelope(snapshot)
    conditions = (
        ConditionVerdict(ConditionType.METRICS_AVAILABLE, ConditionStatus.FALSE, reason, message),
        ConditionVerdict(ConditionType.CACHE_HEALTHY, ConditionStatus.UNKNOWN, reason, evidence),
        ConditionVerdict(ConditionType.SLO_MET, ConditionStatus.UNKNOWN, reason, evidence),
        ConditionVerdict(ConditionType.WITHIN_BUDGET, ConditionStatus.UNKNOWN, reason, evidence),
        ConditionVerdict(
            ConditionType.SCALING_HELD, ConditionStatus.TRUE, "FrozenOnMissingMetrics", message
        ),
    )
    return Decision(
        state=reason,
        findings=(Finding(reason, evidence),),
        envelope=envelope,
        max_num_seqs=snapshot.workload.max_num_seqs,
        reason="FrozenOnMissingMetrics",
        message=message,
        alerts=active,
        raised=raised,
        cleared=cleared,
        conditions=conditions,
        memory=memory,
        notes=notes,
    )


def _waiting(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    now: datetime,
    notes: tuple[str, ...],
    reason: str,
    wait: str,
) -> Decision:
    """Signals exist but cannot be trusted yet: the window still spans blank time (data is
    back, or the policy is new), or every pod is warming up. Report what is seen, clear
    MetricsUnavailable, and change nothing (no streak, no baseline, no envelope)."""
    tests = _run_tests(spec, snapshot, memory)
    findings = _findings(spec, snapshot, memory, tests, _collapse_active(memory, spec))
    active, raised, cleared = _reconcile_alerts(
        memory.alerts,
        {},
        set(),
        now,
        frozenset({Diagnosis.METRICS_UNAVAILABLE.value}),
        keep_counters=True,
    )
    memory = mark_unchanged(memory, snapshot.workload.hpa.max_replicas, now)
    memory = memory.model_copy(update={"alerts": list(active)})
    message = f"{findings[0].evidence}; {wait} before changing anything"
    plan = EnvelopePlan(frozen_envelope(snapshot), None, None, False, memory)
    hpa_wanted = _hpa_wanted(snapshot, snapshot.workload.hpa.target_average_value)
    return Decision(
        state=findings[0].diagnosis,
        findings=findings,
        envelope=plan.envelope,
        max_num_seqs=snapshot.workload.max_num_seqs,
        reason=reason,
        message=message,
        alerts=active,
        raised=raised,
        cleared=cleared,
        conditions=_conditions(spec, snapshot, memory, tests, findings, plan, hpa_wanted),
        memory=memory,
        notes=notes,
    )


# --- a full evaluation --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tests:
    collapse: CollapseTest
    eviction: EvictionTest
    ceiling: int | None
    budget_max: int | None
    slo_breach: bool
    slo_comfortable: bool
    over_budget: bool
    cold_pods: int


def _requests_got_dearer(
    collapse: CollapseTest, eviction: EvictionTest, snapshot: Snapshot, memory: Memory
) -> bool:
    """Evidence that each request costs more than it did (so a queue is not demand): the
    warm hit rate under its clearing threshold (unless eviction explains it: then more
    replicas help), or prefill per request well above its baseline. The windowed cost
    lags both by most of a window."""
    cache_down = collapse.clear_threshold is not None and collapse.warm_hit_rate.is_known
    cache_down = cache_down and not collapse.recovered and not eviction.held
    prefill = snapshot.signals.prefill_tokens_per_request.value
    base = memory.baseline.prefill_tokens_per_request
    prefill_up = (
        prefill is not None and base is not None and prefill >= DEARER_PREFILL_FACTOR * base
    )
    return cache_down or prefill_up


def _run_tests(spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: Memory) -> _Tests:
    signals = snapshot.signals
    ceiling = batch_ceiling(spec, snapshot)
    p95 = signals.ttft_p95_seconds.value
    p99 = signals.ttft_p99_seconds.value
    breach = p95 is not None and p95 > spec.slo.ttft_p95_seconds
    if spec.slo.ttft_p99_seconds is not None and p99 is not None:
        breach = breach or p99 > spec.slo.ttft_p99_seconds
    cost = signals.gpu_seconds_per_1k_requests.value
    warmup = float(spec.cache.pod_warmup_seconds)
    ages = snapshot.workload.pod_ages_seconds
    collapse = collapse_test(spec, snapshot, memory)
    eviction = eviction_test(snapshot, ceiling)
    return _Tests(
        collapse=collapse,
        eviction=eviction,
        ceiling=ceiling,
        budget_max=budget_replicas(
            spec, snapshot, _requests_got_dearer(collapse, eviction, snapshot, memory)
        ),
        slo_breach=breach,
        slo_comfortable=p95 is not None and p95 < SLO_COMFORTABLE_SHARE * spec.slo.ttft_p95_seconds,
        over_budget=cost is not None and cost > spec.budget.gpu_seconds_per_1k_requests,
        cold_pods=sum(1 for age in ages if age < warmup),
    )


def _next_streaks(tests: _Tests, snapshot: Snapshot, streaks: Streaks) -> Streaks:
    def count(held: bool, old: int) -> int:
        return old + 1 if held else 0

    warm_known = tests.collapse.warm_hit_rate.is_known
    # Warm pods when known (cold ones miss by nature), else the fleet.
    hit = tests.collapse.warm_hit_rate.value
    if hit is None:
        hit = snapshot.signals.token_hit_rate_local.value
    collapsing = tests.collapse.below and not tests.eviction.held
    return Streaks(
        collapse=count(collapsing, streaks.collapse) if warm_known else streaks.collapse,
        recovered=count(tests.collapse.recovered, streaks.recovered)
        if warm_known
        else streaks.recovered,
        eviction=count(tests.eviction.held, streaks.eviction),
        low_hit=count(hit is not None and hit < LOW_HIT_RATE, streaks.low_hit),
        slo_breach=count(tests.slo_breach, streaks.slo_breach),
        slo_comfortable=count(tests.slo_comfortable, streaks.slo_comfortable),
        over_budget=count(tests.over_budget, streaks.over_budget),
    )


def _evaluate(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    now: datetime,
    notes: tuple[str, ...],
    rebaselined: bool,
) -> Decision:
    tests = _run_tests(spec, snapshot, memory)
    streaks = _next_streaks(tests, snapshot, memory.streaks)
    memory = memory.model_copy(update={"streaks": streaks})
    memory = _track_collapse_evidence(memory, snapshot, now)
    windows = spec.cache.collapse_windows
    collapse_active = _collapse_active(memory, spec)
    findings = _findings(spec, snapshot, memory, tests, collapse_active)
    memory = _learn(spec, memory, snapshot, tests, findings, now)
    acknowledged = any(
        a.acknowledged for a in memory.alerts if a.reason == Diagnosis.PREFIX_COLLAPSE
    )
    batch = plan_max_num_seqs(
        spec,
        snapshot,
        memory,
        now,
        BatchFacts(tests.ceiling, streaks.eviction >= windows, collapse_active),
    )
    if batch.reason is not None:
        memory = memory.model_copy(update={"last_max_num_seqs_change_at": now})
    plan = plan_envelope(
        spec,
        snapshot,
        memory,
        now,
        EnvelopeInputs(
            collapse_held=collapse_active and not acknowledged,
            slo_breached=tests.slo_breach,
            budget_max=tests.budget_max,
            max_num_seqs=batch.desired,
        ),
    )
    memory = plan.memory
    hpa_wanted = _hpa_wanted(snapshot, plan.envelope.target_average_value)
    rules = _alert_rules(spec, snapshot, memory, tests, findings, plan, batch, hpa_wanted)
    if rebaselined:
        rules = _AlertRules(
            rules.wanted, rules.quiet, rules.clear_now | {Diagnosis.PREFIX_COLLAPSE}
        )
    active, raised, cleared = _reconcile_alerts(
        memory.alerts, rules.wanted, rules.quiet, now, rules.clear_now
    )
    if Diagnosis.PREFIX_COLLAPSE in rules.clear_now:
        memory = memory.model_copy(update={"collapse_evidence": None})
    memory = memory.model_copy(update={"alerts": list(active)})
    reason, action = _action(spec, snapshot, plan, batch, hpa_wanted)
    leading = findings[0]
    message = f"{leading.evidence}; {action}" if leading.evidence else action
    return Decision(
        state=leading.diagnosis,
        findings=findings,
        envelope=plan.envelope,
        max_num_seqs=batch.desired,
        reason=reason,
        message=message,
        alerts=active,
        raised=raised,
        cleared=cleared,
        conditions=_conditions(spec, snapshot, memory, tests, findings, plan, hpa_wanted),
        memory=memory,
        budget_max_replicas=plan.budget_max,
        hpa_wanted_replicas=hpa_wanted,
        ceiling=tests.ceiling,
        notes=notes + ((batch.blocked,) if batch.blocked else ()),
    )


def _track_collapse_evidence(memory: Memory, snapshot: Snapshot, now: datetime) -> Memory:
    rps = snapshot.signals.requests_per_second.value
    if memory.streaks.collapse == 0:
        if memory.alert(Diagnosis.PREFIX_COLLAPSE) is None:
            return memory.model_copy(update={"collapse_evidence": None})
        return memory
    evidence = memory.collapse_evidence or CollapseEvidence(started_at=now)
    return memory.model_copy(update={"collapse_evidence": evidence.saw(rps)})


def _collapse_active(memory: Memory, spec: CacheScalingPolicySpec) -> bool:
    """Confirmed now, or confirmed earlier and not yet recovered (never without a
    baseline: a rebaseline ends it)."""
    if memory.baseline.token_hit_rate is None:
        return False
    if memory.streaks.collapse >= spec.cache.collapse_windows:
        return True
    alert = memory.alert(Diagnosis.PREFIX_COLLAPSE)
    return alert is not None and memory.streaks.recovered < RECOVERY_EVALUATIONS


def _findings(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    tests: _Tests,
    collapse_active: bool,
) -> tuple[Finding, ...]:
    signals = snapshot.signals
    found: list[Finding] = []
    if collapse_active:
        evidence = (
            collapse_evidence(tests.collapse, snapshot, memory, memory.streaks.collapse)
            if tests.collapse.warm_hit_rate.is_known and tests.collapse.baseline is not None
            else ("collapse confirmed earlier; the warm-pod hit rate is not measurable now")
        )
        found.append(Finding(Diagnosis.PREFIX_COLLAPSE, evidence))
    if memory.streaks.eviction >= 1 and tests.eviction.held:
        found.append(Finding(Diagnosis.EVICTION_PRESSURE, tests.eviction.evidence))
    p95 = signals.ttft_p95_seconds.value
    if tests.slo_breach and p95 is not None:
        found.append(
            Finding(
                Diagnosis.SLO_AT_RISK,
                f"TTFT p95 {words.seconds(p95)} above the "
                f"{words.seconds(spec.slo.ttft_p95_seconds)} SLO",
            )
        )
    cost = signals.gpu_seconds_per_1k_requests.value
    if tests.over_budget and cost is not None:
        found.append(
            Finding(
                Diagnosis.OVER_BUDGET,
                f"{words.cost(cost)} GPU-s per 1k requests against a budget of "
                f"{words.cost(spec.budget.gpu_seconds_per_1k_requests)}",
            )
        )
    if tests.cold_pods or snapshot.workload.rollout_in_progress:
        found.append(Finding(Diagnosis.COLD_FLEET, _cold_evidence(spec, snapshot, tests)))
    growth = _demand_growth(snapshot, memory)
    if growth:
        found.append(Finding(Diagnosis.DEMAND_GROWTH, growth))
    if not found:
        found.append(Finding(Diagnosis.HEALTHY, _healthy_evidence(snapshot, tests)))
    return tuple(sorted(found, key=lambda f: PRECEDENCE.index(f.diagnosis)))


def _cold_evidence(spec: CacheScalingPolicySpec, snapshot: Snapshot, tests: _Tests) -> str:
    ready = snapshot.workload.ready_replicas
    text = (
        f"{tests.cold_pods} of {ready} ready pods younger than "
        f"{spec.cache.pod_warmup_seconds} s (caches still filling)"
    )
    if snapshot.workload.rollout_in_progress:
        text += " during a rollout"
    warm = tests.collapse.warm_hit_rate.value
    if warm is not None:
        text += f"; warm pods hit {words.ratio(warm)}"
    return text + "; expected, not a collapse"


def _demand_growth(snapshot: Snapshot, memory: Memory) -> str:
    baseline = memory.baseline
    rps = snapshot.signals.requests_per_second.value
    cost = snapshot.signals.gpu_seconds_per_1k_requests.value
    if rps is None or baseline.requests_per_second is None:
        return ""
    if rps < DEMAND_GROWTH_FACTOR * baseline.requests_per_second:
        return ""
    base_cost = baseline.gpu_seconds_per_1k_requests
    if cost is not None and base_cost is not None and cost > COST_STEADY_FACTOR * base_cost:
        return ""
    return (
        f"req/s {words.rate(baseline.requests_per_second)} → {words.rate(rps)} with the cost per "
        "request steady: the HPA scales for it, inside the budget"
    )


def _healthy_evidence(snapshot: Snapshot, tests: _Tests) -> str:
    parts = []
    warm = tests.collapse.warm_hit_rate.value
    if warm is not None:
        parts.append(f"warm-pod token hit rate {words.ratio(warm)}")
    if tests.collapse.baseline is not None:
        parts.append(f"baseline {words.ratio(tests.collapse.baseline)}")
    else:
        parts.append("baseline still being learned")
    p95 = snapshot.signals.ttft_p95_seconds.value
    if p95 is not None:
        parts.append(f"TTFT p95 {words.seconds(p95)}")
    return ", ".join(parts)


def _learn(
    spec: CacheScalingPolicySpec,
    memory: Memory,
    snapshot: Snapshot,
    tests: _Tests,
    findings: tuple[Finding, ...],
    now: datetime,
) -> Memory:
    """Fold a healthy evaluation into the baseline; mark the pre-collapse replica level.

    The cache half (hit rate, prefill per request) is learned while the cache looks
    healthy — no cache finding, no collapse building or alerted, and the warm hit rate
    not below the clearing threshold — even if the SLO or budget are in trouble; the cost
    half (GPU-s/1k, req/s) only when nothing at all is wrong."""
    cache_trouble = {Diagnosis.PREFIX_COLLAPSE, Diagnosis.EVICTION_PRESSURE}
    benign = {Diagnosis.HEALTHY, Diagnosis.DEMAND_GROWTH, Diagnosis.COLD_FLEET}
    warm = tests.collapse.warm_hit_rate.value
    signals = snapshot.signals
    rps = signals.requests_per_second.value
    update: dict[str, object] = {}
    relearning = memory.baseline.token_hit_rate is None  # a collapse alert is about to clear
    cache_alerted = any(
        a.reason in cache_trouble and not (relearning and a.reason == Diagnosis.PREFIX_COLLAPSE)
        for a in memory.alerts
    )
    below = tests.collapse.clear_threshold is not None and not tests.collapse.recovered
    cache_ok = (
        warm is not None
        and memory.streaks.collapse == 0
        and not cache_alerted
        and not below
        and not any(f.diagnosis in cache_trouble for f in findings)
    )
    if cache_ok:
        all_ok = all(f.diagnosis in benign for f in findings) and not memory.alerts
        update["baseline"] = memory.baseline.learn(
            now,
            spec.metrics.interval_seconds,
            token_hit_rate=warm,
            prefill_tokens_per_request=signals.prefill_tokens_per_request.value,
            gpu_seconds_per_1k_requests=(
                signals.gpu_seconds_per_1k_requests.value if all_ok else None
            ),
            requests_per_second=rps if all_ok else None,
        )
    baseline = memory.baseline.token_hit_rate
    at_baseline = warm is not None and (baseline is None or warm >= AT_BASELINE_SHARE * baseline)
    if at_baseline and rps is not None and memory.alert(Diagnosis.PREFIX_COLLAPSE) is None:
        update["pre_collapse"] = ReplicaMark(
            replicas=snapshot.workload.replicas, requests_per_second=rps, at=now
        )
    return memory.model_copy(update=update) if update else memory


def _hpa_wanted(snapshot: Snapshot, target: float | None) -> int | None:
    """The HPA's own replica count for its metric at ``target`` (ceil(ready × avg / target))."""
    hpa = snapshot.workload.hpa
    name = hpa.metric_name or ""
    signals = snapshot.signals
    per_pod = (
        signals.running_requests_per_pod
        if "running" in name
        else signals.waiting_requests_per_pod
        if "waiting" in name or "queue" in name
        else None
    )
    if per_pod is None or per_pod.value is None or not target:
        return None
    return math.ceil(snapshot.workload.ready_replicas * per_pod.value / target - 1e-9)


# --- alerts -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _AlertRules:
    wanted: dict[str, str]
    quiet: set[str]
    clear_now: frozenset[str]


def _alert_rules(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    tests: _Tests,
    findings: tuple[Finding, ...],
    plan: EnvelopePlan,
    batch: BatchPlan,
    hpa_wanted: int | None,
) -> _AlertRules:
    """Which alerts to raise (or keep, with a fresh message) and which to clear."""
    by = {f.diagnosis: f for f in findings}
    windows = spec.cache.collapse_windows
    streaks = memory.streaks
    wanted: dict[str, str] = {}
    clear_now = {Diagnosis.METRICS_UNAVAILABLE.value}
    clearing: set[str] = set()
    collapse = by.get(Diagnosis.PREFIX_COLLAPSE)
    if collapse is not None:
        wanted[Diagnosis.PREFIX_COLLAPSE] = (
            f"{collapse.evidence}; {_collapse_action(spec, snapshot, plan, hpa_wanted)}; "
            f"likely cause: {likely_cause(snapshot, memory.baseline)}"
        )
    elif streaks.recovered >= RECOVERY_EVALUATIONS or memory.baseline.token_hit_rate is None:
        clear_now.add(Diagnosis.PREFIX_COLLAPSE)
    eviction = by.get(Diagnosis.EVICTION_PRESSURE)
    if eviction is not None and streaks.eviction >= windows and batch.reason is None:
        why = batch.blocked or batch.message or "--max-num-seqs is not managed by this policy"
        wanted[Diagnosis.EVICTION_PRESSURE] = f"{eviction.evidence}; ceiling not lowered: {why}"
    elif eviction is None:
        clearing.add(Diagnosis.EVICTION_PRESSURE)
    over = by.get(Diagnosis.OVER_BUDGET)
    if over is not None and streaks.over_budget >= windows:
        wanted[Diagnosis.OVER_BUDGET] = (
            f"{over.evidence}; maxReplicas capped at {plan.envelope.max_replicas}"
        )
    elif over is None:
        clearing.add(Diagnosis.OVER_BUDGET)
    slo = by.get(Diagnosis.SLO_AT_RISK)
    at_cap = snapshot.workload.replicas >= plan.envelope.max_replicas
    if slo is not None and streaks.slo_breach >= windows and at_cap:
        wanted[Diagnosis.SLO_AT_RISK] = (
            f"{slo.evidence} with replicas at the {plan.envelope.max_replicas} the budget of "
            f"{words.cost(spec.budget.gpu_seconds_per_1k_requests)} GPU-s/1k allows: meeting "
            "the SLO needs a larger budget or cheaper requests"
        )
    elif slo is None:
        clearing.add(Diagnosis.SLO_AT_RISK)
    return _AlertRules(wanted, clearing, frozenset(clear_now))


def _reconcile_alerts(
    active: list[AlertMemory],
    wanted: dict[str, str],
    quiet: set[str],
    now: datetime,
    clear_now: frozenset[str] = frozenset(),
    *,
    keep_counters: bool = False,
) -> tuple[tuple[AlertMemory, ...], tuple[AlertChange, ...], tuple[AlertChange, ...]]:
    """Raise new alerts, refresh kept ones, clear the ones quiet long enough.

    ``wanted``: raise or keep, with a fresh message. ``quiet``: the condition is absent
    this evaluation; the alert clears after ``RECOVERY_EVALUATIONS`` such evaluations in a
    row, so a value hovering at a threshold cannot raise and clear on alternate
    evaluations. ``clear_now``: clear at once (its own recovery rule already held).
    """
    result: list[AlertMemory] = []
    raised: list[AlertChange] = []
    cleared: list[AlertChange] = []
    for alert in active:
        quiet_for = alert.quiet_evaluations + 1 if alert.reason in quiet else 0
        if keep_counters:
            quiet_for = alert.quiet_evaluations
        if alert.reason in clear_now or quiet_for >= RECOVERY_EVALUATIONS:
            cleared.append(AlertChange(alert.reason, f"cleared: {alert.message}"))
            continue
        message = wanted.pop(alert.reason, alert.message)
        result.append(alert.model_copy(update={"message": message, "quiet_evaluations": quiet_for}))
    for reason, message in wanted.items():
        result.append(AlertMemory(reason=reason, since=now, message=message))
        raised.append(AlertChange(reason, message))
    return tuple(result), tuple(raised), tuple(cleared)


# --- the action's words -------------------------------------------------------------


def _collapse_action(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, plan: EnvelopePlan, hpa_wanted: int | None
) -> str:
    top = plan.envelope.max_replicas
    wanted = (
        f" instead of the {hpa_wanted} the HPA wanted" if hpa_wanted and hpa_wanted > top else ""
    )
    top = plan.envelope.max_replicas
    if plan.held_by == Hold.COLLAPSE:
        return f"replicas held at {top}{wanted}"
    if plan.slo_guard:
        return f"TTFT breaches the SLO, so replicas may grow to the budget's {top}{wanted}"
    if spec.cache.on_collapse is CollapseAction.SCALE_AS_USUAL:
        return f"scaling as usual (onCollapse: ScaleAsUsual), up to {top}"
    return f"replicas capped at the budget's {top}{wanted}"


def _action(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    plan: EnvelopePlan,
    batch: BatchPlan,
    hpa_wanted: int | None,
) -> tuple[str, str]:
    hpa = snapshot.workload.hpa
    envelope = plan.envelope
    parts = []
    changed = (envelope.min_replicas, envelope.max_replicas) != (hpa.min_replicas, hpa.max_replicas)
    retarget = envelope.target_average_value != hpa.target_average_value
    if batch.reason is not None:
        reason = batch.reason
    elif plan.held_by == Hold.COLLAPSE:
        reason = "HeldForPrefixCollapse"
    elif plan.slo_guard:
        reason = "ScaledForSLO"
    elif (
        plan.held_by == Hold.BUDGET
        and hpa_wanted is not None
        and hpa_wanted > envelope.max_replicas
    ):
        reason = "CappedAtBudget"
    elif changed or retarget:
        reason = "EnvelopeUpdated"
    else:
        reason = "NoChange"
    parts.append(
        f"HPA envelope {envelope.min_replicas}..{envelope.max_replicas}"
        + (f" (was {hpa.min_replicas}..{hpa.max_replicas})" if changed else "")
    )
    if retarget and envelope.target_average_value is not None:
        parts.append(f"target {hpa.target_average_value:g} → {envelope.target_average_value:g}")
    if plan.budget_max is not None:
        parts.append(f"budget allows {plan.budget_max}")
    if batch.message:
        parts.append(batch.message)
    return reason, "; ".join(parts)


# --- conditions ---------------------------------------------------------------------


def _conditions(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    tests: _Tests,
    findings: tuple[Finding, ...],
    plan: EnvelopePlan,
    hpa_wanted: int | None,
) -> tuple[ConditionVerdict, ...]:
    by = {f.diagnosis: f for f in findings}
    available = ConditionVerdict(
        ConditionType.METRICS_AVAILABLE,
        ConditionStatus.TRUE,
        "SignalsRead",
        "every required signal was read",
    )
    return (
        available,
        _cache_condition(spec, by, tests, memory),
        _slo_condition(spec, snapshot, by),
        _budget_condition(spec, snapshot, by),
        _held_condition(plan, snapshot, hpa_wanted),
    )


def _cache_condition(
    spec: CacheScalingPolicySpec, by: dict[Diagnosis, Finding], tests: _Tests, memory: Memory
) -> ConditionVerdict:
    kind = ConditionType.CACHE_HEALTHY
    for diagnosis in (Diagnosis.PREFIX_COLLAPSE, Diagnosis.EVICTION_PRESSURE):
        if diagnosis in by:
            return _failing(kind, by[diagnosis])
    warm = tests.collapse.warm_hit_rate
    if warm.value is None:
        return ConditionVerdict(kind, ConditionStatus.UNKNOWN, "NoWarmPods", str(warm.reason))
    if memory.streaks.collapse and tests.collapse.threshold is not None:
        return ConditionVerdict(
            kind,
            ConditionStatus.UNKNOWN,
            "CollapseSuspected",
            f"warm-pod token hit rate {words.ratio(warm.value)} under the collapse threshold "
            f"{words.ratio(tests.collapse.threshold)} for {memory.streaks.collapse} of the "
            f"{spec.cache.collapse_windows} windows a collapse needs",
        )
    if memory.baseline.token_hit_rate is None:
        return ConditionVerdict(
            kind,
            ConditionStatus.UNKNOWN,
            "LearningBaseline",
            f"warm-pod token hit rate {words.ratio(warm.value)}; no baseline yet",
        )
    return ConditionVerdict(
        kind,
        ConditionStatus.TRUE,
        "HitRateAtBaseline",
        f"warm-pod token hit rate {words.ratio(warm.value)} against a baseline of "
        f"{words.ratio(memory.baseline.token_hit_rate)}",
    )


def _failing(kind: ConditionType, finding: Finding) -> ConditionVerdict:
    """A condition that is False because of ``finding``: its diagnosis is the reason."""
    return ConditionVerdict(kind, ConditionStatus.FALSE, finding.diagnosis, finding.evidence)


def _slo_condition(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, by: dict[Diagnosis, Finding]
) -> ConditionVerdict:
    kind = ConditionType.SLO_MET
    if Diagnosis.SLO_AT_RISK in by:
        return _failing(kind, by[Diagnosis.SLO_AT_RISK])
    p95 = snapshot.signals.ttft_p95_seconds.value
    assert p95 is not None  # a required signal
    return ConditionVerdict(
        kind,
        ConditionStatus.TRUE,
        "TTFTWithinSLO",
        f"TTFT p95 {words.seconds(p95)} within the {words.seconds(spec.slo.ttft_p95_seconds)} SLO",
    )


def _budget_condition(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, by: dict[Diagnosis, Finding]
) -> ConditionVerdict:
    kind = ConditionType.WITHIN_BUDGET
    if Diagnosis.OVER_BUDGET in by:
        return _failing(kind, by[Diagnosis.OVER_BUDGET])
    cost = snapshot.signals.gpu_seconds_per_1k_requests
    if cost.value is None:
        return ConditionVerdict(kind, ConditionStatus.UNKNOWN, "CostUnknown", str(cost.reason))
    return ConditionVerdict(
        kind,
        ConditionStatus.TRUE,
        "CostWithinBudget",
        f"{words.cost(cost.value)} GPU-s per 1k requests within the budget of "
        f"{words.cost(spec.budget.gpu_seconds_per_1k_requests)}",
    )


def _held_condition(
    plan: EnvelopePlan, snapshot: Snapshot, hpa_wanted: int | None
) -> ConditionVerdict:
    """True only while the top of the envelope binds: the HPA's metric asks for more, or
    the Deployment already runs at the top."""
    kind = ConditionType.SCALING_HELD
    top = plan.envelope.max_replicas
    binding = snapshot.workload.replicas >= top or (hpa_wanted is not None and hpa_wanted > top)
    if plan.held_by == Hold.COLLAPSE:
        return ConditionVerdict(
            kind,
            ConditionStatus.TRUE,
            Hold.COLLAPSE,
            f"maxReplicas held at the pre-collapse level {top}",
        )
    if plan.held_by == Hold.BUDGET and binding:
        return ConditionVerdict(
            kind,
            ConditionStatus.TRUE,
            Hold.BUDGET,
            f"maxReplicas capped at {top}, what the GPU-s/1k budget allows at the current req/s",
        )
    return ConditionVerdict(
        kind, ConditionStatus.FALSE, "NotHeld", f"maxReplicas {top} does not bind"
    )
