"""A KEDA ScaledObject as the policy's autoscaler, on kmock: read, patch, restore, conflict
retry, and each of KEDA's traps surfaced (ignoreNullValues, Fallback, paused, a scaler
that is not Prometheus). The HPA KEDA generates is read and never written."""

from __future__ import annotations

import json
from typing import Any

import kmock
import pytest

from cachescale.api.policy import MANAGED_BY, ORIGINAL_ENVELOPE
from cachescale.api.reasons import ConditionReason, Diagnosis, Hold, Problem
from cachescale.api.spec import TargetSpec
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import evaluate
from cachescale.controller.target.actions import apply_envelope, restore_envelope, scaled_object_ops
from cachescale.controller.target.claims import claim_key, index_entry, refusal
from cachescale.controller.target.keda import (
    ScaledObjectError,
    notes,
    read_scaled_object,
    scaled_object_view,
)
from cachescale.controller.target.workload import TargetError
from cachescale.decide.envelope import Envelope
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, deployment, hpa, pods, policy
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.reconcile.test_evaluation import SETTLE, conditions, events
from tests.gather.gather_fakes import FakePrometheus

SCALED_OBJECTS = "keda.sh/v1alpha1/scaledobjects"
HPAS = "autoscaling/v2/horizontalpodautoscalers"
DEPLOYMENTS = "apps/v1/deployments"
POLICIES = "cachescale.dev/v1alpha1/cachescalingpolicies"
TARGET = TargetSpec(deployment_name="vllm", scaled_object_name="vllm")
QUERY = 'sum(vllm:num_requests_waiting{namespace="llm",model_name="vllm"})'


def scaled_object(
    *,
    min_count: int | None = 2,
    max_count: int | None = 40,
    trigger_metadata: dict[str, Any] | None = None,
    triggers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """production-stack's ScaledObject: a Prometheus trigger on the waiting queue, threshold
    5, plus the fields cachescale must leave alone."""
    spec: dict[str, Any] = {
        "scaleTargetRef": {"name": "vllm"},
        "pollingInterval": 15,
        "cooldownPeriod": 360,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}
            }
        },
        "triggers": triggers
        if triggers is not None
        else [
            {
                "type": "prometheus",
                "metadata": {
                    "serverAddress": "http://prometheus.monitoring:9090",
                    "query": QUERY,
                    "threshold": "5",
                    **(trigger_metadata or {}),
                },
            }
        ],
    }
    if min_count is not None:
        spec["minReplicaCount"] = min_count
    if max_count is not None:
        spec["maxReplicaCount"] = max_count
    meta: dict[str, Any] = {"name": "vllm", "namespace": NAMESPACE}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta,
        "spec": spec,
        "status": {
            "hpaName": "keda-hpa-vllm",
            "conditions": conditions
            or [
                {"type": "Ready", "status": "True"},
                {"type": "Active", "status": "True"},
                {"type": "Fallback", "status": "False"},
            ],
        },
    }


def keda_hpa() -> dict[str, Any]:
    """The HPA KEDA generated, owned by the ScaledObject."""
    owner = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": "vllm"}
    body = hpa("keda-hpa-vllm", max_replicas=40, owner=owner)
    body["status"] = {"currentReplicas": 11, "desiredReplicas": 14}
    return body


@pytest.fixture
def keda(cluster: FakeCluster) -> FakeCluster:
    cluster.serve_resource(SCALED_OBJECTS, {"namespaced": True, "kind": "ScaledObject"})
    return cluster


def keda_stack(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    body: dict[str, Any] | None = None,
    **policy_args: Any,
) -> EngineNumbers:
    """The evaluation tests' stack with a ScaledObject (and KEDA's HPA) instead of an HPA."""
    cluster.put(DEPLOYMENTS, deployment("vllm", replicas=11))
    cluster.put(SCALED_OBJECTS, body or scaled_object())
    cluster.put(HPAS, keda_hpa())
    for pod in pods("vllm", 11, clock.now):
        cluster.put("v1/pods", pod)
    found = policy("vllm", prometheus_url=prometheus.url, **policy_args)
    found["spec"]["target"] = {"deploymentName": "vllm", "scaledObjectName": "vllm"}
    cluster.put(POLICIES, found)
    numbers = EngineNumbers(pods=tuple(f"vllm-{i}" for i in range(11)))
    engines.set({"namespace": NAMESPACE, "model_name": "vllm"}, numbers)
    return numbers


