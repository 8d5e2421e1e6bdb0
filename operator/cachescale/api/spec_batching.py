"""``spec.batching``: whether the engine's batch ceiling is managed, within which bounds.

The cache-friendly ceiling on ``--max-num-seqs`` (vLLM) / ``--max-running-requests``
(SGLang) is computed from the model's attention shape and the GPU memory a replica gives
the engine (``cachescale.capacity``), so managing it needs both, and the weights must fit
in the engine's share of that memory. Each change restarts pods and empties their caches:
management is off by default, and changes are spaced by a bounded cooldown.
"""

from __future__ import annotations

from typing import Self

from pydantic import ConfigDict, Field, field_validator, model_validator

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.spec_base import MAX_COOLDOWN, MAX_GIB, Duration, SpecModel, cel_or_default

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""``gpu.gpuMemoryUtilization`` when left out: vLLM's own default."""
DEFAULT_MIN_NUM_SEQS = 8
"""``batching.minNumSeqs`` when left out."""
DEFAULT_MAX_NUM_SEQS = 256
"""``batching.maxNumSeqs`` when left out."""
DEFAULT_COOLDOWN = "30m"
"""``batching.cooldown`` when left out."""


class ModelShape(SpecModel):
    """The served model's attention shape: sizes the KV cache (values from config.json)."""

    layers: int = Field(ge=1, le=1024)
    """Transformer layers (num_hidden_layers)."""
    kv_heads: int = Field(ge=1, le=1024)
    """Key/value heads (num_key_value_heads; equals attention heads without GQA)."""
    head_dim: int = Field(ge=1, le=4096)
    """Dimension of one attention head (hidden_size / num_attention_heads)."""
    kv_dtype_bytes: int = Field(default=2, ge=1, le=4)
    """Bytes per KV element: 2 for fp16/bf16, 1 for fp8."""
    weights_gib: float = Field(gt=0, le=MAX_GIB)
    """Model weights resident per replica, in GiB (summed over tensor-parallel GPUs); they
    must fit in the engine's share of GPU memory (memoryGiB × gpuMemoryUtilization)."""


class GpuShape(SpecModel):
    """The memory a replica gives the engine."""

    memory_gib: float = Field(gt=0, le=MAX_GIB)
    """GPU memory per replica, in GiB (summed over tensor-parallel GPUs)."""
    gpu_memory_utilization: float = Field(default=DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1)
    """The engine's --gpu-memory-utilization (vLLM default 0.9; 0.92 from vLLM 0.20)."""


class BatchingSpec(SpecModel):
    """Whether and how the engine's batch ceiling (--max-num-seqs) is managed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"{cel_or_default('minNumSeqs', DEFAULT_MIN_NUM_SEQS)} <= "
                    f"{cel_or_default('maxNumSeqs', DEFAULT_MAX_NUM_SEQS)}",
                    "message": "minNumSeqs must be less than or equal to maxNumSeqs",
                },
                {
                    "rule": f"!{cel_or_default('manageMaxNumSeqs', False)} || "
                    "(has(self.model) && has(self.gpu))",
                    "message": "manageMaxNumSeqs needs model and gpu to compute the ceiling",
                },
                {
                    "rule": "!has(self.model) || !has(self.gpu) || self.model.weightsGiB < "
                    "self.gpu.memoryGiB * "
                    f"{cel_or_default('gpu.gpuMemoryUtilization', DEFAULT_GPU_MEMORY_UTILIZATION)}",
                    "message": "model.weightsGiB must fit in gpu.memoryGiB × "
                    "gpu.gpuMemoryUtilization (the engine's share of GPU memory)",
                },
                {
                    "rule": f"duration({cel_or_default('cooldown', DEFAULT_COOLDOWN)}) <= "
                    f"duration('{MAX_COOLDOWN}')",
                    "message": f"cooldown must be at most {MAX_COOLDOWN}",
                },
            ]
        }
    )

    manage_max_num_seqs: bool = False
    """Let the operator change --max-num-seqs (vLLM) / --max-running-requests (SGLang).
    Each change restarts pods and empties their caches, so it is off by default."""
    min_num_seqs: int = Field(default=DEFAULT_MIN_NUM_SEQS, ge=1, le=65_536)
    """Lowest batch ceiling the operator may set."""
    max_num_seqs: int = Field(default=DEFAULT_MAX_NUM_SEQS, ge=1, le=65_536)
    """Highest batch ceiling the operator may set."""
    model: ModelShape | None = None
    """Model shape for the cache-friendly ceiling; required when managing the ceiling."""
    gpu: GpuShape | None = None
    """GPU memory for the cache-friendly ceiling; required when managing the ceiling."""
    cache_reserve_gib: float = Field(default=0.0, ge=0, le=MAX_GIB)
    """KV memory, in GiB, kept for reusable cached prefixes rather than running sequences."""
    cooldown: Duration = DEFAULT_COOLDOWN
    """Least time between two ceiling changes, at most 168h (each change empties caches)."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_num_seqs > self.max_num_seqs:
            raise ValueError(
                f"minNumSeqs ({self.min_num_seqs}) must be less than or equal to "
                f"maxNumSeqs ({self.max_num_seqs})"
            )
        return self

    @field_validator("cooldown")
    @classmethod
    def _cooldown_bounded(cls, cooldown: str) -> str:
        if parse_duration_seconds(cooldown) > parse_duration_seconds(MAX_COOLDOWN):
            raise ValueError(f"cooldown {cooldown} is longer than {MAX_COOLDOWN}")
        return cooldown

    @model_validator(mode="after")
    def _weights_fit(self) -> Self:
        if self.model is None or self.gpu is None:
            return self
        share = self.gpu.memory_gib * self.gpu.gpu_memory_utilization
        if self.model.weights_gib >= share:
            raise ValueError(
                f"model.weightsGiB ({self.model.weights_gib:g}) does not fit in the engine's "
                f"share of GPU memory: gpu.memoryGiB ({self.gpu.memory_gib:g}) × "
                f"gpuMemoryUtilization ({self.gpu.gpu_memory_utilization:g}) = {share:g} GiB, "
                "and the KV cache needs room too"
            )
        return self

    @model_validator(mode="after")
    def _shape_known_when_managed(self) -> Self:
        if self.manage_max_num_seqs and (self.model is None or self.gpu is None):
            raise ValueError(
                "manageMaxNumSeqs is true but model and gpu are not both set; "
                "the cache-friendly ceiling needs them"
            )
        return self

    @property
    def cooldown_seconds(self) -> float:
        """The cooldown in seconds."""
        return parse_duration_seconds(self.cooldown)
