"""What ``kubectl describe csp`` shows: the status rendered from one evaluation.

Pure: previous status + decision (or a problem) in, the new status out. Conditions keep
their ``lastTransitionTime`` unless their status flips; the observed signals are written
only when known (the reason for every unknown one is listed), and the ones ``kubectl get``
prints again in ``summary``, formatted to at most three significant digits; the last
decision is kept (earlier ones are its Events); the decision engine's memory, the learned
baseline among it, rides along packed into one line (``learnedState``), so a restarted
operator picks up where it left off.

Texts and lists are not cut here: the status model cuts each at its limit as it is
built (``api/status.py``), so every status written has a largest size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from cachescale.api.reasons import ConditionReason, Problem
from cachescale.api.status import (
    ActiveAlert,
    CacheScalingPolicyStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    DecisionRecord,
    ObservedSignals,
    QualifiedSignal,
    Summary,
    SuspectedChange,
    UnknownSignal,
    pack_learned_state,
)
from cachescale.decide import Decision, words
from cachescale.decide.conditions import ConditionVerdict
from cachescale.snapshot import Measured, Snapshot, Unit

STATUS_FIELDS = {
    "token_hit_rate_local": "tokenHitRate",
    "request_full_hit_share": "requestHitShare",
    "prefill_tokens_per_request": "prefillTokensPerRequest",
    "ttft_p95_seconds": "ttftP95Seconds",
    "ttft_p99_seconds": "ttftP99Seconds",
    "gpu_seconds_per_1k_requests": "gpuSecondsPer1kRequests",
    "requests_per_second": "requestsPerSecond",
    "arrivals_per_second": "arrivalsPerSecond",
    "preemptions_per_second": "preemptionsPerSecond",
    "kv_cache_usage_ratio": "kvCacheUsageRatio",
}
"""Engine signals shown in status (snapshot field → status field)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """A status one evaluation rendered: as it is written (wire form), and what it was
    made of that its writes and Events read, so they need not parse it back."""

    wire: dict[str, Any]
    """The status as the API server stores it."""
    conditions: list[Condition]
    """Its conditions."""
    learned: dict[str, Any] | None
    """The decision memory its ``learnedState`` packs (JSON form); None when that is
    the previous status's, still packed."""


CONDITION_ORDER = {kind: position for position, kind in enumerate(ConditionType)}
"""Where each condition type is listed: in the order ``ConditionType`` declares them."""


def merge_conditions(
    previous: list[Condition], verdicts: list[ConditionVerdict], now: datetime
) -> list[Condition]:
    """New conditions; a condition's transition time moves only when its status flips."""
    before = {c.type: c for c in previous}
    decided = {verdict.type for verdict in verdicts}
    merged = []
    for verdict in verdicts:
        old = before.get(verdict.type)
        flipped = old is None or old.status != verdict.status
        merged.append(
            Condition(
                type=verdict.type,
                status=verdict.status,
                reason=verdict.reason,
                message=verdict.message,
                last_transition_time=now if flipped else old.last_transition_time,  # type: ignore[union-attr]
            )
        )
    kept = [c for c in previous if c.type not in decided]
    return sorted(merged + kept, key=lambda c: CONDITION_ORDER[c.type])


def render(
    previous: CacheScalingPolicyStatus,
    decision: Decision,
    snapshot: Snapshot,
    *,
    generation: int,
    now: datetime,
    applied: bool,
    warmup_seconds: float,
    prometheus: str | None = None,
    autoscaler_notes: tuple[str, ...] = (),
    autoscaler_fallback: str | None = None,
    suspected_change: SuspectedChange | None = None,
) -> Rendered:
    """The status after an evaluation that reached a decision (``prometheus``: where the
    signals were read, ``prometheus_access.prometheus_source``). ``autoscaler_notes`` (how
    a KEDA ScaledObject is managed, and its traps) are appended to the ``Ready`` message,
    which ``kubectl describe`` shows; ``autoscaler_fallback`` (KEDA's Fallback condition is
    True) turns ``MetricsAvailable`` False with that message. ``suspected_change``: what
    changed before a building or alerted collapse (``controller/target/changes.py``)."""
    ready = ConditionVerdict(
        ConditionType.READY,
        ConditionStatus.TRUE,
        ConditionReason.EVALUATED,
        "; ".join(["the last evaluation completed", *autoscaler_notes]),
    )
    verdicts = list(decision.conditions)
    if autoscaler_fallback is not None:
        verdicts = [v for v in verdicts if v.type is not ConditionType.METRICS_AVAILABLE]
        verdicts.append(
            ConditionVerdict(
                ConditionType.METRICS_AVAILABLE,
                ConditionStatus.FALSE,
                ConditionReason.KEDA_FALLBACK,
                autoscaler_fallback,
            )
        )
    learned = decision.memory.model_dump(mode="json", by_alias=True)
    status = CacheScalingPolicyStatus(
        observed_generation=generation,
        state=decision.state.value,
        conditions=merge_conditions(previous.conditions, [ready, *verdicts], now),
        summary=_summary(snapshot, warmup_seconds),
        signals=_signals(snapshot, now, warmup_seconds, prometheus),
        last_decision=_record(decision, now, applied),
        alerts=[
            ActiveAlert(
                reason=a.reason,
                since=a.since,
                message=a.message,
                acknowledged=a.acknowledged,
            )
            for a in decision.alerts
        ],
        suspected_change=suspected_change,
        learned_state=pack_learned_state(learned),
    )
    return Rendered(status.to_wire(), status.conditions, learned)


