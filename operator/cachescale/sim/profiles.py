"""GPU, model and engine profiles for the simulated vLLM replicas.

A profile fixes everything about a replica that the operator does not tune: the model's
KV shape and weight size, the GPU's memory and speed, the tensor-parallel degree, vLLM's
memory fraction, block size and chunked-prefill token budget, and a step-time model.
``--max-num-seqs`` is deliberately *not* part of a profile: it is the knob the operator
turns, so the engine takes it as a constructor argument.

Model shapes come from the Hugging Face ``config.json`` of each model; GPU figures from
NVIDIA's datasheets and ``nvidia-smi``. The step-time coefficients are *calibrations*
derived from those hardware figures with a few efficiency factors chosen to land on
public vLLM benchmark ballparks; they are not measurements (see ``StepTimeModel``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cachescale.capacity import free_kv_bytes, kv_bytes_per_token, num_kv_blocks

MIB = 1024**2

# --- Calibration factors (ballparks, not measurements) ------------------------------
# Fraction of peak HBM bandwidth a decode step achieves. A public vLLM 0.23 sweep of
# Llama-3.1-8B on one A100-40GB measured ~75 tok/s at concurrency 1, "roughly 77% of the
# GPU's memory-bandwidth ceiling" (johnmusgrave.com, "vLLM throughput-latency sweep on
# NVIDIA A100"). That figure already contains scheduler and sampling overheads.
HBM_EFFICIENCY = 0.77
# Model-FLOPs utilisation of prefill (2 × params FLOPs per token). 0.55 puts Llama-3-8B
# on one A100 at ~10.7k prefill tok/s, inside the 8-12k tok/s ballpark that public vLLM
# benchmarks of 8B models on A100 report.
PREFILL_MFU = 0.55
# Per-sequence cost of a decode step on top of its FLOPs: sampling, detokenisation and
# scheduler bookkeeping (tens of microseconds per sequence in vLLM's CPU loop).
DECODE_SEQ_OVERHEAD_S = 20e-6
# Tensor parallelism: two all-reduces per layer (after attention and after the MLP),
# ~15 us each for decode-sized messages over NVLink, and ~10% compute lost to
# communication in prefill.
TP_ALLREDUCE_S = 15e-6
TP_COMPUTE_EFFICIENCY = 0.9


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A model's KV shape and weight size (from its Hugging Face ``config.json``)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    weight_bytes: int
    params: int

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token over the whole model (all shards)."""
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.kv_dtype_bytes)


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """One GPU's memory and peak speeds (dense, no sparsity)."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Wall time of one vLLM engine step, linear in what the step does.

    ``step_s = t_fixed_s + t_prefill_token_s × prefill_tokens
    + t_decode_seq_s × decode_seqs + t_kv_token_s × context_tokens``

    * ``t_fixed_s``: reading the weights once from HBM (a decode step is memory-bound),
      plus tensor-parallel all-reduce latency;
    * ``t_prefill_token_s``: ``2 × params`` FLOPs per prompt token at ``PREFILL_MFU``;
    * ``t_decode_seq_s``: the same FLOPs for the one new token of a decoding sequence,
      plus a per-sequence CPU overhead;
    * ``t_kv_token_s``: reading one token's KV from HBM during decode attention
      (``context_tokens`` = total context length of the decoding sequences).

    The model is additive where real kernels overlap memory and compute (roofline), so
    it slightly overstates mixed steps; attention FLOPs of prefill over a cached prefix
    are ignored. Use ``from_hardware`` to derive the coefficients; the results are
    calibrations to public ballparks, not measurements.
    """

    t_fixed_s: float
    t_prefill_token_s: float
    t_decode_seq_s: float
    t_kv_token_s: float

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: float) -> float:
        """Seconds one engine step takes."""
        return (
            self.t_fixed_s
            + self.t_prefill_token_s * prefill_tokens
            + self.t_decode_seq_s * decode_seqs
            + self.t_kv_token_s * context_tokens
        )

    @classmethod
    def from_hardware(
        cls, model: ModelProfile, gpu: GpuProfile, gpus: int, flops_per_gpu: float
    ) -> StepTimeModel:
        """Derive the coefficients from the model size and the replica's hardware.

        ``flops_per_gpu`` is the dense peak for the weight dtype (bf16 or fp8).
        """
        bandwidth = gpus * gpu.hbm_bytes_per_s * HBM_EFFICIENCY
        tp_eff = 1.0 if gpus == 1 else TP_COMPUTE_EFFICIENCY
        flops = gpus * flops_per_gpu * PREFILL_MFU * tp_eff
        allreduce = 0.0 if gpus == 1 else 2 * model.layers * TP_ALLREDUCE_S
        per_token = 2 * model.params / flops
        return cls(
            t_fixed_s=model.weight_bytes / bandwidth + allreduce,
            t_prefill_token_s=per_token,
            t_decode_seq_s=per_token + DECODE_SEQ_OVERHEAD_S,
            t_kv_token_s=model.kv_bytes_per_token / bandwidth,
        )


