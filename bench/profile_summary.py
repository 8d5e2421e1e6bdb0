"""Ranks the functions of a py-spy profile: ``bench_fleet --profile FILE``'s collapsed stacks.

    .venv/bin/python -m bench.profile_summary FILE [--top 25]

FILE holds py-spy's ``--format raw`` output: one line per distinct stack, its frames
(outermost first, each ``function (path:line)``) joined by ``;``, then a space and the
number of samples that caught it. A function is named ``path:function``, its line dropped
and its path cut to the part below the installed packages' folder
(``kopf/_core/reactor/queueing.py``). Two rankings, each in percent of all samples: by self
samples (the function was running, the innermost frame) and by inclusive samples (the
function was on the stack; a function counts once per sample however deep it recurses).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
PACKAGES = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python\d+\.\d+)/")


def function_of(frame: str) -> str:
    """``path:function`` of one py-spy frame (a frame not in that shape, as it is)."""
    match = FRAME.match(frame)
    if match is None:
        return frame
    return f"{PACKAGES.sub('', match['path'])}:{match['function']}"


@dataclass
class Profile:
    """Sample counts per function: innermost (``own``) and anywhere on the stack."""

    total: int = 0
    own: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    inclusive: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))

    def add(self, stack: str, samples: int) -> None:
        functions = [function_of(frame) for frame in stack.split(";")]
        self.total += samples
        self.own[functions[-1]] += samples
        for function in set(functions):
            self.inclusive[function] += samples


def read(lines: Iterable[str]) -> Profile:
    profile = Profile()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack:
            profile.add(stack, int(count))
    return profile


def ranking(title: str, profile: Profile, by: Mapping[str, int], top: int) -> list[str]:
    """The ``top`` functions by ``by``, each with its self and inclusive percentages."""
    rows = [f"top {top} by {title}", f"{'self %':>7} {'incl %':>7}  function"]
    for function, _ in sorted(by.items(), key=lambda kv: -kv[1])[:top]:
        own = 100 * profile.own.get(function, 0) / profile.total
        inclusive = 100 * profile.inclusive[function] / profile.total
        rows.append(f"{own:7.1f} {inclusive:7.1f}  {function}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="py-spy --format raw output")
    parser.add_argument("--top", type=int, default=25, help="functions in each ranking")
    args = parser.parse_args(argv)
    with args.file.open(encoding="utf-8") as lines:
        profile = read(lines)
    if not profile.total:
        parser.error(f"{args.file}: no samples")
    print(f"{args.file}: {profile.total:,} samples")
    for title, by in (("self samples", profile.own), ("inclusive samples", profile.inclusive)):
        print("", *ranking(title, profile, by, args.top), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
