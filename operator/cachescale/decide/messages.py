"""The action an evaluation took, in a reason and words a human reads.

``action`` names what happened to the HPA envelope and the batch ceiling — the
``reason`` of the decision, which becomes the Event when the change is applied — and
describes it with its numbers; ``collapse_action`` says what a collapse alert did to the
replicas. Wording only: the decisions themselves are made in ``envelope.py``,
``slo_guard.py``, ``slo_floors.py`` and ``batching.py``.
"""

from __future__ import annotations

from cachescale.api.reasons import Action, Hold
from cachescale.api.spec import CacheScalingPolicySpec, CollapseAction
from cachescale.decide import words
from cachescale.decide.batching import BatchPlan
from cachescale.decide.envelope import EnvelopePlan
from cachescale.decide.slo_floors import MinFloor
from cachescale.decide.thresholds import MIN_RELEASE_STEP, SCALE_DOWN_FLOOR_HOLD_SECONDS
from cachescale.snapshot import Measured, Snapshot


def sacrificed(spec: CacheScalingPolicySpec, plan: EnvelopePlan) -> bool:
    """``CapAtBudget`` keeps maxReplicas below what the SLO needs (the user's explicit choice)."""
    return (
        spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET
        and plan.slo_needed is not None
        and plan.slo_needed > plan.envelope.max_replicas
    )


def sacrifice_words(spec: CacheScalingPolicySpec, plan: EnvelopePlan, p95: Measured) -> str:
    """The plain statement that latency is being sacrificed, and how much."""
    slo = words.seconds(spec.slo.ttft_p95_seconds)
    latency = (
        f"TTFT p95 {words.latency(p95)} against the {slo} SLO"
        if p95.is_known
        else f"TTFT over the {slo} SLO"
    )
    return (
        f"latency is being sacrificed to the budget (onCollapse: CapAtBudget): {latency}; "
        f"the SLO needs {plan.slo_needed} replicas at the current cost"
    )


def collapse_action(
    spec: CacheScalingPolicySpec, plan: EnvelopePlan, hpa_wanted: int | None, p95: Measured
) -> str:
    """What a collapse did to the replicas, for the collapse alert's message."""
    max_replicas = plan.envelope.max_replicas
    wanted = (
        f" instead of the {hpa_wanted} the HPA wanted"
        if hpa_wanted and hpa_wanted > max_replicas
        else ""
    )
    if plan.held_by == Hold.COLLAPSE:
        return f"replicas held at {max_replicas}{wanted}"
    if plan.drain is not None and plan.slo_guard and max_replicas >= plan.drain.replicas:
        return (
            f"TTFT breached the SLO, so replicas may grow to {max_replicas} "
            f"{plan.drain.purpose()}, as the HPA's own metric asks (the SLO needs "
            f"{plan.slo_needed} once they are served)"
        )
    if plan.slo_needed is not None and plan.slo_guard and max_replicas >= plan.slo_needed:
        over = (
            f", above the budget's {plan.budget_max}"
            if plan.budget_max is not None and plan.budget_max < max_replicas
            else ""
        )
        return (
            f"TTFT breached the SLO, so replicas may grow to {max_replicas}, what the SLO needs at "
            f"the current cost{over}"
        )
    if plan.slo_guard:
        return f"TTFT breaches the SLO, so replicas may grow to the budget's {max_replicas}{wanted}"
    if spec.cache.on_collapse is CollapseAction.SCALE_AS_USUAL:
        return f"scaling as usual (onCollapse: ScaleAsUsual), up to {max_replicas}"
    if sacrificed(spec, plan):
        sacrifice = sacrifice_words(spec, plan, p95)
        return f"replicas capped at the budget's {max_replicas}{wanted}: {sacrifice}"
    return f"replicas capped at the budget's {max_replicas}{wanted}"


