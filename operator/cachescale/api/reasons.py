"""Every reason string cachescale writes, in one place.

Condition reasons, Event reasons, the ``reason`` of a decision and the ``state`` shown by
``kubectl get`` are an interface: users' alert rules and dashboards match them. So each is
a ``StrEnum`` member here, with a note saying where it appears, and ``docs/decisions.md``
or ``docs/runbook.md`` says what it means (a test checks that every member is there).
"""

from __future__ import annotations

from enum import StrEnum


class Diagnosis(StrEnum):
    """What an evaluation found (CamelCase: also the reason of conditions and Events).

    Declaration order is precedence: the first that holds leads ``status.state``.
    """

    METRICS_UNAVAILABLE = "MetricsUnavailable"
    """Required signals unknown: ``MetricsAvailable=False`` (the other health conditions
    Unknown), a Warning Event, ``MetricsUnavailableCleared`` when data is back."""
    PREFIX_COLLAPSE = "PrefixCollapse"
    """Warm-pod hit rate collapsed: ``CacheHealthy=False``, a Warning Event,
    ``PrefixCollapseCleared`` on recovery or a rebaseline."""
    EVICTION_PRESSURE = "EvictionPressure"
    """Preemptions or a full KV pool with the batch near its ceiling: ``CacheHealthy=False``;
    a Warning Event when the ceiling could not be lowered."""
    SLO_AT_RISK = "SLOAtRisk"
    """TTFT over the SLO: ``SLOMet=False``; a Warning Event when replicas are at the cap."""
    OVER_BUDGET = "OverBudget"
    """GPU-s per 1k requests over the budget: ``WithinBudget=False`` and a Warning Event."""
    COLD_FLEET = "ColdFleet"
    """Pods still warming up (or a rollout): ``status.state`` only, expected and benign."""
    DEMAND_GROWTH = "DemandGrowth"
    """More requests at a steady cost per request: ``status.state`` only, benign."""
    HEALTHY = "Healthy"
    """Nothing wrong: ``status.state`` only."""
