"""Every reason string cachescale writes, in one place.

Condition reasons, Event reasons, the ``reason`` of a decision and the ``state`` shown by
``kubectl get`` are an interface: users' alert rules and dashboards match them. So each is
a ``StrEnum`` member here, with a note saying where it appears, and ``docs/decisions.md``
or ``docs/runbook.md`` says what it means (``tests/api/test_reasons.py`` checks that every
member is there). The values never change; a new reason is a new member.

The families: ``Diagnosis`` (what an evaluation found), ``Action`` (what it did),
``Hold`` (why the envelope's maxReplicas is held), ``ConditionReason`` (the other condition
reasons), ``AlertCleared`` (the Events of a clearing alert), ``ConditionRecovered`` (the
Events of a condition back in its good state) and ``Problem`` (why no decision could be
made). Why Prometheus could not be read at all is
``cachescale.snapshot.FetchFailure``, part of the snapshot the decision reads.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeAlias


class Diagnosis(StrEnum):
    """What an evaluation found: ``status.state`` (``kubectl get``) shows the leading one.

    Declaration order is precedence: the first that holds leads.
    """

    METRICS_UNAVAILABLE = "MetricsUnavailable"
    """Required signals unknown: ``MetricsAvailable=False`` (``CacheHealthy``, ``SLOMet``
    and ``WithinBudget`` Unknown) and a Warning Event."""
    PREFIX_COLLAPSE = "PrefixCollapse"
    """Warm-pod hit rate collapsed: ``CacheHealthy=False`` and a Warning Event."""
    EVICTION_PRESSURE = "EvictionPressure"
    """Preemptions or a full KV pool with the batch near its ceiling: ``CacheHealthy=False``;
    a Warning Event when the ceiling could not be lowered."""
    CACHE_DEGRADED = "CacheDegraded"
    """Warm-pod hit rate held well below its baseline, above the collapse threshold, at a
    material cost per request: ``CacheHealthy=False`` and a Warning Event with the cost.
    Never changes scaling by itself."""
    SLO_AT_RISK = "SLOAtRisk"
    """TTFT over the SLO: ``SLOMet=False``; a Warning Event when replicas are at the cap."""
    OVER_BUDGET = "OverBudget"
    """GPU-s per 1k requests over the budget: ``WithinBudget=False`` and a Warning Event."""
    CACHE_DILUTED = "CacheDiluted"
    """A lower hit rate that pods joining the fleet explain (each pod's cache sees fewer of
    the requests that share a prefix): ``CacheHealthy=True`` with this reason, no alert,
    never a scaling change; ``CacheDegraded`` is not raised while it holds."""
    COLD_FLEET = "ColdFleet"
    """Pods still warming up, or a rollout: ``status.state`` only (expected, benign)."""
    DEMAND_GROWTH = "DemandGrowth"
    """More requests at a steady cost per request: ``status.state`` only (benign)."""
    HEALTHY = "Healthy"
    """Nothing wrong: ``status.state`` only."""


class AlertCleared(StrEnum):
    """The Normal Event posted when an alert clears (one member per alerting diagnosis)."""

    METRICS_UNAVAILABLE = "MetricsUnavailableCleared"
    """Event: every required signal is read again."""
    PREFIX_COLLAPSE = "PrefixCollapseCleared"
    """Event: the warm hit rate recovered, or a rebaseline accepted it."""
    EVICTION_PRESSURE = "EvictionPressureCleared"
    """Event: two evaluations without eviction pressure."""
    CACHE_DEGRADED = "CacheDegradedCleared"
    """Event: two evaluations with the warm hit rate back within half the drop of its
    baseline (or collapsed, or explained); at once on a rebaseline."""
    SLO_AT_RISK = "SLOAtRiskCleared"
    """Event: two evaluations within the SLO."""
    OVER_BUDGET = "OverBudgetCleared"
    """Event: two evaluations within the budget."""


def cleared(alert: Diagnosis) -> AlertCleared:
    """The Event reason of ``alert`` clearing."""
    return AlertCleared[alert.name]


class ConditionRecovered(StrEnum):
    """The Normal Event posted when a condition returns to its good state after a Warning
    (``controller/reconcile/condition_events.py``); one member per condition that has one."""

    READY = "ReadyRecovered"
    """Event: the last evaluation completed again."""
    CACHE_HEALTHY = "CacheHealthyRecovered"
    """Event: the warm-pod hit rate is at its baseline again."""
    SLO_MET = "SLOMetRecovered"
    """Event: TTFT p95 is within the SLO again."""
    WITHIN_BUDGET = "WithinBudgetRecovered"
    """Event: GPU-s per 1k requests is within the budget again."""
    METRICS_AVAILABLE = "MetricsAvailableRecovered"
    """Event: every required signal is read again."""
    CACHE_ISOLATION = "CacheIsolationRecovered"
    """Event: the engines' prefix cache keeps tenants apart again."""


