"""The desired state a user writes: ``CacheScalingPolicy.spec`` (cachescale.dev/v1alpha1).

Every field carries its unit in its name and a docstring that becomes the CRD's field
description, so ``kubectl explain csp.spec`` documents the API. Cross-field rules are
written twice on purpose: as pydantic validators (used by ``cachescale validate`` and by
the operator) and as CEL ``x-kubernetes-validations`` on the same model (used by the API
server, so ``kubectl apply`` rejects a bad policy before the operator ever sees it). The
tests evaluate both against the same cases.

Types are strict, as the API server's are: ``maxReplicas: "20"`` is a string, not 20, and
``true`` is not 1. Numbers must be finite, and every number and duration has an upper
bound, so an infinite budget (``.inf``) or a window of a million hours fails here and, by
the published ``maximum`` or CEL rule, in the API server too.

This module holds the root model and the small parts (mode, SLO, budget, cache); the
larger parts have modules of their own (``spec_target``, ``spec_metrics``,
``spec_batching``), over what they all share (``spec_base``: the strict base model, the
name patterns and the size limits). Every name is importable from here, the API's one
address for the spec.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, field_validator, model_validator

from cachescale.api.label_selector import LabelSelector
from cachescale.api.spec_base import (
    DNS_LABEL,
    MAX_COOLDOWN,
    MAX_DEMAND_QUERY,
    MAX_EVALUATIONS_PER_WINDOW,
    MAX_GIB,
    MAX_GPU_SECONDS_PER_1K,
    MAX_LABEL,
    MAX_LABEL_SELECTOR,
    MAX_NAME,
    MAX_REPLICAS,
    MAX_SELECTOR_KEY,
    MAX_SELECTOR_LABELS,
    MAX_SELECTOR_VALUE,
    MAX_URL,
    MAX_WINDOW,
    MIN_INTERVAL_SECONDS,
    MIN_WINDOW_SECONDS,
    PROMETHEUS_LABEL_NAME,
    PROMETHEUS_URL_PATTERN,
    TOO_MANY_EVALUATIONS,
    Duration,
    SpecModel,
    cel_or_default,
)
from cachescale.api.spec_batching import BatchingSpec, GpuShape, ModelShape
from cachescale.api.spec_metrics import EMPTY_LABEL_VALUE, MetricsSpec, PrometheusAuth, SecretKeyRef
from cachescale.api.spec_target import ONE_AUTOSCALER, AutoscalerKind, Engine, TargetSpec

__all__ = [
    "EMPTY_LABEL_VALUE",
    "MAX_COOLDOWN",
    "MAX_DEMAND_QUERY",
    "MAX_EVALUATIONS_PER_WINDOW",
    "MAX_GIB",
    "MAX_GPU_SECONDS_PER_1K",
    "MAX_LABEL",
    "MAX_LABEL_SELECTOR",
    "MAX_NAME",
    "MAX_PROMPT_SOURCES",
    "MAX_REPLICAS",
    "MAX_SELECTOR_KEY",
    "MAX_SELECTOR_LABELS",
    "MAX_SELECTOR_VALUE",
    "MAX_URL",
    "MAX_WINDOW",
    "MIN_INTERVAL_SECONDS",
    "MIN_WINDOW_SECONDS",
    "ONE_AUTOSCALER",
    "PROMETHEUS_LABEL_NAME",
    "PROMETHEUS_URL_PATTERN",
    "TOO_MANY_EVALUATIONS",
    "AutoscalerKind",
    "BatchingSpec",
    "BudgetSpec",
    "CacheScalingPolicySpec",
    "CacheSpec",
    "CollapseAction",
    "Duration",
    "Engine",
    "GpuShape",
    "MetricsSpec",
    "Mode",
    "ModelShape",
    "PrometheusAuth",
    "PromptSource",
    "PromptSourceKind",
    "SLOSpec",
    "SecretKeyRef",
    "SpecModel",
    "TargetSpec",
    "Tenancy",
]


class Mode(StrEnum):
    """Whether the operator changes anything."""

    ENFORCE = "Enforce"
    """Patch the HPA envelope and ``--max-num-seqs`` as decided."""
    ADVISE = "Advise"
    """Only record decisions in status, Events and metrics (dry run)."""


class CollapseAction(StrEnum):
    """What happens to the HPA envelope during a prefix-cache collapse (always alerted)."""

    HOLD = "Hold"
    """Pin maxReplicas at the pre-collapse level; the SLO guard may still scale within budget."""
    CAP_AT_BUDGET = "CapAtBudget"
    """Cap maxReplicas at what the GPU-seconds budget allows."""
    SCALE_AS_USUAL = "ScaleAsUsual"
    """Leave the envelope alone; only alert."""


class Tenancy(StrEnum):
    """Who shares the engines' prefix cache (``CacheIsolation`` in docs/decisions.md)."""

    SINGLE_TENANT = "SingleTenant"
    """One tenant: any prompt may reuse any other's cached prefix."""
    MULTI_TENANT = "MultiTenant"
    """Several tenants share the engines: a block-hash collision between their prompts
    would serve one tenant's KV blocks to another, so the hash must be cryptographic."""


