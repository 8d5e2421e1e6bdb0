"""Where and when a benchmark ran: the header each bench prints above its numbers.

A benchmark's output is recorded in ``bench/RESULTS.md`` with the machine and the date,
so that a number can be set beside one measured elsewhere, or later. One home for that
header keeps every recorded run saying the same things in the same words: the date, the
commit (and whether the tree had uncommitted changes), the machine and its CPU model, the
Python, any library the numbers depend on, and the load average when the run started (the
machines are shared).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def provenance(*libraries: str) -> list[str]:
    """The header lines, ``libraries`` (e.g. ``f"numpy {np.__version__}"``) on one line."""
    lines = [
        f"date      {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"commit    {_commit()}",
        f"machine   {platform.platform()} {platform.machine()}, cpu_count={os.cpu_count()}",
        f"cpu       {_cpu_model()}",
        f"python    {platform.python_implementation()} {platform.python_version()}",
    ]
    if libraries:
        lines.append(f"libs      {', '.join(libraries)}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [*lines, f"load avg  {load} (1, 5, 15 min)"]


def _commit() -> str:
    def git(*args: str) -> str:
        command = ["git", "-C", str(ROOT), *args]
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()

    head = git("log", "-1", "--format=%h %s")
    if not head:
        return "unknown (not a git checkout)"
    modified = " (with uncommitted changes)" if git("status", "--porcelain", "--", ".") else ""
    return f"{head[:80]}{modified}"


def _cpu_model() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return platform.processor() or "unknown"
    model = (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    return next(model, platform.processor() or "unknown")