def run(operator: Operator, cluster: FakeCluster, clock: Clock, rounds: int) -> None:
    for _ in range(rounds):
        evaluate(operator, PolicyObject.of(cluster.get(POLICIES, "vllm")))
        clock.advance(10)


def ready_message(cluster: FakeCluster) -> str:
    status = cluster.get(POLICIES, "vllm")["status"]
    return next(c["message"] for c in status["conditions"] if c["type"] == "Ready")


# --- read ---------------------------------------------------------------------------------


def test_the_queue_trigger_reads_as_the_hpa_target_on_the_waiting_gauge() -> None:
    view = scaled_object_view(scaled_object(trigger_metadata={"activationThreshold": "1"}), "vllm")
    state = view.hpa_state()
    assert (state.min_replicas, state.max_replicas) == (2, 40)
    assert state.target_average_value == 5.0
    assert state.metric_name == "vllm:num_requests_waiting"
    assert view.behavior == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    assert view.conditions == {"Ready": "True", "Active": "True", "Fallback": "False"}
    assert view.hpa_name == "keda-hpa-vllm"
    assert view.paused is None
    (trigger,) = view.triggers
    assert trigger.activation_threshold == 1.0
    assert trigger.query == QUERY
    assert any("activationThreshold 1 on vllm:num_requests_waiting" in n for n in notes(view))


def test_keda_defaults_apply_when_the_counts_are_unset() -> None:
    view = scaled_object_view(scaled_object(min_count=None, max_count=None), "vllm")
    assert (view.min_replicas, view.max_replicas) == (0, 100)
    assert any("minReplicaCount 0" in n for n in notes(view))


def test_a_scaled_object_of_another_deployment_is_a_mismatch() -> None:
    with pytest.raises(ScaledObjectError) as raised:
        scaled_object_view(scaled_object(), "other")
    assert raised.value.reason == Problem.TARGET_MISMATCH


@pytest.mark.parametrize(
    ("triggers", "why"),
    [
        ([{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}}], "cpu"),
        (
            [{"type": "prometheus", "metricType": "Value", "metadata": {"query": QUERY}}],
            "none",
        ),
        (
            [{"type": "prometheus", "metadata": {"query": "avg(vllm:num_requests_waiting)"}}],
            "none",
        ),
    ],
    ids=["cpu-scaler", "value-metric-type", "not-a-sum"],
)
def test_a_trigger_that_is_not_a_summed_queue_is_left_alone(
    triggers: list[dict[str, Any]], why: str
) -> None:
    view = scaled_object_view(scaled_object(triggers=triggers), "vllm")
    assert view.queue_trigger is None
    assert view.hpa_state().target_average_value is None
    assert any(f"(other triggers: {why}): only minReplicaCount" in n for n in notes(view))
    ops = scaled_object_ops(view.body, Envelope(2, 11, 3.0), "llm/vllm")
    assert {op["path"] for op in ops if op["path"].startswith("/spec")} == {"/spec/maxReplicaCount"}
    assert not any("triggers" in op["path"] for op in ops)


def test_the_generated_hpa_is_read_for_its_replicas(keda: FakeCluster) -> None:
    keda.put(SCALED_OBJECTS, scaled_object())
    keda.put(HPAS, keda_hpa())
    view = read_scaled_object(keda.api, NAMESPACE, "vllm", "vllm")
    assert (view.hpa_current_replicas, view.hpa_desired_replicas) == (11, 14)
    assert "KEDA's HPA keda-hpa-vllm (read only) runs 11 replicas and wants 14" in notes(view)


def test_a_missing_scaled_object_is_target_not_found(keda: FakeCluster) -> None:
    with pytest.raises(ScaledObjectError) as raised:
        read_scaled_object(keda.api, NAMESPACE, "vllm", "vllm")
    assert raised.value.reason == Problem.TARGET_NOT_FOUND


# --- act and restore ----------------------------------------------------------------------


