"""Reading the serving workload: the Deployment, its pods and its HPA or ScaledObject.

Turns three API reads into the ``WorkloadState`` the decision needs (replicas, ready
pods and their ages, GPUs per pod, the batch ceiling in the engine's args, the HPA's
envelope and queue metric, whether a rollout is in progress), or into a named problem
a human can fix: the Deployment or HPA missing (``TargetNotFound``), an HPA that scales
something else (``TargetMismatch``), an HPA owned by a KEDA ScaledObject that would
overwrite every patch (``HPAManagedByKEDA``: name the ScaledObject instead, read as an
HPA by ``controller/target/keda.py``), a container or flag that is not there, or
an original-envelope record on the HPA that the operator did not write as it stands
(edited by hand, truncated, or naming another metric: ``TargetMismatch``, and nothing is
changed or restored from it). Blocking calls: run in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.utils.quantity import parse_quantity as _parse_quantity

from cachescale.api.policy import MAX_NUM_SEQS_CHANGED, ORIGINAL_ENVELOPE
from cachescale.api.reasons import Problem
from cachescale.api.spec import AutoscalerKind, Engine, TargetSpec
from cachescale.controller.kube.client import NotFoundError, Reads
from cachescale.controller.target.engine_flags import FlagError, FlagLocation, find_flag
from cachescale.controller.target.keda import (
    ScaledObjectError,
    ScaledObjectView,
    read_scaled_object,
)
from cachescale.controller.target.keda_record import recorded_counts
from cachescale.snapshot import HPAState, WorkloadState

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
"""Extended resources counted as GPUs."""
QUEUE_METRICS = (
    "num_requests_waiting",
    "num_requests_running",
    "num_queue_reqs",
    "num_running_reqs",
)
"""Engine gauges an HPA target may be reshaped on (vLLM and SGLang names, any prefix)."""


class TargetError(Exception):
    """The policy's target cannot be managed; ``reason`` says why (``Ready=False``)."""

    def __init__(self, reason: Problem, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Target:
    """The objects read for one evaluation, and what was derived from them."""

    deployment: dict[str, Any]
    autoscaler: dict[str, Any]
    """The HPA or the ScaledObject, as read."""
    state: WorkloadState
    pod_ages: dict[str, float]
    """Ready pod name → seconds since it became ready."""
    container_index: int
    flag: FlagLocation | None
    metric_index: int | None
    """Index in ``hpa.spec.metrics`` of the queue metric whose target is reshaped."""
    max_num_seqs_changed_at: datetime | None
    keda: ScaledObjectView | None = None
    """The ScaledObject's reading, when the target names one."""

    @property
    def pods_holding_gpus(self) -> int:
        """The Deployment's ``status.replicas``: every pod it has not begun to remove,
        starting ones included, each taken to hold the GPUs it requests (what cost counts;
        a pod still pending counts too, a terminating one does not)."""
        return int(self.deployment.get("status", {}).get("replicas", 0) or 0)


def apps_path(namespace: str, name: str) -> str:
    """API path of a Deployment."""
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"


def hpa_path(namespace: str, name: str) -> str:
    """API path of an autoscaling/v2 HorizontalPodAutoscaler."""
    return f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{name}"


def read_target(
    api: Reads, namespace: str, target: TargetSpec, now: datetime, *, keda_allowed: bool = False
) -> Target:
    """Read and check the Deployment, its HPA or ScaledObject and its pods (an HPA that KEDA
    generates is refused unless ``keda_allowed``: read-only callers may look at it). The
    operator reads from its watch-fed indexes (``controller/kube/indexes.py``), tools from the
    API server."""
    deployment = _get(api, apps_path(namespace, target.deployment_name), "Deployment", target)
    keda = None
    if target.autoscaler_kind is AutoscalerKind.SCALED_OBJECT:
        try:
            keda = read_scaled_object(
                api, namespace, target.autoscaler_name, target.deployment_name
            )
            recorded_counts(keda.body)
        except ScaledObjectError as error:
            raise TargetError(error.reason, error.message) from None
        autoscaler = keda.body
        metric_index = None
        hpa_state = keda.hpa_state()
    else:
        autoscaler = _get(
            api, hpa_path(namespace, target.autoscaler_name), "HorizontalPodAutoscaler", target
        )
        _check_hpa(autoscaler, target, keda_allowed)
        recorded_envelope(autoscaler, target)
        metric_index, metric_name, metric_target = queue_metric(autoscaler)
        hpa_spec = autoscaler.get("spec", {})
        hpa_state = HPAState(
            min_replicas=int(hpa_spec.get("minReplicas", 1)),
            max_replicas=int(hpa_spec["maxReplicas"]),
            target_average_value=metric_target,
            metric_name=metric_name,
        )
    index, container, flag = engine_container(deployment, target)
    pods = api.items(f"/api/v1/namespaces/{namespace}/pods", _selector(deployment))
    ages = _ready_ages(pods, now)
    state = WorkloadState(
        replicas=int(deployment.get("spec", {}).get("replicas", 1)),
        ready_replicas=int(deployment.get("status", {}).get("readyReplicas", 0) or 0),
        pod_ages_seconds=tuple(ages.values()),
        gpus_per_pod=_gpus(container),
        hpa=hpa_state,
        max_num_seqs=flag.value if flag is not None else None,
        generation=int(deployment.get("metadata", {}).get("generation", 0)),
        rollout_in_progress=_rolling(deployment),
    )
    changed = deployment.get("metadata", {}).get("annotations", {}).get(MAX_NUM_SEQS_CHANGED)
    return Target(
        deployment=deployment,
        autoscaler=autoscaler,
        state=state,
        pod_ages=ages,
        container_index=index,
        flag=flag,
        metric_index=metric_index,
        max_num_seqs_changed_at=_timestamp(changed),
        keda=keda,
    )


def engine_container(
    deployment: Mapping[str, Any], target: TargetSpec
) -> tuple[int, dict[str, Any], FlagLocation | None]:
    """The engine container's index, spec and batch-ceiling flag."""
    template = deployment.get("spec", {}).get("template", {})
    containers = template.get("spec", {}).get("containers", [])
    index = next(
        (i for i, c in enumerate(containers) if c.get("name") == target.container_name), None
    )
    if index is None:
        names = ", ".join(c.get("name", "?") for c in containers)
        raise TargetError(
            Problem.TARGET_MISMATCH,
            f"Deployment {target.deployment_name} has no container {target.container_name!r} "
            f"(it has: {names}); set spec.target.containerName",
        )
    container = containers[index]
    return index, container, _flag(container, target.engine)


def _get(api: Reads, path: str, kind: str, target: TargetSpec) -> dict[str, Any]:
    try:
        return api.get(path)
    except NotFoundError:
        name = target.deployment_name if kind == "Deployment" else target.autoscaler_name
        raise TargetError(
            Problem.TARGET_NOT_FOUND, f"{kind} {name} not found in the policy's namespace"
        ) from None


def _check_hpa(hpa: Mapping[str, Any], target: TargetSpec, keda_allowed: bool) -> None:
    for owner in [] if keda_allowed else hpa.get("metadata", {}).get("ownerReferences", []):
        if owner.get("kind") == "ScaledObject" or str(owner.get("apiVersion", "")).startswith(
            "keda.sh"
        ):
            raise TargetError(
                Problem.HPA_MANAGED_BY_KEDA,
                f"HorizontalPodAutoscaler {target.autoscaler_name} is owned by KEDA ScaledObject "
                f"{owner.get('name')}, which would overwrite every change; point the policy at "
                "an HPA you own, or let cachescale advise only",
            )
    ref = hpa.get("spec", {}).get("scaleTargetRef", {})
    if ref.get("kind") != "Deployment" or ref.get("name") != target.deployment_name:
        raise TargetError(
            Problem.TARGET_MISMATCH,
            f"HorizontalPodAutoscaler {target.autoscaler_name} scales {ref.get('kind')} "
            f"{ref.get('name')}, not Deployment {target.deployment_name}",
        )


ENVELOPE_KEYS = frozenset({"minReplicas", "maxReplicas", "metricIndex", "averageValue"})
"""What ``actions.envelope_ops`` records; anything else was not written by the operator."""


def recorded_envelope(hpa: Mapping[str, Any], target: TargetSpec) -> dict[str, Any] | None:
    """The HPA's original envelope as recorded before the first change (None: none).

    A record the operator could not have written for this HPA — not JSON, keys missing or
    unknown, replicas that are not whole numbers from 1 with min ≤ max, a metric index
    that is not this HPA's queue metric, a target that is not a quantity — is refused
    with ``TargetMismatch``: restoring it would write values nobody chose, so the HPA is
    left alone until the annotation is fixed or removed.
    """
    text = hpa.get("metadata", {}).get("annotations", {}).get(ORIGINAL_ENVELOPE)
    if text is None:
        return None
    try:
        problem = _envelope_problem(json.loads(text), hpa)
    except ValueError:
        problem = "it is not JSON"
    if problem:
        raise TargetError(
            Problem.TARGET_MISMATCH,
            f"{target.autoscaler}: annotation {ORIGINAL_ENVELOPE} is not "
            f"the record cachescale wrote ({problem}), so nothing is changed or restored from "
            "it; put back the original values, or remove the annotation (the current envelope "
            "is then recorded as the original)",
        )
    return dict(json.loads(text))


def _envelope_problem(recorded: object, hpa: Mapping[str, Any]) -> str:
    """What is wrong with a decoded original-envelope record ("" when nothing)."""
    if not isinstance(recorded, dict):
        return "it is not a JSON object"
    if not {"minReplicas", "maxReplicas"} <= recorded.keys() <= ENVELOPE_KEYS:
        return f"it has keys {sorted(recorded)}, expected minReplicas, maxReplicas"
    low, high = recorded["minReplicas"], recorded["maxReplicas"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (low, high)):
        return "minReplicas and maxReplicas must be whole numbers from 1"
    if low > high:
        return f"minReplicas {low} is above maxReplicas {high}"
    if ("metricIndex" in recorded) != ("averageValue" in recorded):
        return "metricIndex and averageValue go together"
    if "metricIndex" in recorded:
        if recorded["metricIndex"] != queue_metric(hpa)[0]:
            return f"metricIndex {recorded['metricIndex']!r} is not the HPA's queue metric"
        try:
            quantity(recorded["averageValue"])
        except ValueError:
            return f"averageValue {recorded['averageValue']!r} is not a quantity"
    return ""


def _flag(container: Mapping[str, Any], engine: Engine) -> FlagLocation | None:
    try:
        return find_flag(engine, container.get("command"), container.get("args"))
    except FlagError as error:
        raise TargetError(
            Problem.TARGET_MISMATCH, f"container {container.get('name')}: {error}"
        ) from None


def _selector(deployment: Mapping[str, Any]) -> str:
    """The Deployment's matchLabels (and simple matchExpressions) as a label selector."""
    selector = deployment.get("spec", {}).get("selector", {})
    parts = [f"{key}={value}" for key, value in selector.get("matchLabels", {}).items()]
    for expression in selector.get("matchExpressions", []):
        key, operator, values = (
            expression["key"],
            expression["operator"],
            expression.get("values", []),
        )
        if operator in ("In", "NotIn"):
            parts.append(f"{key} {operator.lower()} ({','.join(values)})")
        else:
            parts.append(key if operator == "Exists" else f"!{key}")
    return ",".join(parts)


def _ready_ages(pods: list[dict[str, Any]], now: datetime) -> dict[str, float]:
    ages = {}
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                since = _timestamp(condition.get("lastTransitionTime"))
                if since is not None:
                    ages[pod["metadata"]["name"]] = max(0.0, (now - since).total_seconds())
    return ages


def _gpus(container: Mapping[str, Any]) -> float:
    """GPUs the engine container requests (limits when requests are unset); 0 = unknown."""
    resources = container.get("resources", {})
    for section in ("requests", "limits"):
        for name in GPU_RESOURCES:
            value = resources.get(section, {}).get(name)
            if value is not None:
                return quantity(value)
    return 0.0


def queue_metric(hpa: Mapping[str, Any]) -> tuple[int | None, str | None, float | None]:
    """The first per-pod engine gauge with an AverageValue target: (index, name, value)."""
    for index, metric in enumerate(hpa.get("spec", {}).get("metrics", [])):
        kind = metric.get("type")
        source = metric.get(
            "pods" if kind == "Pods" else "external" if kind == "External" else "", {}
        )
        name = source.get("metric", {}).get("name", "")
        target = source.get("target", {})
        if target.get("type") == "AverageValue" and any(name.endswith(m) for m in QUEUE_METRICS):
            return index, name, quantity(target["averageValue"])
    return None, None, None


def quantity(text: object) -> float:
    """A Kubernetes quantity (``24``, ``19200m``, ``1Gi``) as a float."""
    return float(_parse_quantity(str(text)))  # type: ignore[no-untyped-call]


def _rolling(deployment: Mapping[str, Any]) -> bool:
    meta, spec, status = (deployment.get(k, {}) for k in ("metadata", "spec", "status"))
    replicas = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas", 0) or 0)
    return (
        int(status.get("observedGeneration", 0) or 0) < int(meta.get("generation", 0) or 0)
        or updated < replicas
        or int(status.get("replicas", 0) or 0) > updated
    )


def _timestamp(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
