"""The ``CacheScalingPolicy`` resource as a whole: identity, metadata, spec and status.

These names are the API's contract with the cluster: the CRD generator, the validator and
the operator all read them from here, so group, version and kind are written once.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from cachescale.api.base import ApiModel
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.status import CacheScalingPolicyStatus

GROUP: Final = "cachescale.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "cachescale.dev/v1alpha1"
KIND: Final = "CacheScalingPolicy"
PLURAL = "cachescalingpolicies"
SINGULAR = "cachescalingpolicy"
SHORT_NAMES = ("csp",)

# Annotations: the operator's contract with the objects it reads and writes. Users set the
# first two on a policy (docs/runbook.md); the others are written by the operator.
ANNOTATION_PREFIX: Final = GROUP
"""Prefix of kopf's own bookkeeping annotations: the delete handler's progress, during a
deletion (no diff base is kept: ``controller/runtime/kopf_storage.py``)."""
ACKNOWLEDGE: Final = f"{GROUP}/acknowledge"
"""Policy annotation: an RFC 3339 time; acknowledges the active collapse alert."""
REBASELINE: Final = f"{GROUP}/rebaseline"
"""Policy annotation: an RFC 3339 time; accepts the current hit rate as the baseline."""
ORIGINAL_ENVELOPE: Final = f"{GROUP}/original-envelope"
"""HPA annotation: the envelope before cachescale's first change (JSON)."""
MANAGED_BY: Final = f"{GROUP}/policy"
"""HPA annotation: the policy (namespace/name) that reshapes it."""
MAX_NUM_SEQS_CHANGED: Final = f"{GROUP}/max-num-seqs-changed-at"
"""Deployment annotation written with every ceiling change (survives a lost status)."""

# Labels users set on objects the operator reads (docs/security.md).
PROMETHEUS_CREDENTIALS: Final = f"{GROUP}/prometheus-credentials"
"""Secret label: ``"true"`` lets policies in the Secret's namespace use it in
``spec.metrics.auth``; a Secret without it is never sent anywhere."""


class ObjectMeta(BaseModel):
    """The subset of metav1.ObjectMeta a policy file needs; other keys pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """Policy name (a DNS label: it also names the policy's metrics and Events)."""
    namespace: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Namespace; the Deployment and HPA must live in the same one."""


class CacheScalingPolicy(ApiModel):
    """SLO- and budget-driven, prefix-cache-aware scaling for one LLM serving Deployment."""

    api_version: Literal["cachescale.dev/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    """Always cachescale.dev/v1alpha1."""
    kind: Literal["CacheScalingPolicy"] = KIND
    """Always CacheScalingPolicy."""
    metadata: ObjectMeta
    """Standard object metadata."""
    spec: CacheScalingPolicySpec
    """Desired state."""
    status: CacheScalingPolicyStatus | None = None
    """Observed state, written by the operator."""