def action(
    snapshot: Snapshot, plan: EnvelopePlan, batch: BatchPlan, hpa_wanted: int | None
) -> tuple[Action, str]:
    """``(reason, words)`` of what this evaluation does to the envelope and the ceiling."""
    hpa = snapshot.workload.hpa
    envelope = plan.envelope
    parts = []
    changed = (envelope.min_replicas, envelope.max_replicas) != (hpa.min_replicas, hpa.max_replicas)
    retarget = envelope.target_average_value != hpa.target_average_value
    if batch.reason is not None:
        reason = batch.reason
    elif plan.held_by == Hold.COLLAPSE:
        reason = Action.HELD_FOR_PREFIX_COLLAPSE
    elif plan.slo_guard:
        reason = Action.SCALED_FOR_SLO
    elif (
        plan.held_by == Hold.BUDGET
        and hpa_wanted is not None
        and hpa_wanted > envelope.max_replicas
    ):
        reason = Action.CAPPED_AT_BUDGET
    elif changed or retarget:
        reason = Action.ENVELOPE_UPDATED
    else:
        reason = Action.NO_CHANGE
    parts.append(
        f"HPA envelope {envelope.min_replicas}..{envelope.max_replicas}"
        + (f" (was {hpa.min_replicas}..{hpa.max_replicas})" if changed else "")
    )
    if retarget and envelope.target_average_value is not None:
        parts.append(f"target {hpa.target_average_value:g} → {envelope.target_average_value:g}")
    if plan.budget_max is not None:
        parts.append(f"budget allows {plan.budget_max}")
    if plan.headroom is not None and envelope.max_replicas > (plan.budget_max or 0):
        parts.append(f"room for rising demand {plan.headroom} (requests cost what they did)")
    if plan.slo_needed is not None:
        parts.append(f"the SLO needs {plan.slo_needed}")
    if plan.drain is not None:
        parts.append(f"{plan.drain.replicas} {plan.drain.purpose()}")
    if plan.min_floor is not None:
        parts.append(_min_floor_words(plan.min_floor, plan))
    if batch.message:
        parts.append(batch.message)
    return reason, "; ".join(parts)


def _min_floor_words(floor: int, plan: EnvelopePlan) -> str:
    """Why minReplicas is raised above the user's own, and until when."""
    kind = plan.min_floor_kind or MinFloor.SLO_NEED
    after_scale_down = plan.learned.scale_down_floor
    if kind is MinFloor.AFTER_SCALE_DOWN and after_scale_down is not None:
        hold = _hold_words(after_scale_down.hold_seconds)
        return f"minReplicas {floor}, {_MIN_FLOOR_WHY[kind]}{hold}"
    return f"minReplicas {floor}, {_MIN_FLOOR_WHY[kind]}"


def _hold_words(hold_seconds: float) -> str:
    """``, held until 60 min after the last breach``, and why when it is longer."""
    words = f", held until {hold_seconds / 60:.0f} min after the last breach"
    if hold_seconds > SCALE_DOWN_FLOOR_HOLD_SECONDS:
        words += " (its last release broke the SLO again)"
    return words


_MIN_FLOOR_WHY = {
    MinFloor.SLO_NEED: (
        "the pods that serve the arrivals at the current rate per pod, while TTFT breaches the SLO"
    ),
    MinFloor.AFTER_SCALE_DOWN: (
        "one above the fewest replicas the HPA had scaled down to when TTFT breached the SLO"
    ),
    MinFloor.RELEASING: f"coming down {MIN_RELEASE_STEP:.0%} per evaluation after the SLO breach",
    MinFloor.RELEASING_PER_WINDOW: (
        f"coming down {MIN_RELEASE_STEP:.0%} per metrics window after the SLO breach (the "
        "HPA's metric is not the running batch: it would not catch a fleet too small before "
        "TTFT breached)"
    ),
    MinFloor.HELD_IN_BREACH: (
        "held while TTFT breaches the SLO (it was coming down after the last breach)"
    ),
    MinFloor.HELD_IN_COLLAPSE: (
        "the pods that serve the arrivals at the rate per pod the SLO breach measured, "
        "held while the PrefixCollapse alert lasts"
    ),
}
"""The words after ``minReplicas N,`` for each of the SLO guard's floors."""
