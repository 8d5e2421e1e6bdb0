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
means its scaler cannot read metrics: ``fallback_active``; ``fallback.behavior`` says
which replica count it then asks for (``fallback_replicas``).

``advanced.scalingModifiers`` (a ``formula`` over named triggers against its own
``target``) replaces every trigger's metric in KEDA's HPA by one composite metric: no
trigger's threshold is then what scales, so there is no queue trigger, and only
``minReplicaCount`` / ``maxReplicaCount`` are managed. ``initialCooldownPeriod`` and
``cooldownPeriod`` only delay KEDA's scale to zero, a floor cachescale never moves: they
are said in ``notes``. Reading the triggers is ``keda_triggers.py``; KEDA's pause
annotations, and what each leaves cachescale free to change, are ``keda_pauses.py``; the
record of the values before the first change, and its check, are ``keda_record.py``.
Blocking calls: run in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from cachescale.api.reasons import Problem
from cachescale.controller.kube.client import KubeError, NotFoundError, Reads
from cachescale.controller.target.keda_pauses import (
    PAUSED_SCALE_IN,
    PAUSED_SCALE_OUT,
    one_way_pauses,
    paused_by,
)
from cachescale.controller.target.keda_triggers import (
    PrometheusTrigger,
    prometheus_triggers,
    scaling_modifiers,
)
from cachescale.snapshot import HPAState

GROUP_VERSION: Final = "keda.sh/v1alpha1"
DEFAULT_MIN_REPLICAS: Final = 0
"""KEDA's ``minReplicaCount`` when unset."""
DEFAULT_MAX_REPLICAS: Final = 100
"""KEDA's ``maxReplicaCount`` when unset."""
DEFAULT_COOLDOWN_PERIOD: Final = 300
"""KEDA's ``cooldownPeriod`` when unset, in seconds."""
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
    scaling_modifiers: dict[str, Any] = field(default_factory=dict)
    """``advanced.scalingModifiers``: when set, its formula is what KEDA's HPA scales on."""
    one_way_pauses: tuple[str, ...] = ()
    """The one-way pause annotations set (``keda_pauses.py``)."""
    cooldown_period: int | None = None
    """``cooldownPeriod`` (KEDA's default 300 s when unset)."""
    initial_cooldown_period: int | None = None
    """``initialCooldownPeriod`` (KEDA's default 0 s when unset)."""

    @property
    def queue_trigger(self) -> PrometheusTrigger | None:
        """The trigger whose threshold is managed as the HPA target (None: none is, and
        none is while scalingModifiers replaces the triggers' metrics)."""
        if self.scaling_modifiers:
            return None
        return next((t for t in self.triggers if t.sums_a_queue), None)

    @property
    def fallback_active(self) -> bool:
        """KEDA's scaler failed to read its metrics and applies ``spec.fallback``."""
        return self.conditions.get("Fallback") == "True"

    @property
    def fallback_behavior(self) -> str:
        """``fallback.behavior`` (KEDA's default ``static``)."""
        return str((self.fallback or {}).get("behavior") or "static")

    @property
    def fallback_replicas(self) -> int | None:
        """The replica count KEDA's fallback asks for, within the envelope the HPA clamps
        it to (None: no fallback, or a behavior or current count not known here)."""
        wanted = fallback_target(
            self.fallback_behavior,
            _int_or_none((self.fallback or {}).get("replicas")),
            self.hpa_current_replicas,
        )
        if wanted is None:
            return None
        return min(max(wanted, self.min_replicas), self.max_replicas)

    def fallback_message(self) -> str:
        """What KEDA does while its Fallback condition is True: the replicas its
        ``fallback.behavior`` asks for, when known."""
        replicas = self.fallback_replicas
        runs = "its fallback" if replicas is None else f"{replicas} replicas"
        return (
            f"KEDA's Fallback condition is True on ScaledObject {self.name}: its scaler cannot "
            f"read its metrics, so KEDA runs {runs} (fallback.behavior "
            f"{self.fallback_behavior}) instead of scaling on them"
        )

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
        scaling_modifiers=scaling_modifiers(spec),
        one_way_pauses=one_way_pauses(annotations),
        cooldown_period=_int_or_none(spec.get("cooldownPeriod")),
        initial_cooldown_period=_int_or_none(spec.get("initialCooldownPeriod")),
    )


def fallback_target(behavior: str, replicas: int | None, current: int | None) -> int | None:
    """The replica count KEDA's fallback asks for under ``fallback.behavior``: ``static``
    is ``fallback.replicas``, ``currentReplicas`` the current count, ``currentReplicasIfHigher``
    / ``currentReplicasIfLower`` the higher / lower of the two (None: not known)."""
    if replicas is None:
        return None
    if behavior == "static":
        return replicas
    if current is None:
        return None
    choose = {
        "currentReplicas": current,
        "currentReplicasIfHigher": max(current, replicas),
        "currentReplicasIfLower": min(current, replicas),
    }
    return choose.get(behavior)


