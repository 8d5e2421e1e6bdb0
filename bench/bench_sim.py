"""Simulator throughput: raw sha256 rate, engine block lookups/s, end-to-end requests/s.

Run from the repository root (about two minutes on a 2-core machine)::

    .venv/bin/python -m bench.bench_sim            # all three measurements
    .venv/bin/python -m bench.bench_sim --no-e2e   # skip the 2-hour default scenario

It prints the machine, the date and three measurements:

1. **Raw hash rate**: ``hashlib.sha256(b).digest()`` calls per second on one 64-byte
   input in a tight loop (best of 5 rounds). This is the ceiling for anything that
   names blocks by sha256: the workload generator makes one such call per full block
   (its input is 96 bytes: the 32-byte parent digest and the block's 64 token bytes).

2. **Engine block lookups/s**. A *block lookup* is one prompt block hash checked against
   a replica's prefix cache: at every admission attempt of a prompt of ``T`` tokens the
   engine checks the ``T // block_size`` full-block hashes of the prompt in one pass (one
   dict probe each: the first-miss walk from block 0 that decides the hit, plus the
   probes past the first miss that decide whether a block already cached is referenced
   or a new one allocated). An attempt that does not fit and is retried on a later step,
   and a re-admission after preemption, look the blocks up again and count again.
   Lookups are counted by a subclass of ``EngineReplica`` (one integer add per attempt).
   *Engine time* is the wall time spent inside ``EngineReplica.advance_to`` and
   ``submit`` (scheduling, admission, eviction, freeing) while a fixed fleet of 16
   replicas of the default scenario's profile serves a pre-generated stream: the default
   scenario's workload for 30 simulated minutes with its perturbation (re-chunk +
   retrieval ahead of the history) moved to minute 15, so that the first half of the
   stream mostly hits the cache and the second half misses it (every admission evicts);
   the two halves are also reported apart. Request
   generation and routing (sticky by prefix group, least loaded within a slack, like
   the fleet's prefix-aware router) are outside engine time. The ratio lookups/s ÷
   raw hash rate is printed; the goal is >= 30%.

3. **End to end**: ``cachescale simulate`` on the default scenario (``rag-rechunk``,
   2 simulated hours, ~230,000 requests), run in-process through the same library call
   the CLI uses; simulated requests per wall second, with the simulation and the report
   (``--json`` rendering) timed apart.

The numbers depend on the machine and on what else it runs (the engine is bound by
memory latency: dict probes on ~300,000 cached hashes); run it on a quiet machine and
compare runs made on the same one. The load average is printed for that reason.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.provenance import provenance
from cachescale.sim.profiles import get_profile
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest
from cachescale.sim.scenario import DEFAULT_SCENARIO, FLEET_EVENTS, load_builtin
from cachescale.sim.traffic import Traffic

STREAM_MINUTES = 30
REPLICAS = 16
ROUTER_SLACK = 8


def raw_hash_rate(calls: int = 1_000_000, rounds: int = 5) -> float:
    """``sha256(64 bytes).digest()`` calls per second, best of ``rounds``."""
    data = bytes(range(64))
    sha256 = hashlib.sha256
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            sha256(data).digest()
        best = max(best, calls / (time.perf_counter() - t0))
    return best


class CountingReplica(EngineReplica):
    """An engine replica that counts its block lookups (prompt blocks per admission)."""

    __slots__ = ("lookups",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.lookups = 0

    def _admit(self, req: SimRequest, generated: int) -> Any:
        self.lookups += (req.prompt_tokens + generated) // self.block_size
        return super()._admit(req, generated)


def engine_lookups() -> dict[str, float]:
    """Drive a fixed fleet on a pre-generated stream; lookups per second of engine time."""
    scenario = load_builtin(DEFAULT_SCENARIO)
    duration = STREAM_MINUTES * 60.0
    perturbations = [
        p.model_copy(update={"at_s": duration / 2})
        for p in scenario.perturbations
        if not isinstance(p, FLEET_EVENTS)
    ]
    t0 = time.perf_counter()
    workload = Traffic(
        scenario.workload, seed=scenario.seed, perturbations=perturbations, until_s=duration
    )
    requests = list(workload)
    generation_s = time.perf_counter() - t0

    profile = get_profile(scenario.fleet.profile)
    engines = [
        CountingReplica(profile, scenario.fleet.max_num_seqs, i, 0.0) for i in range(REPLICAS)
    ]
    affinity: dict[int, int] = {}
    clock = time.perf_counter
    engine_s = 0.0
    half_s = half_lookups = 0.0  # engine time and lookups up to the change
    wall0 = clock()
    for req in requests:
        now = req.arrival_s
        if not half_s and now >= duration / 2:
            half_s, half_lookups = engine_s, sum(e.lookups for e in engines)
        t = clock()
        for engine in engines:
            engine.advance_to(now)
        engine_s += clock() - t
        loads = [e.num_waiting + e.num_running for e in engines]
        least = min(loads)
        pick = affinity.get(req.prefix_group, -1)
        if pick < 0 or loads[pick] > least + ROUTER_SLACK:
            pick = loads.index(least)
        affinity[req.prefix_group] = pick
        t = clock()
        engines[pick].submit(req, now)
        engine_s += clock() - t
    t = clock()
    for engine in engines:
        engine.drain()
    engine_s += clock() - t
    wall_s = clock() - wall0

    lookups = sum(e.lookups for e in engines)
    queried = sum(e.prefix_cache_queries_tokens for e in engines)
    hit = sum(e.prefix_cache_hits_tokens for e in engines)
    return {
        "requests": len(requests),
        "blocks_hashed": workload.stats.blocks_hashed,
        "generation_s": generation_s,
        "lookups": lookups,
        "engine_s": engine_s,
        "before_lookups": half_lookups,
        "before_s": half_s,
        "loop_s": wall_s,
        "evictions": sum(e.evictions_total for e in engines),
        "preemptions": sum(e.num_preemptions_total for e in engines),
        "token_hit_rate": hit / queried if queried else 0.0,
    }


def end_to_end() -> dict[str, float]:
    """The default scenario through ``simulate``, as ``cachescale simulate --json``."""
    from cachescale.commands.simulate import SimulationRequest, simulate

    request = SimulationRequest.from_cli(None, None, "hpa", None, None)
    t0 = time.perf_counter()
    outcome = simulate(request)
    t1 = time.perf_counter()
    outcome.to_json()
    t2 = time.perf_counter()
    routed = 0
    for result in outcome.runs.values():
        routed += len(result.arrivals_s) - len(result.aborted)
    return {"requests": routed, "simulate_s": t1 - t0, "report_s": t2 - t1}


def _timed(label: str, fn: Callable[[], Any]) -> Any:
    print(f"\n{label} ...", flush=True)
    return fn()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-e2e", action="store_true", help="skip the default scenario run")
    args = parser.parse_args()

    print("\n".join(provenance(f"numpy {np.__version__}", ssl.OPENSSL_VERSION)))
    rate = _timed("(1) raw sha256(64 B).digest() in a tight loop", raw_hash_rate)
    print(f"    {rate:,.0f} calls/s ({1e9 / rate:.0f} ns/call)")

    e = _timed(
        f"(2) engine block lookups: {STREAM_MINUTES} min of {DEFAULT_SCENARIO}, "
        f"{REPLICAS} replicas, change at minute {STREAM_MINUTES // 2}",
        engine_lookups,
    )
    lookups_per_s = e["lookups"] / e["engine_s"]
    print(
        f"    stream    {e['requests']:,} requests, {e['blocks_hashed']:,} blocks hashed in "
        f"{e['generation_s']:.1f} s ({e['blocks_hashed'] / e['generation_s']:,.0f} blocks/s)"
    )
    print(
        f"    engine    {e['lookups']:,} block lookups in {e['engine_s']:.2f} s of engine time "
        f"(loop incl. routing {e['loop_s']:.2f} s); token hit rate {e['token_hit_rate']:.3f}, "
        f"{e['evictions']:,} evictions, {e['preemptions']:,} preemptions"
    )
    print(f"    lookups/s {lookups_per_s:,.0f}  ({1e9 / lookups_per_s:.0f} ns/lookup, all-in)")
    after_lookups = e["lookups"] - e["before_lookups"]
    after_s = e["engine_s"] - e["before_s"]
    print(
        f"              before the change {e['before_lookups'] / e['before_s']:,.0f}/s, "
        f"after it {after_lookups / after_s:,.0f}/s (every admission evicts)"
    )
    print(f"    ratio     lookups/s / raw hash rate = {lookups_per_s / rate:.1%} (goal >= 30%)")

    if not args.no_e2e:
        r = _timed(f"(3) end to end: simulate {DEFAULT_SCENARIO} (2 simulated hours)", end_to_end)
        total = r["simulate_s"] + r["report_s"]
        print(
            f"    {r['requests']:,} requests: simulate {r['simulate_s']:.1f} s + report "
            f"{r['report_s']:.1f} s = {total:.1f} s"
        )
        print(
            f"    {r['requests'] / r['simulate_s']:,.0f} simulated requests/s "
            f"({r['requests'] / total:,.0f}/s with the report)"
        )
    print(f"\nload avg  {' '.join(f'{x:.2f}' for x in os.getloadavg())} (after)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
