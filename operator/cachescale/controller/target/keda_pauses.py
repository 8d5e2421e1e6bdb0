"""KEDA's pause annotations on a ScaledObject, and what each leaves cachescale free to change.

- ``autoscaling.keda.sh/paused: "true"`` and ``autoscaling.keda.sh/paused-replicas`` stop
  KEDA altogether (it removes its HPA): the ScaledObject is read, never patched.
- ``autoscaling.keda.sh/paused-scale-in: "true"`` stops only scaling in (KEDA sets its HPA's
  scale-down policy to Disabled and blocks scale to zero). The HPA still brings replicas
  down to a lowered ``maxReplicaCount`` at once, whatever its behaviour, so while it is set
  cachescale lowers neither ``minReplicaCount`` nor ``maxReplicaCount``; raising them
  still scales out as KEDA allows.
- ``autoscaling.keda.sh/paused-scale-out: "true"`` stops only scaling out; the HPA still
  brings replicas up to a raised ``minReplicaCount`` at once, so while it is set cachescale
  does not raise ``minReplicaCount``.

The annotation the issue tracker calls "paused-scale-down" is KEDA's ``paused-scale-in``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

PAUSED: Final = "autoscaling.keda.sh/paused"
PAUSED_REPLICAS: Final = "autoscaling.keda.sh/paused-replicas"
PAUSED_SCALE_IN: Final = "autoscaling.keda.sh/paused-scale-in"
PAUSED_SCALE_OUT: Final = "autoscaling.keda.sh/paused-scale-out"
READ_ANNOTATIONS: Final = (PAUSED, PAUSED_REPLICAS, PAUSED_SCALE_IN, PAUSED_SCALE_OUT)
"""KEDA's annotations cachescale reads (a projection of the ScaledObject must keep them)."""


def paused_by(annotations: Mapping[str, Any]) -> str | None:
    """The annotation that stops KEDA scaling either way (None: not paused)."""
    if PAUSED_REPLICAS in annotations:
        return f"{PAUSED_REPLICAS}={annotations[PAUSED_REPLICAS]}"
    if _true(annotations, PAUSED):
        return f"{PAUSED}=true"
    return None


def one_way_pauses(annotations: Mapping[str, Any]) -> tuple[str, ...]:
    """The one-way pause annotations set to true (scale-in first)."""
    return tuple(key for key in (PAUSED_SCALE_IN, PAUSED_SCALE_OUT) if _true(annotations, key))


def one_way_counts(
    annotations: Mapping[str, Any], current: tuple[int, int], wanted: tuple[int, int]
) -> tuple[int, int]:
    """The ``(minReplicaCount, maxReplicaCount)`` to write for ``wanted`` when the
    ScaledObject now has ``current``: while scale-in is paused neither is lowered, while
    scale-out is paused ``minReplicaCount`` is not raised. Min ≤ max holds whenever it
    holds for both pairs."""
    (low_now, high_now), (low, high) = current, wanted
    pauses = one_way_pauses(annotations)
    if PAUSED_SCALE_IN in pauses:
        low, high = max(low, low_now), max(high, high_now)
    if PAUSED_SCALE_OUT in pauses:
        low = min(low, low_now)
    return low, high


def _true(annotations: Mapping[str, Any], key: str) -> bool:
    return str(annotations.get(key, "")).strip().lower() == "true"