def test_the_envelope_and_threshold_are_patched_and_the_originals_recorded(
    keda: FakeCluster,
) -> None:
    keda.put(SCALED_OBJECTS, scaled_object(min_count=None))
    before = keda.get(SCALED_OBJECTS, "vllm")
    assert apply_envelope(keda.api, NAMESPACE, TARGET, Envelope(2, 11, 3.5), "llm/vllm")
    after = keda.get(SCALED_OBJECTS, "vllm")
    assert after["spec"]["maxReplicaCount"] == 11
    assert "minReplicaCount" not in after["spec"]  # KEDA's scale-to-zero floor is kept
    assert after["spec"]["triggers"][0]["metadata"]["threshold"] == "3.5"
    assert after["spec"]["advanced"] == before["spec"]["advanced"]
    assert after["spec"]["triggers"][0]["metadata"]["query"] == QUERY
    annotations = after["metadata"]["annotations"]
    assert json.loads(annotations[ORIGINAL_ENVELOPE]) == {
        "minReplicaCount": None,
        "maxReplicaCount": 40,
        "threshold": "5",
        "triggerIndex": 0,
    }
    assert annotations[MANAGED_BY] == "llm/vllm"
    (patch,) = keda.requests("patch")
    assert patch.data[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": before["metadata"]["resourceVersion"],
    }
    assert not apply_envelope(keda.api, NAMESPACE, TARGET, Envelope(2, 11, 3.5), "llm/vllm")


def test_restore_puts_the_originals_back_and_removes_what_was_unset(keda: FakeCluster) -> None:
    keda.put(SCALED_OBJECTS, scaled_object(max_count=None))
    before = keda.get(SCALED_OBJECTS, "vllm")
    apply_envelope(keda.api, NAMESPACE, TARGET, Envelope(3, 11, 2.0), "llm/vllm")
    assert keda.get(SCALED_OBJECTS, "vllm")["spec"]["minReplicaCount"] == 3
    assert restore_envelope(keda.api, NAMESPACE, TARGET)
    after = keda.get(SCALED_OBJECTS, "vllm")
    assert after["spec"] == before["spec"]
    assert not after["metadata"].get("annotations")
    assert not restore_envelope(keda.api, NAMESPACE, TARGET)


def test_a_conflict_is_retried_with_a_fresh_read(keda: FakeCluster) -> None:
    keda.put(SCALED_OBJECTS, scaled_object())
    keda.react(keda.emulator["patch", kmock.resource(SCALED_OBJECTS)][:1], 409)
    apply_envelope(keda.api, NAMESPACE, TARGET, Envelope(2, 12, 5.0), "llm/vllm")
    assert keda.get(SCALED_OBJECTS, "vllm")["spec"]["maxReplicaCount"] == 12
    gets = [r for r in keda.requests("get") if "scaledobjects" in str(r.url)]
    assert len(gets) == 2  # read, conflict, read again


def test_a_tampered_record_is_neither_applied_nor_restored(keda: FakeCluster) -> None:
    record = json.dumps({"minReplicaCount": 2, "maxReplicaCount": 40, "triggerIndex": 3})
    keda.put(SCALED_OBJECTS, scaled_object(annotations={ORIGINAL_ENVELOPE: record}))
    with pytest.raises(TargetError) as raised:
        restore_envelope(keda.api, NAMESPACE, TARGET)
    assert raised.value.reason == Problem.TARGET_MISMATCH
    assert "triggerIndex and threshold go together" in raised.value.message
    assert keda.requests("patch") == []


def test_a_paused_scaled_object_is_not_patched(keda: FakeCluster) -> None:
    paused = {"autoscaling.keda.sh/paused-replicas": "4"}
    keda.put(SCALED_OBJECTS, scaled_object(annotations=paused))
    assert not apply_envelope(keda.api, NAMESPACE, TARGET, Envelope(2, 11, 5.0), "llm/vllm")
    assert keda.requests("patch") == []
    view = scaled_object_view(keda.get(SCALED_OBJECTS, "vllm"), "vllm")
    assert any("paused (autoscaling.keda.sh/paused-replicas=4)" in n for n in notes(view))


# --- the evaluation, end to end on kmock ---------------------------------------------------


