"""Reading a KEDA ScaledObject as the autoscaler the decision engine knows.

Many vLLM fleets are scaled by a KEDA ``ScaledObject`` (keda.sh/v1alpha1) with the
Prometheus scaler rather than by an HPA of their own. KEDA generates an HPA from it
(``status.hpaName``, ``keda-hpa-<name>``) and overwrites any change made to that HPA, so
cachescale reads and patches the ScaledObject and only ever reads the generated HPA.

The mapping onto the decision engine's ``HPAState`` (so ``decide`` reads a ScaledObject
exactly as it reads an HPA):

- ``minReplicaCount`` / ``maxReplicaCount`` (KEDA's defaults 0 and 100) are the envelope;
- the *queue trigger* is the first Prometheus trigger whose query sums an engine queue
  gauge (``sum(vllm:num_requests_waiting{...})``, production-stack's) with the default
  ``metricType: AverageValue``. KEDA hands the HPA the query's value with ``threshold`` as
  an AverageValue target, so the HPA wants ceil(sum / threshold) = ceil(ready pods ×
  per-pod average / threshold): the threshold is the per-pod target average value, and
  "the HPA wanted N" has the same meaning as for a plain HPA on that gauge.

What is not such a trigger is left alone and said in ``notes``: a ScaledObject without a
Prometheus trigger (cpu, kafka...) keeps its triggers and only its envelope is managed.
KEDA's own traps are surfaced in ``warnings``: a Prometheus trigger with
``ignoreNullValues`` true (KEDA's default when unset) reads a missing series as 0 and
scales to the minimum during a peak (kedacore/keda#3065). KEDA's ``Fallback`` condition
means its scaler cannot read metrics: ``fallback_active``. A paused ScaledObject
(``autoscaling.keda.sh/paused``, ``autoscaling.keda.sh/paused-replicas``) is not
scaling at all: it is read, never patched. Blocking calls: run in a worker thread. The
record of the values before the first change, and its check, are ``keda_record.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from cachescale.api.reasons import Problem
from cachescale.controller.kube.client import KubeError, NotFoundError, Reads
from cachescale.snapshot import HPAState

GROUP_VERSION: Final = "keda.sh/v1alpha1"
PAUSED: Final = "autoscaling.keda.sh/paused"
PAUSED_REPLICAS: Final = "autoscaling.keda.sh/paused-replicas"
DEFAULT_MIN_REPLICAS: Final = 0
"""KEDA's ``minReplicaCount`` when unset."""
DEFAULT_MAX_REPLICAS: Final = 100
"""KEDA's ``maxReplicaCount`` when unset."""
QUEUE_GAUGES: Final = (
    "num_requests_waiting",
    "num_requests_running",
    "num_queue_reqs",
    "num_running_reqs",
)
"""Engine gauges a queue trigger may count (vLLM and SGLang names, any prefix)."""
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEDA_3065: Final = "kedacore/keda#3065"