class SLOSpec(SpecModel):
    """The latency objective the serving Deployment must meet."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.ttftP99Seconds) || "
                    "self.ttftP99Seconds >= self.ttftP95Seconds",
                    "message": "ttftP99Seconds must be at least ttftP95Seconds",
                }
            ]
        }
    )

    ttft_p95_seconds: float = Field(gt=0, le=600)
    """Time-to-first-token 95th percentile objective, in seconds (queueing included)."""
    ttft_p99_seconds: float | None = Field(default=None, gt=0, le=600)
    """Optional TTFT 99th percentile objective, in seconds; at least ttftP95Seconds."""

    @model_validator(mode="after")
    def _p99_not_below_p95(self) -> Self:
        if self.ttft_p99_seconds is not None and self.ttft_p99_seconds < self.ttft_p95_seconds:
            raise ValueError(
                f"ttftP99Seconds ({self.ttft_p99_seconds}) must be at least "
                f"ttftP95Seconds ({self.ttft_p95_seconds})"
            )
        return self


DEFAULT_MIN_REPLICAS = 1
"""``budget.minReplicas`` when left out."""


class BudgetSpec(SpecModel):
    """The cost envelope: GPU-seconds per 1k requests and the replica range."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"{cel_or_default('minReplicas', DEFAULT_MIN_REPLICAS)} <= "
                    "self.maxReplicas",
                    "message": "minReplicas must be less than or equal to maxReplicas",
                }
            ]
        }
    )

    gpu_seconds_per_1k_requests: float = Field(gt=0, le=MAX_GPU_SECONDS_PER_1K)
    """Most GPU-seconds the fleet may spend per 1,000 successful requests."""
    min_replicas: int = Field(default=DEFAULT_MIN_REPLICAS, ge=1, le=MAX_REPLICAS)
    """Fewest replicas the HPA may run."""
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS)
    """Most replicas the HPA may run."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must be less than or equal to "
                f"maxReplicas ({self.max_replicas})"
            )
        return self


MAX_PROMPT_SOURCES = 16
"""Declared prompt sources: each costs one or two list calls when a collapse is suspected."""


class PromptSourceKind(StrEnum):
    """What kind of object builds or holds the prompts (read for changes, never written)."""

    DEPLOYMENT = "Deployment"
    """A service that builds prompts (a RAG API, a gateway): its ReplicaSet revisions."""
    CONFIG_MAP = "ConfigMap"
    """Prompt templates: when and by which manager they were last written."""
    SECRET = "Secret"
    """Metadata only (when and by whom written), never the contents."""


class PromptSource(SpecModel):
    """Where this policy's prompts come from: a namespace, a kind and the labels of the
    objects. When a collapse is suspected or raised, changes to them in the hour before
    the drop are named (``docs/decisions.md``, "PrefixCollapse")."""

    namespace: str = Field(pattern=DNS_LABEL, max_length=MAX_LABEL)
    """The namespace of the objects."""
    kind: PromptSourceKind = Field(strict=False)
    """Deployment, ConfigMap or Secret (Secrets are read as metadata only)."""
    label_selector: str = Field(min_length=1, max_length=MAX_LABEL_SELECTOR)
    """A Kubernetes label selector, e.g. app=rag-api (required: never a whole namespace; at
    most 256 characters)."""

    @field_validator("label_selector")
    @classmethod
    def _selector_parses(cls, text: str) -> str:
        try:
            LabelSelector.parse(text)
        except ValueError as error:
            raise ValueError(f"labelSelector {text!r} is not a label selector: {error}") from None
        return text


class CacheSpec(SpecModel):
    """When a prefix-cache hit-rate drop counts as a collapse, and what to do about it."""

    collapse_relative_drop: float = Field(default=0.5, gt=0, lt=1)
    """A collapse needs the warm-pod token hit rate to fall by more than this fraction of
    its baseline (0.5: a baseline of 0.85 must fall below 0.425)..."""
    collapse_absolute_drop: float = Field(default=0.2, gt=0, lt=1)
    """...and by at least this many points (0.2: 0.85 must fall below 0.65). Together with
    the relative drop this keeps a low-hit workload (baseline under 0.2: nothing worth
    protecting) from ever being called a collapse."""
    collapse_windows: int = Field(default=3, ge=1, le=100)
    """Consecutive evaluation windows the drop must persist before it is a collapse."""
    pod_warmup_seconds: int = Field(default=600, ge=0, le=86_400)
    """Pods younger than this are warming up: excluded from the collapse test."""
    on_collapse: CollapseAction = Field(default=CollapseAction.HOLD, strict=False)
    """Hold, CapAtBudget or ScaleAsUsual; an alert is raised in every case."""
    tenancy: Tenancy = Field(default=Tenancy.SINGLE_TENANT, strict=False)
    """SingleTenant or MultiTenant: with MultiTenant, the CacheIsolation condition is False
    while an engine hashes prefix blocks with a non-cryptographic hash (xxhash, builtin)."""
    prompt_sources: list[PromptSource] = Field(default=[], max_length=MAX_PROMPT_SOURCES)
    """Where the prompts come from (RAG APIs, gateways, template ConfigMaps): when a
    collapse is suspected or raised, their changes in the hour before the drop are named,
    besides those in the policy's own namespace. At most 16."""


class CacheScalingPolicySpec(SpecModel):
    """Desired state: the SLO and cost budget of one serving Deployment, and how to act."""

    mode: Mode = Field(default=Mode.ADVISE, strict=False)
    """Enforce changes the HPA and engine flags; Advise (default) only recommends."""
    target: TargetSpec
    """The Deployment, its engine container and its HPA or KEDA ScaledObject."""
    metrics: MetricsSpec
    """Prometheus location, series selector, window and evaluation interval."""
    slo: SLOSpec
    """Latency objective."""
    budget: BudgetSpec
    """Cost budget and replica range."""
    cache: CacheSpec = Field(default_factory=CacheSpec)
    """Prefix-cache collapse detection and response."""
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    """Management of --max-num-seqs."""
    restore_on_delete: bool = True
    """When the policy is deleted, restore the HPA envelope recorded before the first change."""