def test_a_collapse_holds_max_replica_count_and_never_touches_kedas_hpa(
    keda: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = keda_stack(
        keda, engines, prometheus, clock, extra={"budget": {"gpuSecondsPer1kRequests": 1200}}
    )
    generated = keda.get(HPAS, "keda-hpa-vllm")
    run(operator, keda, clock, SETTLE)
    assert keda.get(SCALED_OBJECTS, "vllm")["spec"]["maxReplicaCount"] == 19  # budget cap
    numbers.hit_rate, numbers.waiting = 0.04, 9.0
    run(operator, keda, clock, 3)
    assert keda.get(SCALED_OBJECTS, "vllm")["spec"]["maxReplicaCount"] == 11  # held
    assert conditions(keda)["CacheHealthy"] == ("False", Diagnosis.PREFIX_COLLAPSE)
    assert conditions(keda)["ScalingHeld"] == ("True", Hold.COLLAPSE)
    assert ("Warning", Diagnosis.PREFIX_COLLAPSE) in events(keda)
    alert = keda.get(POLICIES, "vllm")["status"]["alerts"][0]["message"]
    assert (
        "held at 11 instead of the 20 the HPA wanted" in alert
    )  # ceil(11 pods × 9 waiting / threshold 5)
    assert keda.get(HPAS, "keda-hpa-vllm") == generated
    assert not [r for r in keda.requests("patch") if "horizontalpodautoscalers" in str(r.url)]


def test_ignore_null_values_is_warned_in_an_event_and_the_ready_message(
    keda: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    keda_stack(keda, engines, prometheus, clock, mode="Advise")
    run(operator, keda, clock, 1)
    assert ("Warning", ConditionReason.KEDA_IGNORES_NULL_VALUES) in events(keda)
    message = ready_message(keda)
    assert "ignoreNullValues is unset (KEDA's default: true)" in message
    assert "kedacore/keda#3065" in message
    assert conditions(keda)["Ready"] == ("True", ConditionReason.EVALUATED)


def test_ignore_null_values_false_is_not_warned(
    keda: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    body = scaled_object(trigger_metadata={"ignoreNullValues": "false"})
    keda_stack(keda, engines, prometheus, clock, body, mode="Advise")
    run(operator, keda, clock, 1)
    assert ("Warning", ConditionReason.KEDA_IGNORES_NULL_VALUES) not in events(keda)
    assert "ignoreNullValues" not in ready_message(keda)


def test_kedas_fallback_turns_metrics_available_false(
    keda: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    body = scaled_object(
        trigger_metadata={"ignoreNullValues": "false"},
        conditions=[{"type": "Ready", "status": "True"}, {"type": "Fallback", "status": "True"}],
    )
    body["spec"]["fallback"] = {"failureThreshold": 3, "replicas": 6}
    keda_stack(keda, engines, prometheus, clock, body, mode="Advise")
    run(operator, keda, clock, 1)
    assert conditions(keda)["MetricsAvailable"] == ("False", ConditionReason.KEDA_FALLBACK)
    assert "falls back to 6 replicas after 3 failed reads" in ready_message(keda)


# --- claims ---------------------------------------------------------------------------------


def claiming(name: str, created: str, **target: str) -> dict[str, Any]:
    found = policy(name, prometheus_url="http://prometheus.test:9090")
    found["metadata"]["creationTimestamp"] = created
    found["spec"]["target"] = {"deploymentName": "vllm", **target}
    return found


def test_one_policy_per_scaled_object_and_never_confused_with_an_hpa_of_its_name() -> None:
    first = claiming("first", "2026-11-30T10:00:00Z", scaledObjectName="vllm")
    second = claiming("second", "2026-11-30T11:00:00Z", scaledObjectName="vllm")
    on_hpa = claiming("on-hpa", "2026-11-30T12:00:00Z", hpaName="vllm")
    claims: dict[Any, list[Any]] = {}
    for one in (first, second, on_hpa):
        for key, value in index_entry(one).items():
            claims.setdefault(key, []).append(value)
    assert claim_key(first) == (NAMESPACE, "ScaledObject/vllm") != claim_key(on_hpa)
    assert refusal(first, claims, None) is None
    assert refusal(on_hpa, claims, None) is None
    refused = refusal(second, claims, None)
    assert refused is not None
    assert refused.reason == Problem.TARGET_CLAIMED
    assert refused.message.startswith("ScaledObject vllm is managed by policy llm/first")
    assert "point spec.target.scaledObjectName at another ScaledObject" in refused.message
