"""Acting on a decision: the HPA's (or KEDA ScaledObject's) envelope and the batch ceiling.

Only what the decision changed is written, with JSON patches that name the exact
fields (``/spec/minReplicas``, ``/spec/maxReplicas``, the queue metric's
``averageValue``, one token of the engine container's args), so every other field the
user set stays as it was. Each patch carries a ``test`` of the resourceVersion it was
built from: if someone else changed the object in between, the API server refuses it,
and we re-read and rebuild (a bounded number of times). Before the first change the
HPA's original envelope is recorded in an annotation on the HPA itself; deleting the
policy puts it back, unless the record no longer reads as the one written
(``workload.recorded_envelope``): then nothing is restored. A patch the API server
forbids (HTTP 403: the chart grants ``patch`` per namespace, ``rbac.enforceNamespaces``)
raises ``PatchForbiddenError``, whose words name the object and that chart value.

A KEDA ScaledObject is patched the same way, on its own fields: ``/spec/maxReplicaCount``,
``/spec/minReplicaCount`` and the queue trigger's ``/spec/triggers/N/metadata/threshold``
(``controller/target/keda.py`` says which trigger, and why its threshold is the HPA's target).
The HPA KEDA generates from it is never written: KEDA would overwrite it. A hold lowers
``maxReplicaCount`` rather than setting ``autoscaling.keda.sh/paused-replicas``: pausing
freezes KEDA both ways (no scale-down either, and no SLO guard growth within budget) and
removes its HPA, while a lower ceiling keeps every other KEDA behaviour. A
``minReplicaCount`` of 0 (scale to zero) is KEDA's and is kept, a paused ScaledObject
is not patched at all, and a one-way pause bounds what is (``keda_pauses.one_way_counts``).
Blocking calls: run in a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from cachescale.api.policy import MANAGED_BY, MAX_NUM_SEQS_CHANGED, ORIGINAL_ENVELOPE
from cachescale.api.reasons import Problem
from cachescale.api.spec import AutoscalerKind, Engine, TargetSpec
from cachescale.controller.kube.client import (
    ConflictError,
    KubeApi,
    KubeError,
    NotFoundError,
    resource_version_test,
)
from cachescale.controller.target.engine_flags import rewritten
from cachescale.controller.target.keda import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    ScaledObjectError,
    scaled_object_path,
)
from cachescale.controller.target.keda_pauses import one_way_counts, paused_by
from cachescale.controller.target.keda_record import recorded_counts
from cachescale.controller.target.keda_triggers import queue_trigger
from cachescale.controller.target.workload import (
    TargetError,
    apps_path,
    engine_container,
    hpa_path,
    queue_metric,
    recorded_envelope,
)
from cachescale.decide.envelope import Envelope

CONFLICT_RETRIES = 3
ENFORCE_VALUE = "rbac.enforceNamespaces"
"""The chart value that grants the operator ``patch`` in a namespace."""
FORBIDDEN = 403


class PatchForbiddenError(KubeError):
    """A patch the API server refused with 403: the operator may read the object but not
    change it. Its words name the object and the chart value that grants the patch, never
    the server's message (which names the operator's ServiceAccount and its verbs)."""

    def __init__(self, what: str, namespace: str) -> None:
        super().__init__(FORBIDDEN, f"the operator may not patch {what} in namespace {namespace}")

    def __str__(self) -> str:
        return (
            f"{self.message} (HTTP {FORBIDDEN}): the cluster owner grants it per namespace "
            f"with the chart value {ENFORCE_VALUE}"
        )


def _escape(key: str) -> str:
    """A JSON-pointer token (``/`` and ``~`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def quantity_text(value: float) -> str:
    """A float as a Kubernetes quantity: ``24`` or ``19200m``."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def envelope_ops(
    hpa: Mapping[str, Any], envelope: Envelope, metric_index: int | None, policy: str
) -> list[dict[str, Any]]:
    """JSON-patch ops moving ``hpa`` to ``envelope`` (empty when nothing differs)."""
    spec = hpa.get("spec", {})
    ops: list[dict[str, Any]] = []
    if spec.get("minReplicas", 1) != envelope.min_replicas:
        ops.append({"op": "add", "path": "/spec/minReplicas", "value": envelope.min_replicas})
    if spec.get("maxReplicas") != envelope.max_replicas:
        ops.append({"op": "replace", "path": "/spec/maxReplicas", "value": envelope.max_replicas})
    if metric_index is not None and envelope.target_average_value is not None:
        metric = spec["metrics"][metric_index]
        source = "pods" if metric["type"] == "Pods" else "external"
        wanted = quantity_text(envelope.target_average_value)
        if str(metric[source]["target"].get("averageValue")) != wanted:
            path = f"/spec/metrics/{metric_index}/{source}/target/averageValue"
            ops.append({"op": "replace", "path": path, "value": wanted})
    if not ops:
        return []
    annotations = hpa.get("metadata", {}).get("annotations")
    if annotations is None:
        ops.insert(0, {"op": "add", "path": "/metadata/annotations", "value": {}})
        annotations = {}
    if ORIGINAL_ENVELOPE not in annotations:
        original = _original(hpa, metric_index)
        ops.append(_annotation_op(ORIGINAL_ENVELOPE, json.dumps(original, sort_keys=True)))
        ops.append(_annotation_op(MANAGED_BY, policy))
    return [resource_version_test(hpa), *ops]


def _annotation_op(key: str, value: str) -> dict[str, Any]:
    return {"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value}


def _original(hpa: Mapping[str, Any], metric_index: int | None) -> dict[str, Any]:
    spec = hpa.get("spec", {})
    original: dict[str, Any] = {
        "minReplicas": spec.get("minReplicas", 1),
        "maxReplicas": spec.get("maxReplicas"),
    }
    if metric_index is not None:
        metric = spec["metrics"][metric_index]
        source = "pods" if metric["type"] == "Pods" else "external"
        original["metricIndex"] = metric_index
        original["averageValue"] = str(metric[source]["target"].get("averageValue"))
    return original


def restore_ops(hpa: Mapping[str, Any], target: TargetSpec) -> list[dict[str, Any]]:
    """JSON-patch ops putting back the recorded original envelope (empty: none recorded);
    ``TargetError`` when the record is not one the operator wrote for this HPA."""
    annotations = hpa.get("metadata", {}).get("annotations", {})
    original = recorded_envelope(hpa, target)
    if original is None:
        return []
    ops: list[dict[str, Any]] = [
        resource_version_test(hpa),
        {"op": "add", "path": "/spec/minReplicas", "value": original["minReplicas"]},
        {"op": "replace", "path": "/spec/maxReplicas", "value": original["maxReplicas"]},
    ]
    index = original.get("metricIndex")
    metrics = hpa.get("spec", {}).get("metrics", [])
    if index is not None:  # checked: the HPA's queue metric
        source = "pods" if metrics[index]["type"] == "Pods" else "external"
        path = f"/spec/metrics/{index}/{source}/target/averageValue"
        ops.append({"op": "replace", "path": path, "value": original["averageValue"]})
    for key in (ORIGINAL_ENVELOPE, MANAGED_BY):
        if key in annotations:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(key)}"})
    return ops


def threshold_text(value: float) -> str:
    """A trigger threshold as KEDA reads it (a decimal string, at most 3 decimals)."""
    return f"{round(value, 3):g}"


def scaled_object_ops(
    body: Mapping[str, Any], envelope: Envelope, policy: str
) -> list[dict[str, Any]]:
    """JSON-patch ops moving a ScaledObject to ``envelope`` (empty when nothing differs,
    or when it is paused)."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    annotations = meta.get("annotations")
    if paused_by(annotations or {}) is not None:
        return []
    ops: list[dict[str, Any]] = []
    low = spec.get("minReplicaCount", DEFAULT_MIN_REPLICAS)
    high = spec.get("maxReplicaCount", DEFAULT_MAX_REPLICAS)
    wanted_low, wanted_high = one_way_counts(
        annotations or {}, (low, high), (envelope.min_replicas, envelope.max_replicas)
    )
    if low != 0 and low != wanted_low:
        ops.append({"op": "add", "path": "/spec/minReplicaCount", "value": wanted_low})
    if high != wanted_high:
        ops.append({"op": "add", "path": "/spec/maxReplicaCount", "value": wanted_high})
    queue = queue_trigger(spec)
    if queue is not None and envelope.target_average_value is not None:
        wanted = threshold_text(envelope.target_average_value)
        if queue.threshold != float(wanted):
            path = f"/spec/triggers/{queue.index}/metadata/threshold"
            ops.append({"op": "replace", "path": path, "value": wanted})
    if not ops:
        return []
    if annotations is None:
        ops.insert(0, {"op": "add", "path": "/metadata/annotations", "value": {}})
        annotations = {}
    if ORIGINAL_ENVELOPE not in annotations:
        original: dict[str, Any] = {
            "minReplicaCount": spec.get("minReplicaCount"),
            "maxReplicaCount": spec.get("maxReplicaCount"),
        }
        if queue is not None:
            original["triggerIndex"] = queue.index
            original["threshold"] = str(spec["triggers"][queue.index]["metadata"]["threshold"])
        ops.append(_annotation_op(ORIGINAL_ENVELOPE, json.dumps(original, sort_keys=True)))
        ops.append(_annotation_op(MANAGED_BY, policy))
    return [resource_version_test(body), *ops]


def scaled_object_restore_ops(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON-patch ops putting back a ScaledObject's recorded original values (a field that
    was unset is removed again); empty when none was recorded; ``TargetError`` when the
    record is not one the operator wrote for this object."""
    try:
        original = recorded_counts(body)
    except ScaledObjectError as error:
        raise TargetError(error.reason, error.message) from None
    if original is None:
        return []
    spec = body.get("spec") or {}
    ops: list[dict[str, Any]] = [resource_version_test(body)]
    for key in ("minReplicaCount", "maxReplicaCount"):
        if original[key] is not None:
            ops.append({"op": "add", "path": f"/spec/{key}", "value": original[key]})
        elif key in spec:
            ops.append({"op": "remove", "path": f"/spec/{key}"})
    if "triggerIndex" in original:  # checked: a Prometheus trigger of this object
        path = f"/spec/triggers/{original['triggerIndex']}/metadata/threshold"
        ops.append({"op": "add", "path": path, "value": original["threshold"]})
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    for key in (ORIGINAL_ENVELOPE, MANAGED_BY):
        if key in annotations:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(key)}"})
    return ops


def _with_retries(
    read: Callable[[], Mapping[str, Any]],
    build: Callable[[Mapping[str, Any]], list[dict[str, Any]]],
    path: str,
    api: KubeApi,
    what: tuple[str, str],
) -> bool:
    """Read, build a patch, apply it; on a conflict read again. True if something changed.
    ``what`` (``HorizontalPodAutoscaler vllm``, its namespace) names the object in a
    ``PatchForbiddenError``."""
    for attempt in range(CONFLICT_RETRIES):
        ops = build(read())
        if not ops:
            return False
        try:
            api.patch(path, ops)
            return True
        except ConflictError:
            if attempt == CONFLICT_RETRIES - 1:
                raise
        except KubeError as error:
            if error.status == FORBIDDEN:
                raise PatchForbiddenError(*what) from error
            raise
    return False  # pragma: no cover


def apply_envelope(
    api: KubeApi,
    namespace: str,
    target: TargetSpec,
    envelope: Envelope,
    policy: str,
    seen: Mapping[str, Any] | None = None,
) -> bool:
    """Patch the HPA or ScaledObject to ``envelope``; True when it changed. ``seen``, the
    copy the evaluation read (from the watch-fed index, which keeps the spec but not every
    annotation), saves the read when it already has the envelope: steady state reads
    nothing. Otherwise the object is read whole and the patch built on that."""
    build: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    if target.autoscaler_kind is AutoscalerKind.SCALED_OBJECT:
        path = scaled_object_path(namespace, target.autoscaler_name)

        def build(body: Mapping[str, Any]) -> list[dict[str, Any]]:
            return scaled_object_ops(body, envelope, policy)

    else:
        path = hpa_path(namespace, target.autoscaler_name)

        def build(hpa: Mapping[str, Any]) -> list[dict[str, Any]]:
            return envelope_ops(hpa, envelope, queue_metric(hpa)[0], policy)

    if seen is not None and not build(seen):
        return False
    return _with_retries(lambda: api.get(path), build, path, api, (target.autoscaler, namespace))


def apply_max_num_seqs(
    api: KubeApi, namespace: str, target: TargetSpec, value: int, now: datetime
) -> bool:
    """Set the engine container's batch-ceiling flag to ``value`` (rolls the pods)."""
    path = apps_path(namespace, target.deployment_name)

    def build(deployment: Mapping[str, Any]) -> list[dict[str, Any]]:
        index, container, flag = engine_container(deployment, target)
        if flag is None:
            raise TargetError(
                Problem.TARGET_MISMATCH, f"no {target.engine} batch-ceiling flag to change"
            )
        if flag.value == value:
            return []
        tokens = rewritten(container[flag.field], flag, Engine(target.engine), value)
        field = f"/spec/template/spec/containers/{index}/{flag.field}"
        ops = [resource_version_test(deployment), {"op": "replace", "path": field, "value": tokens}]
        if deployment.get("metadata", {}).get("annotations") is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        ops.append(_annotation_op(MAX_NUM_SEQS_CHANGED, now.isoformat()))
        return ops

    what = (f"Deployment {target.deployment_name}", namespace)
    return _with_retries(lambda: api.get(path), build, path, api, what)


def restore_envelope(api: KubeApi, namespace: str, target: TargetSpec) -> bool:
    """Put the HPA's (or ScaledObject's) recorded original envelope back; False when none
    was recorded or the object is gone; ``TargetError`` (nothing written) when the record
    was tampered with."""
    build: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    if target.autoscaler_kind is AutoscalerKind.SCALED_OBJECT:
        path = scaled_object_path(namespace, target.autoscaler_name)
        build = scaled_object_restore_ops
    else:
        path = hpa_path(namespace, target.autoscaler_name)

        def build(hpa: Mapping[str, Any]) -> list[dict[str, Any]]:
            return restore_ops(hpa, target)

    try:
        return _with_retries(
            lambda: api.get(path), build, path, api, (target.autoscaler, namespace)
        )
    except NotFoundError:
        return False
