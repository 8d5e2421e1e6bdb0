"""The Kubernetes HPA (autoscaling/v2) on a per-pod queue metric: the baseline users run today.

The incident cachescale answers is an HPA scaling a vLLM Deployment on ``vllm:num_requests_waiting``
(a ``Pods`` metric with an ``averageValue`` target) and reading a prefix-cache collapse as
load. To show that, and to compare cachescale against it on the same seed, the simulator
needs the HPA's real arithmetic — tolerance, the treatment of pods without metrics, the
stabilization windows and the rate policies — not a proportional controller that merely
looks like it. This module reproduces ``pkg/controller/podautoscaler`` (``horizontal.go``
and ``replica_calculator.go``) for one Pods metric, as a pure object: time is passed in,
nothing is read from a clock, and the envelope (min/max replicas, target) can be
overridden per step so a policy engine can reshape it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HPAScalingPolicy(_Model):
    """One rate limit: at most ``value`` pods (or percent) of change per ``period_seconds``."""

    type: Literal["Pods", "Percent"] = Field(description="Pods: absolute; Percent: relative.")
    value: int = Field(gt=0, description="Pods or percent allowed per period.")
    period_seconds: int = Field(
        gt=0, le=1800, description="Look-back window of past scale events, seconds."
    )


class HPAScalingRules(_Model):
    """Behavior of one direction; unset fields take the Kubernetes default for it."""

    stabilization_window_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Recommendations from this many past seconds are considered (scale-up: "
        "their minimum, scale-down: their maximum). Default: 0 up, 300 down.",
    )
    select_policy: Literal["Max", "Min", "Disabled"] = Field(
        default="Max",
        description="Max: the policy allowing the most change wins; Min: the least; "
        "Disabled: no scaling in this direction.",
    )
    policies: tuple[HPAScalingPolicy, ...] | None = Field(
        default=None,
        min_length=1,
        description="Rate limits. Default: up Percent 100 and Pods 4 per 15 s; down "
        "Percent 100 per 15 s.",
    )


class HPABehavior(_Model):
    """``spec.behavior``: per-direction stabilization and rate policies."""

    scale_up: HPAScalingRules = Field(
        default_factory=HPAScalingRules, description="Scale-up rules."
    )
    scale_down: HPAScalingRules = Field(
        default_factory=HPAScalingRules, description="Scale-down rules."
    )


class HPASpec(_Model):
    """An HPA on the average of one Pods metric (``vllm:num_requests_waiting``)."""

    min_replicas: int = Field(default=1, ge=1, description="spec.minReplicas.")
    max_replicas: int = Field(default=20, ge=1, description="spec.maxReplicas.")
    target_average_value: float = Field(
        default=5.0, gt=0, description="Target of the metric averaged over pods (averageValue)."
    )
    tolerance: float = Field(
        default=0.1,
        ge=0,
        description="No scaling while |metric/target − 1| ≤ tolerance "
        "(kube-controller-manager --horizontal-pod-autoscaler-tolerance).",
    )
    sync_period_s: float = Field(
        default=15.0,
        gt=0,
        description="Seconds between reconciliations (--horizontal-pod-autoscaler-sync-period).",
    )
    behavior: HPABehavior = Field(default_factory=HPABehavior, description="spec.behavior.")

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


_DEFAULT_UP_POLICIES = (
    HPAScalingPolicy(type="Percent", value=100, period_seconds=15),
    HPAScalingPolicy(type="Pods", value=4, period_seconds=15),
)
_DEFAULT_DOWN_POLICIES = (HPAScalingPolicy(type="Percent", value=100, period_seconds=15),)


@dataclass(frozen=True, slots=True)
class _Rules:
    window_s: float
    select: Literal["Max", "Min", "Disabled"]
    policies: tuple[HPAScalingPolicy, ...]


@dataclass(frozen=True, slots=True)
class HPADecision:
    """What one HPA sync decided, with the intermediate numbers for reports."""

    desired_replicas: int
    reason: str
    """CamelCase, as the HPA's conditions: DesiredWithinRange, WithinTolerance,
    ScaleUpStabilized, ScaleDownStabilized, ScaleUpLimit, ScaleDownLimit, TooManyReplicas,
    TooFewReplicas, AboveMaxReplicas, BelowMinReplicas, FailedGetPodsMetric, ScalingDisabled,
    NotDue (called before the sync period elapsed; nothing evaluated)."""
    message: str
    synced: bool
    """False when the call fell inside the sync period and changed nothing."""
    metric_replicas: int | None = None
    """The replica calculator's proposal before stabilization and policies."""
    usage_ratio: float | None = None
    """Average metric over ready pods / target (None without metrics)."""