@dataclass(frozen=True, slots=True)
class ReplicaProfile:
    """Everything fixed about one vLLM replica: model, GPUs, cache layout, step model."""

    name: str
    model: ModelProfile
    gpu: GpuProfile
    gpus_per_replica: int
    gpu_memory_utilization: float
    block_size: int
    max_num_batched_tokens: int
    step: StepTimeModel
    kv_blocks: int | None = None
    """The pool in usable blocks when a scenario states the engine's block count
    (``num_gpu_blocks`` less the null block); None: computed from the GPU's memory."""

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token over the replica (all tensor-parallel shards)."""
        return self.model.kv_bytes_per_token

    @property
    def gpu_memory_bytes(self) -> int:
        """Total GPU memory of the replica."""
        return self.gpu.memory_bytes * self.gpus_per_replica

    @property
    def free_kv_bytes(self) -> int:
        """``M_free``: memory left for the KV cache after the weights."""
        return free_kv_bytes(
            self.gpu_memory_bytes, self.gpu_memory_utilization, self.model.weight_bytes
        )

    @property
    def num_blocks(self) -> int:
        """Usable KV blocks in the replica's pool: the stated ``kv_blocks``, else what the
        GPU memory left after the weights holds (vLLM would report one more block as
        ``num_gpu_blocks``, its null block)."""
        if self.kv_blocks is not None:
            return self.kv_blocks
        return num_kv_blocks(self.free_kv_bytes, self.kv_bytes_per_token, self.block_size)


NULL_BLOCKS = 1
"""Blocks of vLLM's ``num_gpu_blocks`` its ``BlockPool`` reserves at start: the null block
(the placeholder of skipped attention blocks), which never holds KV."""


def usable_blocks(num_gpu_blocks: int) -> int:
    """The blocks that can hold KV in a vLLM engine of ``num_gpu_blocks`` blocks."""
    return num_gpu_blocks - NULL_BLOCKS


# --- GPUs ---------------------------------------------------------------------------
# Memory: total as reported by nvidia-smi (81920 MiB on A100-SXM4-80GB, 81559 MiB on
# H100 80GB HBM3). Bandwidth and dense tensor-core peaks: NVIDIA A100 datasheet
# (80GB SXM: 2,039 GB/s, BF16 312 TFLOPS) and H100 datasheet (SXM: 3.35 TB/s,
# BF16 989 TFLOPS, FP8 1,979 TFLOPS).
A100_80GB = GpuProfile(
    name="A100-SXM4-80GB",
    memory_bytes=81920 * MIB,
    hbm_bytes_per_s=2.039e12,
    bf16_flops=312e12,
    fp8_flops=None,
)
H100_80GB = GpuProfile(
    name="H100-SXM5-80GB",
    memory_bytes=81559 * MIB,
    hbm_bytes_per_s=3.35e12,
    bf16_flops=989e12,
    fp8_flops=1979e12,
)

# --- Models -------------------------------------------------------------------------
# meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, num_key_value_heads 8,
# hidden_size 4096 / num_attention_heads 32 = head_dim 128; 8.03B params, bf16
# safetensors ~16.06 GB.
LLAMA3_8B = ModelProfile(
    name="Llama-3-8B",
    layers=32,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=2,
    weight_bytes=16_060_000_000,
    params=8_030_000_000,
)
# meta-llama/Meta-Llama-3-70B config.json: 80 layers, 8 KV heads, 8192 / 64 = head_dim
# 128; 70.55B params, bf16 ~141.1 GB.
LLAMA3_70B = ModelProfile(
    name="Llama-3-70B",
    layers=80,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=2,
    weight_bytes=141_100_000_000,
    params=70_550_000_000,
)
# The same model with FP8 weights (e.g. an llm-compressor / Neural Magic FP8 checkpoint):
# linear layers in FP8 (1 byte/param), embeddings and lm_head kept in bf16
# (2 × 128,256 × 8,192 = 2.1B params → 4.2 GB): ~68.4 GB + 4.2 GB ≈ 72.7 GB.
# KV cache stays bf16 (--kv-cache-dtype auto).
LLAMA3_70B_FP8 = ModelProfile(
    name="Llama-3-70B-FP8",
    layers=80,
    kv_heads=8,
    head_dim=128,
    kv_dtype_bytes=2,
    weight_bytes=72_700_000_000,
    params=70_550_000_000,
)
# meta-llama/Llama-2-7b-hf config.json: 32 layers, num_key_value_heads 32 (plain MHA),
# 4096 / 32 = head_dim 128 → 512 KiB of KV per token; 6.74B params, fp16 ~13.48 GB.
LLAMA2_7B = ModelProfile(
    name="Llama-2-7B",
    layers=32,
    kv_heads=32,
    head_dim=128,
    kv_dtype_bytes=2,
    weight_bytes=13_480_000_000,
    params=6_740_000_000,
)

# --- Engine defaults (vLLM V1 CLI flags; docs/signals.md lists the metric names) -------
GPU_MEMORY_UTILIZATION = 0.92  # default since vLLM 0.20.0
BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
BATCHED_TOKENS_A100 = 2048  # OpenAI server default on GPUs other than H100/H200
BATCHED_TOKENS_H100 = 8192  # OpenAI server default on H100/H200


def _engine(
    name: str, model: ModelProfile, gpu: GpuProfile, gpus: int, batched_tokens: int, fp8: bool
) -> ReplicaProfile:
    flops = gpu.fp8_flops if fp8 else gpu.bf16_flops
    if flops is None:
        raise ValueError(f"{gpu.name} has no FP8 tensor cores")
    return ReplicaProfile(
        name=name,
        model=model,
        gpu=gpu,
        gpus_per_replica=gpus,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=batched_tokens,
        step=StepTimeModel.from_hardware(model, gpu, gpus, flops),
    )


PROFILES: dict[str, ReplicaProfile] = {
    p.name: p
    for p in (
        # The published batch-pressure pattern (Llama-3-8B on A100-80GB).
        _engine("llama3-8b-a100", LLAMA3_8B, A100_80GB, 1, BATCHED_TOKENS_A100, fp8=False),
        # A 2-GPU replica of the small model (the incident ran 2-GPU replicas).
        _engine("llama3-8b-a100-tp2", LLAMA3_8B, A100_80GB, 2, BATCHED_TOKENS_A100, fp8=False),
        # The incident profile: 70B fits 2 GPUs usefully only with FP8 weights. In bf16
        # its 141 GB of weights leave ~15 GiB of a 2×80 GB replica for KV (~50k tokens,
        # before activations): no room for a prefix cache. bf16 70B runs on 4 GPUs
        # instead (next profile).
        _engine(
            "llama3-70b-fp8-h100-tp2", LLAMA3_70B_FP8, H100_80GB, 2, BATCHED_TOKENS_H100, fp8=True
        ),
        _engine("llama3-70b-h100-tp4", LLAMA3_70B, H100_80GB, 4, BATCHED_TOKENS_H100, fp8=False),
        # Multi-head attention (32 KV heads, 512 KiB/token): the shape under which the
        # published worked B_max example (≈ 47) holds.
        _engine("llama2-7b-a100", LLAMA2_7B, A100_80GB, 1, BATCHED_TOKENS_A100, fp8=False),
    )
}


def get_profile(name: str) -> ReplicaProfile:
    """Look up an engine profile by name; the error lists the valid names."""
    try:
        return PROFILES[name]
    except KeyError:
        valid = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown engine profile {name!r}; valid profiles: {valid}") from None
