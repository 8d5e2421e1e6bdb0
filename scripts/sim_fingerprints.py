"""Run every built-in scenario with ``--autoscaler both --json`` and keep each answer, so a
change meant to preserve behaviour can be checked byte for byte against a saved run.

    python scripts/sim_fingerprints.py --out runs/after                 # this checkout
    python scripts/sim_fingerprints.py --src ../old --out runs/before   # another checkout
    python scripts/sim_fingerprints.py --compare runs/before runs/after

A run already saved in ``--out`` is not repeated, so an interrupted sweep resumes. The
comparison prints one line per scenario and seed and exits 1 when any answer differs or
is missing on one side.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def scenarios(src: Path) -> list[str]:
    """The built-in scenario names of the checkout at ``src``."""
    folder = src / "operator" / "cachescale" / "sim" / "scenarios"
    return sorted(path.stem for path in folder.glob("*.yaml"))


def run_one(src: Path, out: Path, scenario: str, seed: int) -> str:
    """Simulate one scenario at one seed into ``out`` (unless saved); its status line."""
    target = out / f"{scenario}-{seed}.json"
    if target.is_file():
        return f"{target.name}: saved"
    command = [
        sys.executable, "-c",
        "import sys; from cachescale.cli import main; sys.exit(main())"
        if (src / "operator" / "cachescale" / "cli.py").is_file()
        else "import sys; from cachescale.commands.main import main; sys.exit(main())",
        "simulate", "--scenario", scenario, "--autoscaler", "both", "--seed", str(seed), "--json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(src / "operator")}
    done = subprocess.run(command, capture_output=True, env=env, check=False)
    if done.returncode != 0:
        return f"{target.name}: exit {done.returncode}: {done.stderr.decode()[-400:]}"
    partial = target.with_suffix(".part")
    partial.write_bytes(done.stdout)
    partial.rename(target)
    return f"{target.name}: {hashlib.sha256(done.stdout).hexdigest()[:16]}"


def sweep(src: Path, out: Path, seeds: list[int], jobs: int) -> int:
    """Every scenario at every seed; 1 when any run failed."""
    out.mkdir(parents=True, exist_ok=True)
    work = [(name, seed) for name in scenarios(src) for seed in seeds]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        lines = list(pool.map(lambda item: run_one(src, out, *item), work))
    for line in lines:
        print(line)
    return int(any(": exit " in line for line in lines))


def compare(before: Path, after: Path) -> int:
    """One line per saved answer; 1 when any differs or is on one side only."""
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    differ = 0
    for name in names:
        a, b = before / name, after / name
        if not (a.is_file() and b.is_file()):
            print(f"{name}: missing in {before if not a.is_file() else after}")
            differ += 1
        elif a.read_bytes() != b.read_bytes():
            print(f"{name}: DIFFERENT")
            differ += 1
        else:
            print(f"{name}: identical ({hashlib.sha256(a.read_bytes()).hexdigest()[:16]})")
    print(f"{len(names) - differ} of {len(names)} identical")
    return int(differ > 0)


def main() -> int:
    """Sweep into ``--out``, or ``--compare`` two saved sweeps."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=REPO, help="checkout to run (default: this)")
    parser.add_argument("--out", type=Path, help="folder for the answers")
    parser.add_argument("--seeds", default="7,11", help="comma-separated seeds (default: 7,11)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default: 1)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out or --compare is required")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    return sweep(args.src.resolve(), args.out, seeds, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
