"""Simulator throughput beside the raw cost of the hash it is built on.

Prints, from one run on one machine:

1. raw ``hashlib.sha256(96 bytes).digest()`` calls per second — one vLLM-style block
   hash input: a 32-byte parent digest and 16 int32 token ids;
2. block lookups per second inside the engine — a *block lookup* is one prompt block hash
   checked against a replica's prefix cache at admission (the first-miss walk); measured
   over engine time only, on a request stream generated beforehand;
3. simulated requests per second, end to end, for the default scenario (rag-rechunk:
   2 simulated hours, ~32 req/s, 10–20 replicas), and its wall time;

and the ratio lookups/s ÷ raw hash calls/s (the project's goal: at least 0.30).
Run with ``.venv/bin/python bench/bench_sim.py``; results are recorded in RESULTS.md.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import time

from cachescale.sim.engine import EngineReplica
from cachescale.sim.profiles import get_profile
from cachescale.sim.scenario import load_builtin
from cachescale.sim.simulate import SimulationRequest, simulate
from cachescale.sim.workload import Workload

HASH_CALLS = 2_000_000
ENGINE_STREAM_S = 1800.0


def raw_sha256_per_s() -> float:
    """Tight-loop sha256 calls per second on a 96-byte input."""
    data = bytes(range(96))
    sha256 = hashlib.sha256
    start = time.perf_counter()
    for _ in range(HASH_CALLS):
        sha256(data).digest()
    return HASH_CALLS / (time.perf_counter() - start)


def engine_lookups_per_s() -> tuple[float, int]:
    """Prompt-block cache lookups per second of engine time, on one replica."""
    scenario = load_builtin("rag-rechunk")
    workload = scenario.workload.model_copy(update={"rate_per_s": 4.0})
    stream = list(Workload(workload, seed=scenario.seed, until_s=ENGINE_STREAM_S))
    profile = get_profile(scenario.fleet.profile)
    engine = EngineReplica(profile, scenario.fleet.max_num_seqs, 0, 0.0)
    lookups = sum(r.prompt_tokens // profile.block_size for r in stream)
    start = time.perf_counter()
    for request in stream:
        engine.advance_to(request.arrival_s)
        engine.submit(request, request.arrival_s)
    engine.advance_to(ENGINE_STREAM_S + 600.0)
    return lookups / (time.perf_counter() - start), lookups


def default_scenario() -> tuple[float, int, float]:
    """Wall seconds, requests finished and requests/s for the default scenario."""
    scenario = load_builtin("rag-rechunk")
    start = time.perf_counter()
    outcome = simulate(SimulationRequest(scenario, ("hpa",)))
    wall = time.perf_counter() - start
    finished = len(outcome.runs["hpa"].finished)
    return wall, finished, finished / wall


def main() -> None:
    """Measure and print."""
    print(f"date: {datetime.date.today().isoformat()}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, {platform.platform()}")
    print(f"python: {platform.python_version()}")
    raw = raw_sha256_per_s()
    print(f"raw sha256 calls/s (96-byte input):  {raw:,.0f}")
    lookups, count = engine_lookups_per_s()
    print(f"engine block lookups/s:              {lookups:,.0f}  ({count:,} lookups)")
    print(f"lookups/s ÷ raw sha256 calls/s:      {lookups / raw:.2f}  (goal ≥ 0.30)")
    wall, finished, rate = default_scenario()
    print(
        f"default scenario (rag-rechunk, 2 h): {wall:.1f} s wall, {finished:,} requests, "
        f"{rate:,.0f} simulated requests/s"
    )


if __name__ == "__main__":
    main()
