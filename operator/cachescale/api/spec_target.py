"""``spec.target``: the Deployment a policy manages, its engine, and the one autoscaler.

A policy names exactly one autoscaler: an autoscaling/v2 HorizontalPodAutoscaler or a KEDA
ScaledObject (which owns the HPA it generates, so cachescale patches the ScaledObject,
never that HPA). The rule is a pydantic validator and a CEL rule with the same words.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, model_validator

from cachescale.api.spec_base import DNS_LABEL, DNS_SUBDOMAIN, MAX_LABEL, MAX_NAME, SpecModel


class Engine(StrEnum):
    """The inference engine serving the Deployment (selects metric names and flags)."""

    VLLM = "vllm"
    SGLANG = "sglang"


ONE_AUTOSCALER = (
    "set exactly one of hpaName (an autoscaling/v2 HorizontalPodAutoscaler) and "
    "scaledObjectName (a KEDA ScaledObject, which owns the HPA it generates)"
)


class AutoscalerKind(StrEnum):
    """What scales the Deployment: the object the policy reads and patches."""

    HPA = "HorizontalPodAutoscaler"
    SCALED_OBJECT = "ScaledObject"


class TargetSpec(SpecModel):
    """The serving workload this policy manages, in the policy's namespace, and the one
    autoscaler that scales it: an HPA or a KEDA ScaledObject."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.hpaName) != has(self.scaledObjectName)",
                    "message": ONE_AUTOSCALER,
                }
            ]
        }
    )

    deployment_name: str = Field(pattern=DNS_SUBDOMAIN, max_length=MAX_NAME)
    """Name of the Deployment that runs the inference engine."""
    container_name: str = Field(default="vllm", pattern=DNS_LABEL, max_length=MAX_LABEL)
    """Container in that Deployment whose args carry the engine flags."""
    hpa_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN, max_length=MAX_NAME)
    """HorizontalPodAutoscaler (autoscaling/v2) that scales the Deployment. Exactly one of
    hpaName and scaledObjectName."""
    scaled_object_name: str | None = Field(default=None, pattern=DNS_SUBDOMAIN, max_length=MAX_NAME)
    """KEDA ScaledObject (keda.sh/v1alpha1) that scales the Deployment; cachescale patches
    its maxReplicaCount, minReplicaCount and queue trigger threshold, never the HPA KEDA
    generates from it. Exactly one of hpaName and scaledObjectName."""
    engine: Engine = Field(default=Engine.VLLM, strict=False)
    """Inference engine: vllm or sglang."""

    @model_validator(mode="after")
    def _one_autoscaler(self) -> Self:
        if (self.hpa_name is None) == (self.scaled_object_name is None):
            both = self.hpa_name is not None
            raise ValueError(f"{ONE_AUTOSCALER}; {'both are' if both else 'neither is'} set")
        return self

    @property
    def autoscaler_kind(self) -> AutoscalerKind:
        """Which kind of autoscaler the policy names."""
        return AutoscalerKind.HPA if self.hpa_name is not None else AutoscalerKind.SCALED_OBJECT

    @property
    def autoscaler_name(self) -> str:
        """The name of that autoscaler (the validator guarantees exactly one is set)."""
        name = self.hpa_name if self.hpa_name is not None else self.scaled_object_name
        assert name is not None
        return name

    @property
    def autoscaler(self) -> str:
        """``HorizontalPodAutoscaler vllm`` or ``ScaledObject vllm``, for messages."""
        return f"{self.autoscaler_kind.value} {self.autoscaler_name}"