class Action(StrEnum):
    """What an evaluation did: ``status.lastDecision.reason``, and the reason of the Normal
    Event posted when the change is applied (``mode: Enforce``)."""

    LOWERED_MAX_NUM_SEQS = "LoweredMaxNumSeqs"
    """``--max-num-seqs`` lowered toward B_max: sustained eviction pressure, or a sustained
    SLO breach with the warm hit rate depressed under its baseline."""
    RAISED_MAX_NUM_SEQS = "RaisedMaxNumSeqs"
    """``--max-num-seqs`` raised: the hit rate is too low to be worth protecting."""
    CLAMPED_MAX_NUM_SEQS = "ClampedMaxNumSeqs"
    """``--max-num-seqs`` brought inside ``minNumSeqs..maxNumSeqs``."""
    HELD_FOR_PREFIX_COLLAPSE = "HeldForPrefixCollapse"
    """maxReplicas held at the pre-collapse level (``ScalingHeld=True, CollapseHold``)."""
    SCALED_FOR_SLO = "ScaledForSLO"
    """The SLO guard released a hold or lowered the HPA target."""
    CAPPED_AT_BUDGET = "CappedAtBudget"
    """The HPA wants more replicas than the budget allows."""
    ENVELOPE_UPDATED = "EnvelopeUpdated"
    """The HPA's min/max/target changed for any other reason."""
    NO_CHANGE = "NoChange"
    """Nothing changed."""
    FROZEN_ON_MISSING_METRICS = "FrozenOnMissingMetrics"
    """Required signals unknown: nothing changed; also the reason of ``ScalingHeld=False`` then."""
    WAITING_FOR_FULL_WINDOW = "WaitingForFullWindow"
    """The window still covers time without data: nothing changed."""
    WAITING_FOR_WARM_PODS = "WaitingForWarmPods"
    """Every ready pod is still warming up: nothing changed."""
    READ_RETRIED = "ReadRetried"
    """The signals could not be read, for the first time in a row: nothing was decided,
    changed or written, and the read is retried at the next interval (never in a status:
    the operator's log and ``cachescale_evaluation_errors_total`` show it)."""


class Hold(StrEnum):
    """Why the envelope's maxReplicas is below what the HPA would otherwise get: the
    ``ScalingHeld=True`` reasons."""

    COLLAPSE = "CollapseHold"
    """``ScalingHeld=True``: maxReplicas held at the pre-collapse level."""
    BUDGET = "BudgetCap"
    """``ScalingHeld=True``: maxReplicas capped by the budget, and the cap binds."""


class ConditionReason(StrEnum):
    """Condition reasons that are neither a diagnosis nor a hold."""

    EVALUATED = "Evaluated"
    """``Ready=True``: the last evaluation completed."""
    SIGNALS_READ = "SignalsRead"
    """``MetricsAvailable=True``: every required signal was read."""
    NO_WARM_PODS = "NoWarmPods"
    """``CacheHealthy=Unknown``: no warm pod looked a prompt token up."""
    COLLAPSE_SUSPECTED = "CollapseSuspected"
    """``CacheHealthy=Unknown``: under the collapse threshold, not yet for
    ``collapseWindows`` evaluations."""
    LEARNING_BASELINE = "LearningBaseline"
    """``CacheHealthy=Unknown``: no baseline learned yet."""
    HIT_RATE_AT_BASELINE = "HitRateAtBaseline"
    """``CacheHealthy=True``: no collapse streak."""
    TTFT_WITHIN_SLO = "TTFTWithinSLO"
    """``SLOMet=True``."""
    COST_UNKNOWN = "CostUnknown"
    """``WithinBudget=Unknown``: GPU-s per 1k requests could not be measured."""
    COST_WITHIN_BUDGET = "CostWithinBudget"
    """``WithinBudget=True``."""
    NOT_HELD = "NotHeld"
    """``ScalingHeld=False``: the envelope's maxReplicas does not bind."""
    CACHE_CONFIG_UNKNOWN = "CacheConfigUnknown"
    """``CacheIsolation=Unknown``: no engine's ``vllm:cache_config_info`` was read (SGLang
    exports none), or its hash algorithm is absent or not one cachescale knows."""
    NON_CRYPTOGRAPHIC_PREFIX_HASH = "NonCryptographicPrefixHash"
    """``CacheIsolation=False``: ``cache.tenancy: MultiTenant`` and an engine hashes prefix
    blocks with xxhash or builtin, which vLLM documents as open to collisions across
    tenants."""
    PREFIX_CACHING_OFF = "PrefixCachingOff"
    """``CacheIsolation=False``: an engine runs with prefix caching off."""
    CRYPTOGRAPHIC_PREFIX_HASH = "CryptographicPrefixHash"
    """``CacheIsolation=True``: ``MultiTenant`` and every engine hashes with SHA-256."""
    SINGLE_TENANT = "SingleTenant"
    """``CacheIsolation=True``: ``cache.tenancy: SingleTenant``, prefix caching on."""
    KEDA_FALLBACK = "KEDAFallback"
    """``MetricsAvailable=False``: the target ScaledObject's KEDA ``Fallback`` condition is
    True (KEDA's scaler cannot read its metrics and runs ``spec.fallback.replicas``)."""
    KEDA_IGNORES_NULL_VALUES = "KEDAIgnoresNullValues"
    """Warning Event, and a note in the ``Ready`` message: a Prometheus trigger of the
    target ScaledObject has ``ignoreNullValues`` true (KEDA's default), so a missing
    series reads as 0 and KEDA scales to its minimum during a peak (kedacore/keda#3065)."""
    RESTORE_ABANDONED = "RestoreAbandoned"
    """Warning Event on a deleted policy: the restore of the autoscaler's envelope failed
    at every attempt, and the policy went without it (its finalizer always comes off)."""


