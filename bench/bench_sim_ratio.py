"""The simulator's speed against sha256's, the ratio its speed goal is stated in, in one run.

Run from the repository root (about two minutes on a 2-core machine)::

    .venv/bin/python -m bench.bench_sim_ratio
    .venv/bin/python -m bench.bench_sim_ratio --src ../other-checkout   # time another tree

It prints the machine and the date, then:

1. **Reference**: the wall time of 10 M ``hashlib.sha256(b).digest()`` calls on one
   64-byte input in a tight loop, measured once before and once after the simulation
   (the machines are shared: two readings bracket the run).
2. **Simulation**: the wall time of ``cachescale simulate --scenario rag-rechunk
   --autoscaler both --seed 7 --json`` as a user runs it (a fresh interpreter, imports
   and report included), and the sha256 of the JSON it printed, to set beside a saved
   answer (``scripts/sim_fingerprints.py``).
3. **Ratio**: simulation ÷ the mean of the two references. The goal: at most 12.

A ratio is steadier than either time across machines and loads, but both still move with
what else the machine runs: compare ratios made back to back on the same machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

from bench.provenance import ROOT, provenance

REFERENCE_CALLS = 10_000_000
GOAL_RATIO = 12.0
_MAIN = "import sys; from cachescale.commands.main import main; sys.exit(main())"


def reference_s(calls: int = REFERENCE_CALLS) -> float:
    """Wall seconds of ``calls`` ``sha256(64 bytes).digest()`` calls in a tight loop."""
    data = bytes(range(64))
    sha256 = hashlib.sha256
    t0 = time.perf_counter()
    for _ in range(calls):
        sha256(data).digest()
    return time.perf_counter() - t0


def simulate_s(src: Path, scenario: str, seed: int) -> tuple[float, str]:
    """Wall seconds of ``cachescale simulate --autoscaler both --json`` on the checkout at
    ``src``, and the sha256 of what it printed."""
    command = [
        sys.executable, "-c", _MAIN, "simulate", "--scenario", scenario,
        "--autoscaler", "both", "--seed", str(seed), "--json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(src / "operator")}
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env=env, check=True)
    elapsed = time.perf_counter() - t0
    return elapsed, hashlib.sha256(done.stdout).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=ROOT, help="checkout to time (default: this)")
    parser.add_argument("--scenario", default="rag-rechunk", help="built-in scenario")
    parser.add_argument("--seed", type=int, default=7, help="seed (default: 7)")
    args = parser.parse_args()

    print("\n".join(provenance(ssl.OPENSSL_VERSION)))
    print(f"source    {args.src.resolve()}")
    before = reference_s()
    print(f"(1) reference: 10 M sha256(64 B).digest()   {before:.2f} s (before)", flush=True)
    sim, digest = simulate_s(args.src.resolve(), args.scenario, args.seed)
    after = reference_s()
    print(f"                                            {after:.2f} s (after)")
    print(
        f"(2) simulate --scenario {args.scenario} --autoscaler both --seed {args.seed} "
        f"--json   {sim:.1f} s (JSON sha256 {digest[:16]})"
    )
    ratio = sim / ((before + after) / 2)
    verdict = "met" if ratio <= GOAL_RATIO else "not met"
    print(f"(3) ratio simulate / reference              {ratio:.1f}x (goal <= 12: {verdict})")
    print(f"load avg  {' '.join(f'{x:.2f}' for x in os.getloadavg())} (after)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
