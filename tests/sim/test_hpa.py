"""The HPA model against the Kubernetes controller's rules, case by case."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from cachescale.sim.hpa import (
    HPABehavior,
    HPAModel,
    HPAScalingPolicy,
    HPAScalingRules,
    HPASpec,
)

NO_DOWN_WINDOW = HPABehavior(scale_down=HPAScalingRules(stabilization_window_seconds=0))


@dataclass(frozen=True)
class Case:
    name: str
    current: int
    metrics: list[float]
    desired: int
    reason: str
    spec: HPASpec = field(default_factory=lambda: HPASpec(max_replicas=100))
    missing: int = 0
    pending: int = 0


CASES = [
    Case("within tolerance", 4, [5.4] * 4, 4, "WithinTolerance"),
    Case("just outside tolerance", 4, [5.6] * 4, 5, "DesiredWithinRange"),
    Case("ratio 2 doubles", 4, [10.0] * 4, 8, "DesiredWithinRange"),
    Case("ratio 6 capped at +100%", 10, [30.0] * 10, 20, "ScaleUpLimit"),
    Case("Pods 4 beats Percent 100 under Max", 2, [25.0] * 2, 6, "ScaleUpLimit"),
    Case(
        "Min picks Percent 100",
        2,
        [25.0] * 2,
        4,
        "ScaleUpLimit",
        HPASpec(
            max_replicas=100,
            behavior=HPABehavior(scale_up=HPAScalingRules(select_policy="Min")),
        ),
    ),
    Case("max clamps", 4, [10.0] * 4, 6, "TooManyReplicas", HPASpec(max_replicas=6)),
    Case(
        "min clamps",
        8,
        [0.0] * 8,
        3,
        "TooFewReplicas",
        HPASpec(min_replicas=3, max_replicas=10, behavior=NO_DOWN_WINDOW),
    ),
    Case(
        "scale-down: Percent 100 allows going to the proposal",
        8,
        [1.0] * 8,
        2,
        "DesiredWithinRange",
        HPASpec(max_replicas=10, behavior=NO_DOWN_WINDOW),
    ),
    Case(
        "scale-down limited by a Pods policy",
        8,
        [1.0] * 8,
        6,
        "ScaleDownLimit",
        HPASpec(
            max_replicas=10,
            behavior=HPABehavior(
                scale_down=HPAScalingRules(
                    stabilization_window_seconds=0,
                    policies=(HPAScalingPolicy(type="Pods", value=2, period_seconds=60),),
                )
            ),
        ),
    ),
    # Missing pods (running, no sample): 0 on a scale-up → ratio back to 1 → no change.
    Case("missing pods damp a scale-up", 4, [10.0, 10.0], 4, "WithinTolerance", missing=2),
    # …and the target on a scale-down: (1+1+5+5)/4 = 3 → 0.6 × 4 pods → 3.
    Case(
        "missing pods damp a scale-down",
        4,
        [1.0, 1.0],
        3,
        "DesiredWithinRange",
        HPASpec(max_replicas=10, behavior=NO_DOWN_WINDOW),
        missing=2,
    ),
    # Pending pods count as 0 on a scale-up: 20/6 → ratio 0.67 flips direction → keep.
    Case("pending pods flip a scale-up: keep", 6, [10.0, 10.0], 6, "DesiredWithinRange", pending=4),
    # Without them the proposal uses only the pods that report: ceil(2 × 2) = 4.
    Case(
        "no pending: ready pods only",
        6,
        [10.0, 10.0],
        4,
        "DesiredWithinRange",
        HPASpec(max_replicas=10, behavior=NO_DOWN_WINDOW),
    ),
    # Pending pods are ignored on a scale-down.
    Case(
        "pending ignored on scale-down",
        4,
        [1.0, 1.0],
        1,
        "DesiredWithinRange",
        HPASpec(max_replicas=10, behavior=NO_DOWN_WINDOW),
        pending=2,
    ),
    Case("no metrics: freeze", 5, [], 5, "FailedGetPodsMetric"),
    Case("zero replicas: disabled", 0, [50.0], 0, "ScalingDisabled"),
    Case(
        "above max: clamp first", 12, [0.0] * 12, 10, "AboveMaxReplicas", HPASpec(max_replicas=10)
    ),
    Case("below min: clamp first", 1, [50.0], 2, "BelowMinReplicas", HPASpec(min_replicas=2)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_single_sync(case: Case) -> None:
    hpa = HPAModel(case.spec)
    decision = hpa.step(
        0.0, case.current, case.metrics, missing_pods=case.missing, pending_pods=case.pending
    )
    assert (decision.desired_replicas, decision.reason) == (case.desired, case.reason)
    assert decision.synced


def test_scale_down_waits_out_the_window_and_uses_the_max_recommendation() -> None:
    hpa = HPAModel(HPASpec(max_replicas=20))
    assert hpa.step(0, 10, [5.0] * 10).desired_replicas == 10  # recommendation 10
    replicas = 10
    history = []
    for t in range(15, 361, 15):
        # At t=60 the metric says 6 pods, afterwards 2 pods.
        metric = 3.0 if t == 60 else 1.0
        d = hpa.step(t, replicas, [metric] * replicas)
        history.append((t, d.desired_replicas, d.reason))
        replicas = d.desired_replicas
    by_t = {t: (r, reason) for t, r, reason in history}
    assert by_t[285] == (10, "ScaleDownStabilized")  # t=0's recommendation of 10 still in
    assert by_t[300][0] == 6  # t=0 left the window (strictly older); t=60's 6 remains
    assert by_t[345][0] == 6
    assert by_t[360][0] == 2  # t=60 left the window


def test_scale_up_rate_counts_recent_events() -> None:
    hpa = HPAModel(HPASpec(max_replicas=100, sync_period_s=5))
    assert hpa.step(0, 4, [20.0] * 4).desired_replicas == 8  # +100% / +4
    d = hpa.step(5, 8, [20.0] * 8)  # period start is still 4: at most 8
    assert (d.desired_replicas, d.reason) == (8, "ScaleUpLimit")
    assert d.metric_replicas == 32
    assert hpa.step(10, 8, [20.0] * 8).desired_replicas == 8
    assert hpa.step(15, 8, [20.0] * 8).desired_replicas == 16  # t=0 event aged out


def test_scale_up_stabilization_window_takes_the_minimum() -> None:
    spec = HPASpec(
        max_replicas=100,
        behavior=HPABehavior(scale_up=HPAScalingRules(stabilization_window_seconds=60)),
    )
    hpa = HPAModel(spec)
    assert hpa.step(0, 4, [5.0] * 4).desired_replicas == 4  # recommendation 4
    d = hpa.step(15, 4, [10.0] * 4)
    assert (d.desired_replicas, d.reason) == (4, "ScaleUpStabilized")
    assert hpa.step(60, 4, [10.0] * 4).desired_replicas == 8  # t=0 no longer inside


def test_disabled_direction_never_scales() -> None:
    spec = HPASpec(
        max_replicas=10,
        behavior=HPABehavior(
            scale_down=HPAScalingRules(stabilization_window_seconds=0, select_policy="Disabled")
        ),
    )
    d = HPAModel(spec).step(0, 8, [0.0] * 8)
    assert d.desired_replicas == 8
    assert d.reason == "ScaleDownLimit"


def test_overrides_reshape_the_envelope_for_one_sync() -> None:
    hpa = HPAModel(HPASpec(max_replicas=20, sync_period_s=1))
    d = hpa.step(0, 10, [5.0] * 10, max_replicas=6)
    assert (d.desired_replicas, d.reason) == (6, "AboveMaxReplicas")  # no policy applies
    d = hpa.step(1, 6, [10.0] * 6, max_replicas=8)
    assert (d.desired_replicas, d.reason) == (8, "TooManyReplicas")
    d = hpa.step(2, 8, [10.0] * 8, target=10.0)
    assert (d.desired_replicas, d.reason) == (8, "WithinTolerance")
    d = hpa.step(3, 8, [10.0] * 8, min_replicas=12)
    assert (d.desired_replicas, d.reason) == (12, "BelowMinReplicas")
    assert hpa.step(4, 12, [10.0] * 12).desired_replicas == 20  # spec envelope again
    with pytest.raises(ValueError, match="min_replicas"):
        hpa.step(5, 4, [1.0], min_replicas=5, max_replicas=4)


def test_sync_period_gates_steps() -> None:
    hpa = HPAModel(HPASpec(max_replicas=100))
    assert hpa.step(0, 4, [10.0] * 4).desired_replicas == 8
    d = hpa.step(7, 8, [50.0] * 8)
    assert (d.desired_replicas, d.reason, d.synced) == (8, "NotDue", False)
    assert hpa.step(15, 8, [50.0] * 8).synced


def test_metric_is_averaged_in_milli_units_like_the_custom_metrics_api() -> None:
    # (0.0004 + 0.0004) → 1m + 1m (rounded up); a float average would be 0.0004.
    d = HPAModel(HPASpec(target_average_value=0.001, max_replicas=10)).step(0, 2, [0.0004] * 2)
    assert d.usage_ratio == pytest.approx(1.0)
    assert d.reason == "WithinTolerance"


def test_spec_validation() -> None:
    with pytest.raises(ValidationError, match="min_replicas"):
        HPASpec(min_replicas=5, max_replicas=4)
    with pytest.raises(ValidationError):
        HPAScalingPolicy(type="Pods", value=1, period_seconds=1801)
    with pytest.raises(ValidationError):
        HPAScalingRules(policies=())
    with pytest.raises(ValidationError):
        HPASpec.model_validate({"targetAverageValue": 3})