def notes(view: ScaledObjectView) -> tuple[str, ...]:
    """What a reader of the status must know about how the ScaledObject is managed."""
    return (
        *_hpa_notes(view),
        *_pause_notes(view),
        *_trigger_notes(view),
        *_fallback_notes(view),
        *_zero_notes(view),
    )


def _hpa_notes(view: ScaledObjectView) -> list[str]:
    found = []
    if view.hpa_desired_replicas is not None:
        found.append(
            f"KEDA's HPA {view.hpa_name} (read only) runs {view.hpa_current_replicas} replicas "
            f"and wants {view.hpa_desired_replicas}"
        )
    stabilization = (view.behavior.get("scaleDown") or {}).get("stabilizationWindowSeconds")
    if stabilization is not None:
        found.append(
            f"KEDA's HPA keeps the highest recommendation of the last {stabilization}s "
            "before scaling down (advanced.horizontalPodAutoscalerConfig.behavior)"
        )
    return found


def _pause_notes(view: ScaledObjectView) -> list[str]:
    if view.paused is not None:
        return [
            f"ScaledObject {view.name} is paused ({view.paused}): KEDA is not scaling, so "
            "cachescale changes nothing on it until the annotation is removed"
        ]
    found = []
    if PAUSED_SCALE_IN in view.one_way_pauses:
        found.append(
            f"ScaledObject {view.name} has {PAUSED_SCALE_IN}=true: KEDA does not scale it "
            "in, so cachescale lowers neither minReplicaCount nor maxReplicaCount (a hold or "
            "a budget cap that would lower them waits for the annotation's removal)"
        )
    if PAUSED_SCALE_OUT in view.one_way_pauses:
        found.append(
            f"ScaledObject {view.name} has {PAUSED_SCALE_OUT}=true: KEDA does not scale it "
            "out, so cachescale does not raise minReplicaCount until the annotation is removed"
        )
    return found


def _trigger_notes(view: ScaledObjectView) -> list[str]:
    modifiers = view.scaling_modifiers
    if modifiers:
        return [
            f"ScaledObject {view.name} sets advanced.scalingModifiers: KEDA's HPA scales on "
            f"its formula ({modifiers.get('formula')!r}) against target "
            f"{modifiers.get('target')!r}, so no trigger threshold is what scales; cachescale "
            "manages only minReplicaCount and maxReplicaCount and leaves the triggers and the "
            "formula alone"
        ]
    queue = view.queue_trigger
    if queue is None:
        kinds = ", ".join(view.other_scalers) or "none"
        return [
            f"ScaledObject {view.name} has no Prometheus trigger summing an engine queue "
            f"gauge with metricType AverageValue (other triggers: {kinds}): only "
            "minReplicaCount and maxReplicaCount are managed, its triggers are left alone"
        ]
    if queue.activation_threshold is not None:
        return [
            f"ScaledObject {view.name} trigger {queue.index}: activationThreshold "
            f"{queue.activation_threshold:g} on {queue.queue_gauge} is KEDA's and is kept"
        ]
    return []


def _fallback_notes(view: ScaledObjectView) -> list[str]:
    if view.fallback is None:
        return []
    fallback, behavior = view.fallback, view.fallback_behavior
    asked = {
        "static": f"{fallback.get('replicas')} replicas",
        "currentReplicas": "the replicas it runs",
        "currentReplicasIfHigher": f"the replicas it runs, or {fallback.get('replicas')} if more",
        "currentReplicasIfLower": f"the replicas it runs, or {fallback.get('replicas')} if fewer",
    }.get(behavior, f"what behavior {behavior!r} asks for")
    now = view.fallback_replicas
    clamped = f": {now} now" if now is not None else ""
    return [
        f"ScaledObject {view.name} falls back to {asked} after "
        f"{fallback.get('failureThreshold')} failed reads (spec.fallback, behavior "
        f"{behavior}), within the minReplicaCount and maxReplicaCount cachescale sets{clamped}"
    ]


def _zero_notes(view: ScaledObjectView) -> list[str]:
    if view.min_replicas != 0:
        return []
    cooldown = view.cooldown_period if view.cooldown_period is not None else DEFAULT_COOLDOWN_PERIOD
    initial = view.initial_cooldown_period or 0
    grace = f", nor within initialCooldownPeriod {initial}s of its creation" if initial else ""
    return [
        f"ScaledObject {view.name} scales to zero (minReplicaCount 0): that floor is "
        f"KEDA's and is never raised; KEDA scales to zero only after cooldownPeriod "
        f"{cooldown}s without activity{grace}"
    ]


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