def render_problem(
    previous: CacheScalingPolicyStatus,
    reason: Problem,
    message: str,
    *,
    generation: int,
    now: datetime,
    also: tuple[ConditionType, ...] = (),
) -> Rendered:
    """The status when no decision could be made (invalid spec, target missing...):
    Ready=False with the reason, and so are the conditions in ``also`` (e.g.
    MetricsAvailable when Prometheus may not be read); everything else (memory included)
    is kept."""
    verdicts = [
        ConditionVerdict(kind, ConditionStatus.FALSE, reason, message)
        for kind in (ConditionType.READY, *also)
    ]
    status = previous.model_copy(
        update={
            "observed_generation": generation,
            "state": reason,
            "conditions": merge_conditions(previous.conditions, verdicts, now),
        }
    )
    return Rendered(status.to_wire(), status.conditions, None)


def _record(decision: Decision, now: datetime, applied: bool) -> DecisionRecord:
    envelope = decision.envelope
    return DecisionRecord(
        time=now,
        diagnosis=decision.state.value,
        reason=decision.reason,
        message=decision.message,
        min_replicas=envelope.min_replicas,
        max_replicas=envelope.max_replicas,
        max_num_seqs=decision.max_num_seqs,
        applied=applied,
    )


def _signals(
    snapshot: Snapshot, now: datetime, warmup_seconds: float, prometheus: str | None
) -> ObservedSignals:
    signals = snapshot.signals
    measured = signals.signals()
    values: dict[str, Any] = {}
    unknown = []
    qualified = []
    for name, field in STATUS_FIELDS.items():
        value = measured[name]
        if value.value is not None:
            bounded = min(value.value, 1.0) if value.unit is Unit.RATIO else value.value
            values[field] = max(0.0, bounded)
            if value.lower_bound or value.bucket is not None:
                qualified.append(QualifiedSignal(signal=field, reads=words.latency(value)))
        else:
            unknown.append(UnknownSignal(signal=field, reason=str(value.reason)))
    warm = signals.warm_token_hit_rate(warmup_seconds)
    if warm.value is not None:  # rate() extrapolation can put a young pod's ratio above 1
        values["tokenHitRate"] = min(1.0, max(0.0, warm.value))
    workload = snapshot.workload
    return ObservedSignals.model_validate(
        {
            **values,
            "replicas": workload.replicas,
            "readyReplicas": workload.ready_replicas,
            "warmReplicas": workload.warm_replicas(warmup_seconds),
            "maxNumSeqs": workload.max_num_seqs,
            "observedAt": now,
            "prometheus": prometheus,
            "unknownSignals": [u.to_wire() for u in unknown],
            "qualifiedSignals": [q.to_wire() for q in qualified],
        }
    )


SIGNIFICANT_DIGITS = 3
"""The most significant digits a ``summary`` figure (a ``kubectl get`` cell) shows."""


def significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits: 0.8744 → 0.874, 1142.3 → 1140."""
    return float(f"{value:.{digits}g}")


def _summary(snapshot: Snapshot, warmup_seconds: float) -> Summary:
    """The figures ``kubectl get csp`` prints: the warm-pod hit rate to two decimals, TTFT
    p95 as read and GPU-s/1k as a whole number, each to at most three significant digits."""
    signals = snapshot.signals
    warm = signals.warm_token_hit_rate(warmup_seconds).value
    p95 = signals.ttft_p95_seconds
    cost = signals.gpu_seconds_per_1k_requests.value
    return Summary(
        hit_rate=None if warm is None else words.ratio(min(1.0, max(0.0, warm))),
        ttft_p95=None if p95.value is None else words.latency_cell(_rounded(p95)),
        gpu_seconds_per_1k=None if cost is None else round(significant(max(0.0, cost))),
    )


def _rounded(quantile: Measured) -> Measured:
    """``quantile`` with its value to three significant digits (its bucket as it is)."""
    assert quantile.value is not None
    return replace(quantile, value=significant(quantile.value))
