"""Measure a real vLLM's step times once and print the scenario's ``fleet.engine.step``.

``python -m referee.calibrate_steps [--blocks N]`` (with ``flock /tmp/vllm.lock`` when
another vLLM may run) starts one server as check 4 does (torch on one thread, block size 32,
``--max-num-seqs 16``, a pool large enough that nothing is evicted or preempted) and reads
vLLM's own engine-side histograms, so HTTP and the clients are not in the figures:

- *prefill*: requests sent one at a time, fresh random prompts of 64 to 896 tokens (no
  prefix hit), ``max_tokens`` 1: the mean of ``vllm:request_prefill_time_seconds`` at each
  length is one step that computes the whole prompt; a line through them gives
  ``t_prefill_token_s`` (slope);
- *decode*: 1, 4 and 16 requests at once with short fresh prompts, and one with a long
  prompt, 96 tokens each, each batch sent three times (the median kept): the mean of
  ``vllm:inter_token_latency_seconds`` is a decode step of that many sequences at that
  context; a least-squares fit of
  ``t_fixed_s + t_decode_seq_s × seqs + t_kv_token_s × seqs × context`` gives the rest.

The simulator's step model is additive and its coefficients non-negative, so a negative
fit is clipped to 0. The figures of the run that set ``referee/engine-model.yaml`` are in
docs/design/real-vllm-engine-model.md.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from cachescale.audit.live import parse_samples
from referee.engine_model import run_engine
from referee.vllm import EngineSettings, VllmServer

PREFILL_LENGTHS = (64, 256, 512, 896)
DECODE_BATCHES = ((1, 64), (4, 64), (16, 64), (1, 896))
"""(sequences at once, prompt tokens) of each decode measurement."""
DECODE_TOKENS = 96
REPEATS = 3
"""Each decode measurement is taken this often; the median is kept (a slow first step, a
burst of other work on the machine)."""


def _mean(server: VllmServer, family: str, send: list[tuple[list[int], int]]) -> float:
    """Send ``send`` at once; the mean of ``family``'s increase over them."""

    def totals() -> tuple[float, float]:
        samples = parse_samples(server.metrics())
        total = sum(v for name, _, v in samples if name == f"{family}_sum")
        count = sum(v for name, _, v in samples if name == f"{family}_count")
        return total, count

    before = totals()
    with ThreadPoolExecutor(len(send)) as pool:
        list(pool.map(lambda turn: server.complete(turn[0], turn[1]), send))
    after = totals()
    return (after[0] - before[0]) / max(after[1] - before[1], 1.0)


def measure(server: VllmServer, rng: random.Random) -> dict[str, float]:
    """Fit the step-time coefficients on ``server``; print the means they come from."""

    def prompt(n: int) -> list[int]:
        return [rng.randint(3, 499) for _ in range(n)]

    prefill = []
    for length in PREFILL_LENGTHS:
        means = [
            _mean(server, "vllm:request_prefill_time_seconds", [(prompt(length), 1)])
            for _ in range(REPEATS * 2)
        ]
        prefill.append(float(np.median(means)))
        print(f"prefill {length:4d} tokens: {prefill[-1] * 1e3:.2f} ms")
    slope, intercept = np.polyfit(PREFILL_LENGTHS, prefill, 1)
    rows, itl = [], []
    for seqs, length in DECODE_BATCHES:
        means = [
            _mean(
                server,
                "vllm:inter_token_latency_seconds",
                [(prompt(length), DECODE_TOKENS) for _ in range(seqs)],
            )
            for _ in range(REPEATS)
        ]
        itl.append(float(np.median(means)))
        context = length + DECODE_TOKENS / 2
        rows.append([1.0, seqs, seqs * context])
        print(f"decode {seqs:2d} seqs at {context:.0f} tokens: {itl[-1] * 1e3:.2f} ms")
    fixed, per_seq, per_kv = np.linalg.lstsq(np.array(rows), np.array(itl), rcond=None)[0]
    print(f"prefill line intercept {intercept * 1e3:.2f} ms (a step's fixed part)")
    return {
        "t_fixed_s": float(max(fixed, 1e-4)),
        "t_prefill_token_s": float(max(slope, 0.0)),
        "t_decode_seq_s": float(max(per_seq, 0.0)),
        "t_kv_token_s": float(max(per_kv, 0.0)),
    }


def main() -> None:
    """Start the server, measure, print the ``step`` section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1024, help="--num-gpu-blocks-override")
    args = parser.parse_args()
    settings = EngineSettings(block_size=32, num_blocks=args.blocks, max_num_seqs=16)
    with tempfile.TemporaryDirectory() as folder, run_engine(Path(folder), settings) as server:
        for _ in range(2):  # warm-up: the first steps of each shape are slow
            _mean(server, "vllm:inter_token_latency_seconds", [([5] * 40, 32)] * 16)
        coefficients = measure(server, random.Random(61))
    print("step:")
    for name, value in coefficients.items():
        print(f"  {name}: {value:.3g}")


if __name__ == "__main__":
    main()
