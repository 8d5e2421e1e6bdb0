"""A scenario's engine, stated as vLLM is started: the ``fleet.engine`` part of a scenario.

A fleet's ``profile`` derives everything about a replica from a GPU and a model: its pool
from the memory the weights leave, its step times from the hardware's speeds, block size
16. ``fleet.engine`` states any of that as the flags of a real vLLM server instead:
``--block-size``, ``--num-gpu-blocks-override``, ``--max-model-len``,
``--max-num-batched-tokens`` and measured step-time coefficients, so a scenario can describe
an engine that was actually run (the referee suite holds one against real vLLM).

``num_gpu_blocks`` is what vLLM reports in ``vllm:cache_config_info``; its ``BlockPool``
reserves one of them as the null block, so the simulated pool holds
:func:`~cachescale.sim.profiles.usable_blocks` of them. A profile's computed pool is
already a count of usable blocks.

``max_model_len`` bounds every request (prompt plus output), as vLLM refuses longer ones:
conversations are capped below it (:mod:`cachescale.sim.clients`,
:mod:`cachescale.sim.context_cap`), and, as vLLM refuses to start otherwise, the usable
pool must hold one request that long. Unstated, it is the emulator's
:data:`~cachescale.sim.metrics.MAX_MODEL_LEN_TOKENS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from cachescale.sim.metrics import MAX_MODEL_LEN_TOKENS
from cachescale.sim.profiles import ReplicaProfile, StepTimeModel, usable_blocks
from cachescale.sim.traffic_spec import (
    ChunkSizeChange,
    LayoutChange,
    Perturbation,
    RetrievalAheadOfHistory,
    WorkloadSpec,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepSpec(_Model):
    """Step-time coefficients (``sim.profiles.StepTimeModel``), e.g. measured on the engine:
    ``step_s = t_fixed_s + t_prefill_token_s × prefill tokens + t_decode_seq_s × decoding
    sequences + t_kv_token_s × their context tokens``."""

    t_fixed_s: float = Field(gt=0, description="Seconds every step takes.")
    t_prefill_token_s: float = Field(ge=0, description="Seconds per prompt token computed.")
    t_decode_seq_s: float = Field(ge=0, description="Seconds per decoding sequence.")
    t_kv_token_s: float = Field(
        default=0.0, ge=0, description="Seconds per context token of the decoding sequences."
    )

    def model(self) -> StepTimeModel:
        """The coefficients as the engine reads them."""
        return StepTimeModel(
            t_fixed_s=self.t_fixed_s,
            t_prefill_token_s=self.t_prefill_token_s,
            t_decode_seq_s=self.t_decode_seq_s,
            t_kv_token_s=self.t_kv_token_s,
        )


class EngineSpec(_Model):
    """vLLM's own settings for every pod, overriding what the profile derives; each
    optional (unset: the profile's)."""

    block_size: int | None = Field(
        default=None, ge=1, le=1024, description="--block-size: tokens per KV block."
    )
    num_gpu_blocks: int | None = Field(
        default=None,
        ge=2,
        le=100_000_000,
        description="--num-gpu-blocks-override: KV blocks as vLLM reports them; one is "
        "vLLM's null block, so the pool holds one fewer.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=2,
        le=10_000_000,
        description="--max-model-len: the longest request (prompt + output) in tokens.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="--max-num-batched-tokens: a step's token budget."
    )
    step: StepSpec | None = Field(default=None, description="Step-time coefficients.")


def engine_profile(profile: ReplicaProfile, engine: EngineSpec | None) -> ReplicaProfile:
    """``profile`` with what ``engine`` states in place of what the profile derives."""
    if engine is None:
        return profile
    return replace(
        profile,
        block_size=engine.block_size or profile.block_size,
        kv_blocks=None if engine.num_gpu_blocks is None else usable_blocks(engine.num_gpu_blocks),
        max_num_batched_tokens=engine.max_num_batched_tokens or profile.max_num_batched_tokens,
        step=profile.step if engine.step is None else engine.step.model(),
    )


def max_model_len(engine: EngineSpec | None) -> int:
    """The longest request the engine takes."""
    if engine is None or engine.max_model_len is None:
        return MAX_MODEL_LEN_TOKENS
    return engine.max_model_len


def longest_turn_tokens(spec: WorkloadSpec, perturbations: Sequence[Perturbation]) -> int:
    """Tokens of the longest request the workload can make without any history: every
    segment some layout in force has, at its largest, and the longest output."""
    kinds = set(spec.layout)
    chunk = spec.retrieval.chunk_size
    for p in perturbations:
        if isinstance(p, LayoutChange):
            kinds.update(p.layout)
        elif isinstance(p, RetrievalAheadOfHistory):
            kinds.add("docs")
        elif isinstance(p, ChunkSizeChange):
            chunk = max(chunk, p.chunk_size)
    sizes = {
        "tools": spec.tools.count * spec.tools.tokens_each,
        "system": spec.system_tokens,
        "docs": spec.retrieval.top_k * chunk,
        "user": spec.user_tokens.max_tokens,
        "variable": spec.variable_tokens,
    }
    return sum(sizes.get(kind, 0) for kind in kinds) + spec.output_tokens.max_tokens
