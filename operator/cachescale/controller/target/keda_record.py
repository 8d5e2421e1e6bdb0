"""The record of a ScaledObject's original values, and the check before it is trusted.

Before its first change to a ScaledObject, ``actions.scaled_object_ops`` records the
values it is about to change (``minReplicaCount``, ``maxReplicaCount``, and the queue
trigger's index and threshold) in the annotation the HPA path uses; a restore puts them
back. Anyone who may edit the ScaledObject may edit that annotation, so a record is
trusted only when it has exactly the shape the operator writes for this object: otherwise
nothing is changed or restored from it, and the message says how to repair it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from cachescale.api.policy import ORIGINAL_ENVELOPE
from cachescale.api.reasons import Problem
from cachescale.controller.target.keda import ScaledObjectError
from cachescale.controller.target.keda_triggers import number_or_none

RECORD_KEYS: Final = frozenset({"minReplicaCount", "maxReplicaCount", "triggerIndex", "threshold"})
"""What ``actions.scaled_object_ops`` records (null: the field was unset)."""


def recorded_counts(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ScaledObject's original values as recorded before the first change (None: none),
    in the annotation the HPA path uses; ``ScaledObjectError`` (``TargetMismatch``) when
    the record is not one the operator wrote for this object, so nothing is restored from
    it."""
    text = ((body.get("metadata") or {}).get("annotations") or {}).get(ORIGINAL_ENVELOPE)
    if text is None:
        return None
    try:
        recorded = json.loads(text)
        problem = _record_problem(recorded, body)
    except ValueError:
        problem = "it is not JSON"
    if problem:
        name = (body.get("metadata") or {}).get("name")
        raise ScaledObjectError(
            Problem.TARGET_MISMATCH,
            f"ScaledObject {name}: annotation {ORIGINAL_ENVELOPE} is not the record cachescale "
            f"wrote ({problem}), so nothing is changed or restored from it; put back the "
            "original values, or remove the annotation (the current values are then recorded "
            "as the original)",
        )
    return dict(recorded)


def _record_problem(recorded: object, body: Mapping[str, Any]) -> str:
    """What is wrong with a decoded record ("" when nothing)."""
    if not isinstance(recorded, dict):
        return "it is not a JSON object"
    if not {"minReplicaCount", "maxReplicaCount"} <= recorded.keys() <= RECORD_KEYS:
        return f"it has keys {sorted(recorded)}, expected minReplicaCount, maxReplicaCount"
    for key in ("minReplicaCount", "maxReplicaCount"):
        value = recorded[key]
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            return f"{key} must be null or a whole number from 0"
    if ("triggerIndex" in recorded) != ("threshold" in recorded):
        return "triggerIndex and threshold go together"
    if "triggerIndex" in recorded:
        triggers = (body.get("spec") or {}).get("triggers") or []
        index = recorded["triggerIndex"]
        if not (
            isinstance(index, int)
            and not isinstance(index, bool)
            and 0 <= index < len(triggers)
            and triggers[index].get("type") == "prometheus"
        ):
            return f"triggerIndex {index!r} is not a Prometheus trigger of this ScaledObject"
        if (
            not isinstance(recorded["threshold"], str)
            or number_or_none(recorded["threshold"]) is None
        ):
            return f"threshold {recorded['threshold']!r} is not a number"
    return ""