class ScaledObjectError(Exception):
    """The ScaledObject cannot be managed; ``reason`` is the ``Ready=False`` reason."""

    def __init__(self, reason: Problem, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def scaled_object_path(namespace: str, name: str) -> str:
    """API path of a KEDA ScaledObject."""
    return f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/{name}"


@dataclass(frozen=True)
class PrometheusTrigger:
    """One ``type: prometheus`` trigger as KEDA reads it."""

    index: int
    """Its index in ``spec.triggers`` (the JSON-patch path)."""
    query: str
    threshold: float | None
    """``metadata.threshold``; None when absent or not a number."""
    activation_threshold: float | None
    metric_type: str
    """``metricType``: AverageValue (KEDA's default), Value or Utilization."""
    ignore_null_values: bool
    """``metadata.ignoreNullValues``; KEDA's default is true."""
    ignore_null_values_set: bool
    queue_gauge: str | None
    """The engine queue gauge the query reads, e.g. ``vllm:num_requests_waiting``."""

    @property
    def sums_a_queue(self) -> bool:
        """Whether the threshold is a per-pod target on an engine queue gauge."""
        return (
            self.queue_gauge is not None
            and self.metric_type == "AverageValue"
            and self.threshold is not None
            and self.threshold > 0
            and self.query.lstrip().startswith("sum")
        )


@dataclass(frozen=True)
class ScaledObjectView:
    """What one read of a ScaledObject (and the HPA KEDA generated from it) established."""

    name: str
    body: dict[str, Any]
    min_replicas: int
    max_replicas: int
    triggers: tuple[PrometheusTrigger, ...]
    """Its Prometheus triggers."""
    other_scalers: tuple[str, ...]
    """The types of its other triggers (cpu, kafka...)."""
    behavior: dict[str, Any]
    """``advanced.horizontalPodAutoscalerConfig.behavior`` (KEDA copies it to its HPA)."""
    fallback: dict[str, Any] | None
    paused: str | None
    """Why KEDA is not scaling it (a paused annotation), None when it is."""
    conditions: dict[str, str]
    """KEDA's status conditions: type (Ready, Active, Fallback...) → status."""
    hpa_name: str
    """The HPA KEDA generated (``status.hpaName``, else ``keda-hpa-<name>``): read only."""
    hpa_current_replicas: int | None = None
    """The generated HPA's ``status.currentReplicas`` (None: not read)."""
    hpa_desired_replicas: int | None = None
    """...and ``status.desiredReplicas``: what KEDA's HPA wants now."""

    @property
    def queue_trigger(self) -> PrometheusTrigger | None:
        """The trigger whose threshold is managed as the HPA target (None: none is)."""
        return next((t for t in self.triggers if t.sums_a_queue), None)

    @property
    def fallback_active(self) -> bool:
        """KEDA's scaler failed to read its metrics and applies ``spec.fallback``."""
        return self.conditions.get("Fallback") == "True"

    def hpa_state(self) -> HPAState:
        """The ScaledObject as the HPA the decision engine reads."""
        queue = self.queue_trigger
        return HPAState(
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            target_average_value=queue.threshold if queue is not None else None,
            metric_name=queue.queue_gauge if queue is not None else None,
        )

    def warnings(self) -> tuple[str, ...]:
        """KEDA settings that defeat the incident's protection, one sentence each."""
        found = []
        for trigger in self.triggers:
            if trigger.ignore_null_values:
                how = "true" if trigger.ignore_null_values_set else "unset (KEDA's default: true)"
                found.append(
                    f"ScaledObject {self.name} trigger {trigger.index}: ignoreNullValues is "
                    f"{how}, so a query that returns no series (Prometheus restarting, a "
                    "relabel, the engines' series gone) reads as 0 and KEDA scales to "
                    f"minReplicaCount during the peak ({KEDA_3065}); set ignoreNullValues: "
                    '"false" so it is an error and spec.fallback applies'
                )
        return tuple(found)


def read_scaled_object(api: Reads, namespace: str, name: str, deployment: str) -> ScaledObjectView:
    """Read and check the ScaledObject ``name`` and its generated HPA's replicas."""
    try:
        body = api.get(scaled_object_path(namespace, name))
    except NotFoundError:
        raise ScaledObjectError(
            Problem.TARGET_NOT_FOUND,
            f"ScaledObject {name} not found in the policy's namespace (or KEDA's CRD is not "
            "installed)",
        ) from None
    except KubeError as error:
        if error.status == 403:
            raise ScaledObjectError(
                Problem.API_ERROR,
                f"ScaledObject {name}: the operator may not read ScaledObjects; install the "
                "chart with keda.enabled=true",
            ) from None
        raise
    view = scaled_object_view(body, deployment)
    try:
        hpa = api.get(
            f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{view.hpa_name}"
        )
    except KubeError:  # not generated yet, or not readable: only the note is lost
        return view
    status = hpa.get("status", {})
    return replace(
        view,
        hpa_current_replicas=_int_or_none(status.get("currentReplicas")),
        hpa_desired_replicas=_int_or_none(status.get("desiredReplicas")),
    )


def scaled_object_view(body: Mapping[str, Any], deployment: str) -> ScaledObjectView:
    """The view of a ScaledObject read from the API (``ScaledObjectError`` when it does
    not scale ``deployment`` or its replica counts are not whole numbers)."""
    meta, spec, status = (body.get(key) or {} for key in ("metadata", "spec", "status"))
    name = str(meta.get("name", ""))
    ref = spec.get("scaleTargetRef") or {}
    kind = ref.get("kind", "Deployment")
    if kind != "Deployment" or ref.get("name") != deployment:
        raise ScaledObjectError(
            Problem.TARGET_MISMATCH,
            f"ScaledObject {name} scales {kind} {ref.get('name')}, not Deployment {deployment}",
        )
    low = spec.get("minReplicaCount", DEFAULT_MIN_REPLICAS)
    high = spec.get("maxReplicaCount", DEFAULT_MAX_REPLICAS)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) or low > high:
        raise ScaledObjectError(
            Problem.TARGET_MISMATCH,
            f"ScaledObject {name}: minReplicaCount {low!r} and maxReplicaCount {high!r} are not "
            "whole numbers with min ≤ max",
        )
    triggers = prometheus_triggers(spec)
    others = [
        str(t.get("type")) for t in spec.get("triggers") or [] if t.get("type") != "prometheus"
    ]
    annotations = meta.get("annotations") or {}
    advanced = spec.get("advanced") or {}
    return ScaledObjectView(
        name=name,
        body=dict(body),
        min_replicas=low,
        max_replicas=high,
        triggers=tuple(triggers),
        other_scalers=tuple(others),
        behavior=dict((advanced.get("horizontalPodAutoscalerConfig") or {}).get("behavior") or {}),
        fallback=dict(spec["fallback"]) if spec.get("fallback") else None,
        paused=paused_by(annotations),
        conditions={
            str(c.get("type")): str(c.get("status")) for c in status.get("conditions") or []
        },
        hpa_name=str(status.get("hpaName") or f"keda-hpa-{name}"),
    )


