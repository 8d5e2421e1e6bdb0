"""A KEDA ScaledObject's triggers as KEDA reads them, and which one is the queue trigger.

A ``type: prometheus`` trigger's ``metadata`` holds strings (KEDA's schema): the query, the
``threshold`` and ``activationThreshold`` as decimal text, ``ignoreNullValues`` (KEDA's
default true). The *queue trigger* is the first one whose query sums an engine queue gauge
with ``metricType: AverageValue`` (``keda.py`` says why its threshold is the HPA's per-pod
target); there is none while ``advanced.scalingModifiers`` is set, since its formula then
replaces every trigger's metric in KEDA's HPA.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

QUEUE_GAUGES: Final = (
    "num_requests_waiting",
    "num_requests_running",
    "num_queue_reqs",
    "num_running_reqs",
)
"""Engine gauges a queue trigger may count (vLLM and SGLang names, any prefix)."""
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


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


def prometheus_triggers(spec: Mapping[str, Any]) -> list[PrometheusTrigger]:
    """The Prometheus triggers of a ScaledObject's ``spec``."""
    return [
        _prometheus_trigger(index, trigger)
        for index, trigger in enumerate(spec.get("triggers") or [])
        if trigger.get("type") == "prometheus"
    ]


def queue_trigger(spec: Mapping[str, Any]) -> PrometheusTrigger | None:
    """The trigger whose threshold is managed as the HPA target (None: none is, and none
    is while ``advanced.scalingModifiers`` replaces the triggers' metrics)."""
    if scaling_modifiers(spec):
        return None
    return next((t for t in prometheus_triggers(spec) if t.sums_a_queue), None)


def scaling_modifiers(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``advanced.scalingModifiers`` (empty: unset)."""
    return dict((spec.get("advanced") or {}).get("scalingModifiers") or {})


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


def number_or_none(value: object) -> float | None:
    """``value`` as a finite number (None: not one)."""
    try:
        number = float(str(value))
    except ValueError:
        return None
    return (
        number if value is not None and number == number and abs(number) != float("inf") else None
    )
