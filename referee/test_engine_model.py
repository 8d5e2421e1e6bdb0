"""Check 4: the simulator's engine model against real vLLM, swept over ``--max-num-seqs``.

``referee/engine-model.yaml`` states one engine as the referee suite starts it (block size
32, 64 blocks of which one is vLLM's null block, max-model-len 1024, the step times
measured once by ``referee/calibrate_steps.py``) and 20 closed-loop chat clients. For
each ``--max-num-seqs`` of its sweep, one real vLLM server is started with those settings
(its torch on one thread, ``referee.engine_model.run_engine``) and the scenario's clients
drive it for ``LOAD_S`` seconds (``referee/engine_model.py``); the simulator runs the same
scenario at that setting, and its first answers, as many as real vLLM gave, are compared
(the same point of every conversation, however fast the machine ran). The pool is small, so
conversations evict each other and, once several long prompts run at once, vLLM preempts.

Per setting: the token hit rate within ``HIT_RATE_TOLERANCE`` of real vLLM's; preemptions
in the same places (none at the small batch ceilings, some at the large ones); TTFT moving
the same way as the batch ceiling grows. The figures of a run are in
docs/design/real-vllm-engine-model.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cachescale.sim.drive import run
from cachescale.sim.scenario import Scenario, load_file
from referee.engine_model import Measured, drive_real, measure_sim, run_engine
from referee.vllm import EngineSettings

SCENARIO = Path(__file__).with_name("engine-model.yaml")
LOAD_S = 12.0
"""Seconds of real load per setting."""
SIM_SPAN = 3.0
"""The simulated run lasts this many times ``LOAD_S``: enough to answer as many requests as
real vLLM did on a machine that ran it faster than the step times say."""
HIT_RATE_TOLERANCE = 0.02
WARM_UP = [2] * 40
"""A first request of special token ids no client sends: it shares no block with them."""


@dataclass(frozen=True)
class Point:
    """One ``--max-num-seqs``: what real vLLM and the simulator did."""

    max_num_seqs: int
    real: Measured
    sim: Measured


def _settings(scenario: Scenario, max_num_seqs: int) -> EngineSettings:
    engine = scenario.fleet.engine
    assert engine is not None
    assert engine.block_size
    assert engine.num_gpu_blocks
    assert engine.max_model_len is not None
    return EngineSettings(
        block_size=engine.block_size,
        num_blocks=engine.num_gpu_blocks,
        max_num_seqs=max_num_seqs,
        max_model_len=engine.max_model_len,
    )


def _simulated(scenario: Scenario, max_num_seqs: int, real: Measured) -> Measured:
    fleet = scenario.fleet.model_copy(update={"max_num_seqs": max_num_seqs})
    span = LOAD_S * SIM_SPAN
    point = scenario.model_copy(update={"fleet": fleet, "duration_s": span, "sweep": None})
    bounds = [bound for bound, _ in real.ttft_buckets]
    return measure_sim(run(point, autoscaler=None), bounds, real.requests)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> list[Point]:
    """Each setting on a fresh real server, then in the simulator."""
    scenario = load_file(SCENARIO)
    assert scenario.sweep is not None
    points = []
    started = time.monotonic()
    for seqs in scenario.sweep.max_num_seqs:
        folder = tmp_path_factory.mktemp(f"vllm-{seqs}")
        with run_engine(folder, _settings(scenario, seqs)) as server:
            server.complete(WARM_UP, 4)
            real = drive_real(server, scenario, LOAD_S)
        points.append(Point(seqs, real, _simulated(scenario, seqs, real)))
    print(f"\nengine model, {time.monotonic() - started:.0f} s: {_table(points)}")
    return points


def _table(points: list[Point]) -> str:
    """What each setting did, real | sim: printed with the run and quoted by a failure."""
    lines = ["max_num_seqs, then real | sim"]
    for p in points:
        lines.append(
            f"  {p.max_num_seqs:3d}  hit {p.real.hit_rate:.4f} | {p.sim.hit_rate:.4f}"
            f"  preemptions {p.real.preemptions} | {p.sim.preemptions}"
            f"  ttft p50 {p.real.ttft(0.5):.3f} | {p.sim.ttft(0.5):.3f}"
            f"  p95 {p.real.ttft(0.95):.3f} | {p.sim.ttft(0.95):.3f}"
            f"  itl {p.real.itl_s * 1e3:.1f} | {p.sim.itl_s * 1e3:.1f} ms"
            f"  requests {p.real.requests} | {p.sim.requests}"
            f"  real: {p.real.steps} steps in {p.real.seconds:.1f} s,"
            f" {p.real.prompt_tokens - p.real.cached_tokens} prompt tokens computed"
        )
    return "\n".join(lines)


def test_real_vllm_served_every_request(sweep: list[Point]) -> None:
    for point in sweep:
        assert point.real.failures == []
        assert point.real.requests > 0
        assert point.sim.requests == point.real.requests, _table(sweep)


def test_hit_rate_per_setting(sweep: list[Point]) -> None:
    for point in sweep:
        assert 0 < point.real.hit_rate < 1
        assert point.sim.hit_rate == pytest.approx(point.real.hit_rate, abs=HIT_RATE_TOLERANCE), (
            _table(sweep)
        )


def test_preemptions_in_the_same_places(sweep: list[Point]) -> None:
    real = [point.real.preemptions > 0 for point in sweep]
    assert [point.sim.preemptions > 0 for point in sweep] == real, _table(sweep)
    assert not real[0]
    assert real[-1]


@pytest.mark.parametrize("q", [0.5, 0.95])
def test_ttft_moves_the_same_way(sweep: list[Point], q: float) -> None:
    """From the smallest batch ceiling to the largest, TTFT falls (or rises) on both."""
    first, last = sweep[0], sweep[-1]
    real = last.real.ttft(q) - first.real.ttft(q)
    sim = last.sim.ttft(q) - first.sim.ttft(q)
    assert not math.isnan(real)
    assert not math.isnan(sim)
    assert math.copysign(1, real) == math.copysign(1, sim), _table(sweep)