def prometheus_triggers(spec: Mapping[str, Any]) -> list[PrometheusTrigger]:
    """The Prometheus triggers of a ScaledObject's ``spec``."""
    return [
        _prometheus_trigger(index, trigger)
        for index, trigger in enumerate(spec.get("triggers") or [])
        if trigger.get("type") == "prometheus"
    ]


def queue_trigger(spec: Mapping[str, Any]) -> PrometheusTrigger | None:
    """The trigger whose threshold is managed as the HPA target (None: none is)."""
    return next((t for t in prometheus_triggers(spec) if t.sums_a_queue), None)


def paused_by(annotations: Mapping[str, Any]) -> str | None:
    """The paused annotation that stops KEDA scaling (None: not paused)."""
    if PAUSED_REPLICAS in annotations:
        return f"{PAUSED_REPLICAS}={annotations[PAUSED_REPLICAS]}"
    if str(annotations.get(PAUSED, "")).lower() == "true":
        return f"{PAUSED}=true"
    return None


def _prometheus_trigger(index: int, trigger: Mapping[str, Any]) -> PrometheusTrigger:
    metadata = trigger.get("metadata") or {}
    query = str(metadata.get("query", ""))
    ignore = metadata.get("ignoreNullValues")
    gauge = next(
        (
            token
            for token in _METRIC_NAME.findall(query)
            if any(token.endswith(g) for g in QUEUE_GAUGES)
        ),
        None,
    )
    return PrometheusTrigger(
        index=index,
        query=query,
        threshold=number_or_none(metadata.get("threshold")),
        activation_threshold=number_or_none(metadata.get("activationThreshold")),
        metric_type=str(trigger.get("metricType") or "AverageValue"),
        ignore_null_values=ignore is None or str(ignore).strip().lower() != "false",
        ignore_null_values_set=ignore is not None,
        queue_gauge=gauge,
    )


def notes(view: ScaledObjectView) -> tuple[str, ...]:
    """What a reader of the status must know about how the ScaledObject is managed."""
    notes = []
    if view.hpa_desired_replicas is not None:
        notes.append(
            f"KEDA's HPA {view.hpa_name} (read only) runs {view.hpa_current_replicas} replicas "
            f"and wants {view.hpa_desired_replicas}"
        )
    stabilization = (view.behavior.get("scaleDown") or {}).get("stabilizationWindowSeconds")
    if stabilization is not None:
        notes.append(
            f"KEDA's HPA keeps the highest recommendation of the last {stabilization}s "
            "before scaling down (advanced.horizontalPodAutoscalerConfig.behavior)"
        )
    if view.paused is not None:
        notes.append(
            f"ScaledObject {view.name} is paused ({view.paused}): KEDA is not scaling, so "
            "cachescale changes nothing on it until the annotation is removed"
        )
    queue = view.queue_trigger
    if queue is None:
        kinds = ", ".join(view.other_scalers) or "none"
        notes.append(
            f"ScaledObject {view.name} has no Prometheus trigger summing an engine queue "
            f"gauge with metricType AverageValue (other triggers: {kinds}): only "
            "minReplicaCount and maxReplicaCount are managed, its triggers are left alone"
        )
    elif queue.activation_threshold is not None:
        notes.append(
            f"ScaledObject {view.name} trigger {queue.index}: activationThreshold "
            f"{queue.activation_threshold:g} on {queue.queue_gauge} is KEDA's and is kept"
        )
    if view.fallback is not None:
        notes.append(
            f"ScaledObject {view.name} falls back to {view.fallback.get('replicas')} replicas "
            f"after {view.fallback.get('failureThreshold')} failed reads (spec.fallback)"
        )
    if view.min_replicas == 0:
        notes.append(
            f"ScaledObject {view.name} scales to zero (minReplicaCount 0): that floor is "
            "KEDA's and is never raised"
        )
    return tuple(notes)


def number_or_none(value: object) -> float | None:
    """``value`` as a finite number (None: not one)."""
    try:
        number = float(str(value))
    except ValueError:
        return None
    return (
        number if value is not None and number == number and abs(number) != float("inf") else None
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