class Problem(StrEnum):
    """Why an evaluation could not decide: ``Ready=False``, ``status.state``, a Warning
    Event and the ``kind`` of ``cachescale_evaluation_errors_total``."""

    INVALID_SPEC = "InvalidSpec"
    """The spec fails the operator's checks."""
    TARGET_NOT_FOUND = "TargetNotFound"
    """The Deployment or HPA named in ``spec.target`` does not exist."""
    TARGET_MISMATCH = "TargetMismatch"
    """The HPA does not scale the Deployment, or the container or its flag is missing."""
    HPA_MANAGED_BY_KEDA = "HPAManagedByKEDA"
    """The HPA named by ``hpaName`` belongs to a KEDA ScaledObject: name that ScaledObject
    in ``scaledObjectName`` instead."""
    TARGET_CLAIMED = "TargetClaimed"
    """An older policy names the same HPA and manages it (``controller/target/claims.py``): this
    one reads, patches and restores nothing."""
    TARGET_IS_OPERATOR = "TargetIsOperator"
    """``spec.target`` names the operator's own Deployment: nothing is read or changed."""
    API_ERROR = "ApiError"
    """The Kubernetes API failed while reading the target."""
    CREDENTIALS_NOT_ALLOWED = "CredentialsNotAllowed"
    """A Secret named in ``spec.metrics.auth`` lacks the opt-in label: nothing is sent, and
    ``MetricsAvailable=False`` carries the same reason."""
    METRICS_URL_NOT_ALLOWED = "MetricsURLNotAllowed"
    """``spec.metrics.prometheusUrl`` is outside ``--allowed-prometheus-url`` (empty: no
    policy-chosen URL is allowed), or is spelled so that it is refused whatever the list
    (a backslash, user info...): nothing is fetched, and ``MetricsAvailable=False`` carries
    the same reason."""
    INSECURE_TLS_NOT_ALLOWED = "InsecureTLSNotAllowed"
    """``spec.metrics.auth.insecureSkipVerify`` is true and the operator runs without
    ``--allow-insecure-tls``: nothing is fetched or sent, no Secret is read, and
    ``MetricsAvailable=False`` carries the same reason."""
    NO_PROMETHEUS_URL = "NoPrometheusURL"
    """Neither ``spec.metrics.prometheusUrl`` nor the operator's ``--default-prometheus-url``
    (chart value ``prometheus.url``) is set: nothing is read, and ``MetricsAvailable=False``
    carries the same reason."""
    SELECTOR_OUTSIDE_NAMESPACE = "SelectorOutsideNamespace"
    """``spec.metrics.selector`` (or a selector of ``metrics.demandQuery``) names a
    namespace other than the policy's: nothing is fetched, and ``MetricsAvailable=False``
    carries the same reason."""
    DEMAND_QUERY_NOT_ALLOWED = "DemandQueryNotAllowed"
    """``spec.metrics.demandQuery`` is set but the operator runs without
    ``--allow-demand-query``, or the query cannot be confined to the policy's namespace:
    nothing is fetched, and ``MetricsAvailable=False`` carries the same reason."""
    API_CONFLICT = "ApiConflict"
    """The decision could not be applied (a conflicting writer, or a patch the operator may
    not make: HTTP 403, chart value ``rbac.enforceNamespaces``); a Warning Event and the
    error counter only, the status is still written."""
    INTERNAL = "Internal"
    """An unexpected exception (a bug): the error counter only."""


AnyConditionReason: TypeAlias = Diagnosis | Hold | Action | ConditionReason | Problem
"""Any reason a status condition can carry."""
