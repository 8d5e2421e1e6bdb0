"""The status conditions an evaluation reports, each with its reason and evidence.

Six conditions (``docs/decisions.md``, "Conditions"): ``MetricsAvailable``,
``CacheHealthy``, ``SLOMet``, ``WithinBudget``, ``ScalingHeld`` and ``CacheIsolation``
(``isolation.py``: read from the configuration the engines export, so it is given even
without the required signals). A condition that fails names the diagnosis as its reason;
Unknown means the decision cannot tell (no warm pods, no baseline yet, a collapse still
building, unknown cost, an unread cache configuration), never a guess. Transition times
are the status writer's (``controller/reconcile/status.py``): these are only the
verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachescale.api.reasons import (
    Action,
    AnyConditionReason,
    ConditionReason,
    Diagnosis,
    Hold,
)
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import words
from cachescale.decide.checks import Finding
from cachescale.decide.diagnosis import CheckResults
from cachescale.decide.envelope import EnvelopePlan
from cachescale.decide.isolation import check_isolation
from cachescale.decide.learned import LearnedState
from cachescale.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class ConditionVerdict:
    """One status condition as this evaluation sees it (transition times are the writer's)."""

    type: ConditionType
    status: ConditionStatus
    reason: AnyConditionReason
    message: str


def frozen_conditions(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, message: str, evidence: str
) -> tuple[ConditionVerdict, ...]:
    """Missing data: metrics unavailable, health unknown, scaling not held (the envelope
    is open to the original, ``open_envelope``); isolation as the configuration reads."""
    reason = Diagnosis.METRICS_UNAVAILABLE
    return (
        ConditionVerdict(ConditionType.METRICS_AVAILABLE, ConditionStatus.FALSE, reason, message),
        ConditionVerdict(ConditionType.CACHE_HEALTHY, ConditionStatus.UNKNOWN, reason, evidence),
        ConditionVerdict(ConditionType.SLO_MET, ConditionStatus.UNKNOWN, reason, evidence),
        ConditionVerdict(ConditionType.WITHIN_BUDGET, ConditionStatus.UNKNOWN, reason, evidence),
        ConditionVerdict(
            ConditionType.SCALING_HELD,
            ConditionStatus.FALSE,
            Action.FROZEN_ON_MISSING_METRICS,
            message,
        ),
        isolation_condition(spec, snapshot),
    )


def conditions(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    results: CheckResults,
    findings: tuple[Finding, ...],
    plan: EnvelopePlan,
    hpa_wanted: int | None,
) -> tuple[ConditionVerdict, ...]:
    """Every condition after an evaluation that read all the required signals."""
    by = {f.diagnosis: f for f in findings}
    available = ConditionVerdict(
        ConditionType.METRICS_AVAILABLE,
        ConditionStatus.TRUE,
        ConditionReason.SIGNALS_READ,
        "every required signal was read",
    )
    return (
        available,
        _cache_condition(spec, by, results, learned),
        _slo_condition(spec, snapshot, by),
        _budget_condition(spec, snapshot, by),
        _held_condition(plan, snapshot, hpa_wanted),
        isolation_condition(spec, snapshot),
    )


def isolation_condition(spec: CacheScalingPolicySpec, snapshot: Snapshot) -> ConditionVerdict:
    """``CacheIsolation``: whether the prefix cache keeps the policy's tenants apart."""
    verdict = check_isolation(spec, snapshot)
    return ConditionVerdict(
        ConditionType.CACHE_ISOLATION, verdict.status, verdict.reason, verdict.message
    )


def _cache_condition(
    spec: CacheScalingPolicySpec,
    by: dict[Diagnosis, Finding],
    results: CheckResults,
    learned: LearnedState,
) -> ConditionVerdict:
    kind = ConditionType.CACHE_HEALTHY
    for diagnosis in (
        Diagnosis.PREFIX_COLLAPSE,
        Diagnosis.EVICTION_PRESSURE,
        Diagnosis.CACHE_DEGRADED,
    ):
        if diagnosis in by:
            return _failing(kind, by[diagnosis])
    warm = results.collapse.warm_hit_rate
    if warm.value is None:
        return ConditionVerdict(
            kind, ConditionStatus.UNKNOWN, ConditionReason.NO_WARM_PODS, str(warm.reason)
        )
    if learned.streaks.collapse and results.collapse.threshold is not None:
        return ConditionVerdict(
            kind,
            ConditionStatus.UNKNOWN,
            ConditionReason.COLLAPSE_SUSPECTED,
            f"warm-pod token hit rate {words.ratio(warm.value)} under the collapse threshold "
            f"{words.ratio(results.collapse.threshold)} for {learned.streaks.collapse} of the "
            f"{spec.cache.collapse_windows} windows a collapse needs",
        )
    diluted = by.get(Diagnosis.CACHE_DILUTED)
    if diluted is not None:
        # Healthy: the pods that joined explain the lower rate (decide/dilution.py).
        return ConditionVerdict(kind, ConditionStatus.TRUE, diluted.diagnosis, diluted.evidence)
    if learned.baseline.token_hit_rate is None:
        return ConditionVerdict(
            kind,
            ConditionStatus.UNKNOWN,
            ConditionReason.LEARNING_BASELINE,
            f"warm-pod token hit rate {words.ratio(warm.value)}; no baseline yet",
        )
    return ConditionVerdict(
        kind,
        ConditionStatus.TRUE,
        ConditionReason.HIT_RATE_AT_BASELINE,
        f"warm-pod token hit rate {words.ratio(warm.value)} against a baseline of "
        f"{words.ratio(learned.baseline.token_hit_rate)}",
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
    p95 = snapshot.signals.ttft_p95_seconds
    assert p95.is_known  # a required signal
    return ConditionVerdict(
        kind,
        ConditionStatus.TRUE,
        ConditionReason.TTFT_WITHIN_SLO,
        f"TTFT p95 {words.latency(p95)} within the {words.seconds(spec.slo.ttft_p95_seconds)} SLO",
    )


def _budget_condition(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, by: dict[Diagnosis, Finding]
) -> ConditionVerdict:
    kind = ConditionType.WITHIN_BUDGET
    if Diagnosis.OVER_BUDGET in by:
        return _failing(kind, by[Diagnosis.OVER_BUDGET])
    cost = snapshot.signals.gpu_seconds_per_1k_requests
    if cost.value is None:
        return ConditionVerdict(
            kind, ConditionStatus.UNKNOWN, ConditionReason.COST_UNKNOWN, str(cost.reason)
        )
    return ConditionVerdict(
        kind,
        ConditionStatus.TRUE,
        ConditionReason.COST_WITHIN_BUDGET,
        f"{words.cost(cost.value)} GPU-s per 1k requests within the budget of "
        f"{words.cost(spec.budget.gpu_seconds_per_1k_requests)}",
    )


def _held_condition(
    plan: EnvelopePlan, snapshot: Snapshot, hpa_wanted: int | None
) -> ConditionVerdict:
    """True only while maxReplicas binds: the HPA's metric asks for more, or the
    Deployment already runs at maxReplicas."""
    kind = ConditionType.SCALING_HELD
    max_replicas = plan.envelope.max_replicas
    binding = snapshot.workload.replicas >= max_replicas or (
        hpa_wanted is not None and hpa_wanted > max_replicas
    )
    if plan.held_by == Hold.COLLAPSE:
        return ConditionVerdict(
            kind,
            ConditionStatus.TRUE,
            Hold.COLLAPSE,
            f"maxReplicas held at the pre-collapse level {max_replicas}",
        )
    if plan.held_by == Hold.BUDGET and binding:
        return ConditionVerdict(
            kind,
            ConditionStatus.TRUE,
            Hold.BUDGET,
            f"maxReplicas capped at {max_replicas}, what the GPU-s/1k budget allows at the "
            "current req/s",
        )
    return ConditionVerdict(
        kind,
        ConditionStatus.FALSE,
        ConditionReason.NOT_HELD,
        f"maxReplicas {max_replicas} does not bind",
    )