def _milli(value: float) -> int:
    """A metric as the custom-metrics API hands it to the HPA: ``Quantity.MilliValue()``
    (milli-units, rounded up)."""
    return math.ceil(round(value * 1000.0, 6))


class HPAModel:
    """One HPA's controller state (recommendation history, scale events) and its sync."""

    def __init__(self, spec: HPASpec) -> None:
        self.spec = spec
        up, down = spec.behavior.scale_up, spec.behavior.scale_down
        self._up = _Rules(
            float(up.stabilization_window_seconds or 0),
            up.select_policy,
            up.policies or _DEFAULT_UP_POLICIES,
        )
        # An unset scale-down window takes the controller flag's value, 300 s by default
        # (maybeInitScaleDownStabilizationWindow).
        down_window = down.stabilization_window_seconds
        self._down = _Rules(
            300.0 if down_window is None else float(down_window),
            down.select_policy,
            down.policies or _DEFAULT_DOWN_POLICIES,
        )
        self._recommendations: list[tuple[float, int]] = []
        self._up_events: list[tuple[float, int]] = []
        self._down_events: list[tuple[float, int]] = []
        self._last_sync_s: float | None = None

    def step(
        self,
        now_s: float,
        current_replicas: int,
        metrics: Sequence[float],
        *,
        missing_pods: int = 0,
        pending_pods: int = 0,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        target: float | None = None,
    ) -> HPADecision:
        """Run one sync if the sync period has elapsed since the last one.

        ``current_replicas`` is the target's ``scale.spec.replicas``. ``metrics`` holds the
        metric of every running pod that reports it. ``missing_pods`` are running pods with
        no sample (a vLLM pod still loading weights); ``pending_pods`` are pods in phase
        Pending. ``min_replicas`` / ``max_replicas`` / ``target`` override the spec for this
        sync (an envelope reshaped by a policy engine) and are recorded nowhere else.
        """
        last = self._last_sync_s
        if last is not None and now_s < last + self.spec.sync_period_s - 1e-9:
            return HPADecision(current_replicas, "NotDue", "within the sync period", synced=False)
        self._last_sync_s = now_s
        lo = self.spec.min_replicas if min_replicas is None else min_replicas
        hi = self.spec.max_replicas if max_replicas is None else max_replicas
        if not 1 <= lo <= hi:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {lo}, {hi}")
        tgt = self.spec.target_average_value if target is None else target
        if tgt <= 0:
            raise ValueError(f"target must be positive, got {tgt}")

        # reconcileAutoscaler: out-of-range replica counts are clamped before any metric
        # is read, without touching the recommendation history.
        if current_replicas == 0:
            return HPADecision(0, "ScalingDisabled", "scale.spec.replicas is 0", synced=True)
        if current_replicas > hi:
            self._record_scale(now_s, current_replicas, hi)
            return HPADecision(hi, "AboveMaxReplicas", "current replicas above max", synced=True)
        if current_replicas < lo:
            self._record_scale(now_s, current_replicas, lo)
            return HPADecision(lo, "BelowMinReplicas", "current replicas below min", synced=True)

        proposal = self._replicas_for_metric(
            current_replicas, metrics, missing_pods, pending_pods, _milli(tgt)
        )
        if proposal is None:
            # computeReplicasForMetrics fails: ScalingActive=False, the scale is left alone.
            return HPADecision(
                current_replicas, "FailedGetPodsMetric", "no pod reports the metric", synced=True
            )
        metric_replicas, ratio, within_tolerance = proposal
        stabilized = self._stabilize(now_s, current_replicas, metric_replicas)
        desired, reason, message = self._limit(now_s, current_replicas, stabilized, lo, hi)
        if desired == stabilized:
            if stabilized != metric_replicas:
                up = metric_replicas >= current_replicas
                reason = "ScaleUpStabilized" if up else "ScaleDownStabilized"
                message = "a recent recommendation within the stabilization window applies"
            elif within_tolerance:
                reason, message = "WithinTolerance", "metric within tolerance of the target"
        if desired != current_replicas:
            self._record_scale(now_s, current_replicas, desired)
        return HPADecision(
            desired,
            reason,
            message,
            synced=True,
            metric_replicas=metric_replicas,
            usage_ratio=ratio,
        )

    # -- replica_calculator.go: GetMetricReplicas → calcPlainMetricReplicas ----------------

    def _replicas_for_metric(
        self,
        current: int,
        metrics: Sequence[float],
        missing: int,
        pending: int,
        target_milli: int,
    ) -> tuple[int, float, bool] | None:
        """(proposal, usage ratio over reporting pods, within tolerance), or None.

        groupPods: for a Pods metric readiness is *not* checked (that is CPU-only); a pod in
        phase Pending is "unready", a running pod without a sample is "missing", every pod
        with a sample counts. The ratio is computed over pods with samples only. Then:
        missing pods count as using the target on a scale-down and 0 on a scale-up; unready
        pods count as 0, and only on a scale-up. If either changes the direction (or lands
        within tolerance) the HPA keeps the current count.
        """
        if not metrics:
            return None
        values = [_milli(v) for v in metrics]
        ratio = (sum(values) // len(values)) / target_milli
        ready = len(values)
        tol = self.spec.tolerance
        scale_up_with_unready = pending > 0 and ratio > 1.0
        if not scale_up_with_unready and missing == 0:
            if abs(1.0 - ratio) <= tol:
                return current, ratio, True
            return math.ceil(ratio * ready), ratio, False

        if missing:
            values += [target_milli if ratio < 1.0 else 0] * missing
        if scale_up_with_unready:
            values += [0] * pending
        new_ratio = (sum(values) // len(values)) / target_milli
        if abs(1.0 - new_ratio) <= tol or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
            return current, ratio, abs(1.0 - new_ratio) <= tol
        new = math.ceil(new_ratio * len(values))
        if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
            return current, ratio, False
        return new, ratio, False

    # -- horizontal.go: normalizeDesiredReplicasWithBehaviors -----------------------------

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        """stabilizeRecommendationWithBehaviors: clamp ``current`` between the minimum of
        the recommendations inside the scale-up window and the maximum of those inside the
        scale-down window (both including this one), then record the raw recommendation."""
        up_cut = now - self._up.window_s
        down_cut = now - self._down.window_s
        up_rec = down_rec = desired
        for t, rec in self._recommendations:
            if t > up_cut:
                up_rec = min(up_rec, rec)
            if t > down_cut:
                down_rec = max(down_rec, rec)
        # Samples older than both windows are never read again (the controller reuses
        # their slots); dropping them keeps the history bounded.
        oldest = min(up_cut, down_cut)
        self._recommendations = [(t, r) for t, r in self._recommendations if t >= oldest]
        self._recommendations.append((now, desired))
        return min(max(current, up_rec), down_rec)

    def _limit(
        self, now: float, current: int, desired: int, lo: int, hi: int
    ) -> tuple[int, str, str]:
        """convertDesiredReplicasWithBehaviorRate: the rate policies, then min/max."""
        if desired > current:
            limit = max(self._rate_limit(now, current, self._up, up=True), current)
            if hi > limit:
                allowed, reason = limit, "ScaleUpLimit"
                message = "the desired replica count is increasing faster than the maximum rate"
            else:
                allowed, reason = hi, "TooManyReplicas"
                message = "the desired replica count is more than the maximum replica count"
            if desired > allowed:
                return allowed, reason, message
        elif desired < current:
            limit = min(self._rate_limit(now, current, self._down, up=False), current)
            if lo < limit:
                allowed, reason = limit, "ScaleDownLimit"
                message = "the desired replica count is decreasing faster than the maximum rate"
            else:
                allowed, reason = lo, "TooFewReplicas"
                message = "the desired replica count is less than the minimum replica count"
            if desired < allowed:
                return allowed, reason, message
        return desired, "DesiredWithinRange", "the desired count is within the acceptable range"

    def _rate_limit(self, now: float, current: int, rules: _Rules, *, up: bool) -> int:
        """calculateScale{Up,Down}Limit…: the bound each policy allows from the replica
        count at the start of its period (current − added + deleted within the period),
        combined by selectPolicy (Max = most change)."""
        if rules.select == "Disabled":
            return current
        proposals = []
        for p in rules.policies:
            cut = now - p.period_seconds
            added = sum(c for t, c in self._up_events if t > cut)
            deleted = sum(c for t, c in self._down_events if t > cut)
            start = current - added + deleted
            if p.type == "Pods":
                proposals.append(start + p.value if up else start - p.value)
            elif up:  # rounded up, or a small Deployment could never grow
                proposals.append(math.ceil(start * (1 + p.value / 100)))
            else:  # int32() truncation
                proposals.append(int(start * (1 - p.value / 100)))
        most_change = max if up else min
        least_change = min if up else max
        return (most_change if rules.select == "Max" else least_change)(proposals)

    def _record_scale(self, now: float, before: int, after: int) -> None:
        """storeScaleEvent, keeping only events a policy period can still see."""
        if after == before:
            return
        longest = max(
            (p.period_seconds for r in (self._up, self._down) for p in r.policies), default=0
        )
        cut = now - longest
        self._up_events = [(t, c) for t, c in self._up_events if t > cut]
        self._down_events = [(t, c) for t, c in self._down_events if t > cut]
        if after > before:
            self._up_events.append((now, after - before))
        else:
            self._down_events.append((now, before - after))
