"""What ``bench_fleet`` counts in a run: the operators' evaluations read off their
``/metrics`` (one operator, or a shard each), each component's counters at a moment
(:class:`Snapshot`), the window arithmetic (lateness, missed intervals, deltas per
interval), py-spy over the steady window, and what one run measured (:class:`Run`).
``fleet_rig.py`` builds the fleet, ``fleet_report.py`` renders what is counted here.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import math
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_proxy import SlowProxy
from bench.fleet_rig import Kube, Rollout, api_requests, cpu_s, prometheus_requests
from bench.fleet_shape import Shape

INTERVAL_S = 30.0


POLL_S = 15.0


PER_POLICY = ("policy", "namespace")
"""Labels summed over in the operator's own counters."""


WANTED = (
    "cachescale_last_evaluation_timestamp_seconds",
    "cachescale_evaluation_lateness_seconds",
    "cachescale_evaluation_missed",
    "cachescale_kube",
    "cachescale_evaluation_errors_total",
    "cachescale_decisions_total",
)
"""The series of the operator's /metrics the bench reads; the rest (a policy's signals,
dozens of series each) is dropped before parsing, so a read keeps pace at 3,000 policies."""


class Evaluations:
    """The operators' /metrics (one URL per operator process: one, or a shard each), read
    every :data:`POLL_S`: each policy's evaluation times (by ``namespace/name``; shards
    serve disjoint policies), each process's own counters (``by_process``) and their sum
    (``counters``).
    Two evaluations of a policy between two reads count as one, so each read's start is
    kept (``reads``) to show the longest gap between reads beside the counts."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.by_process: list[dict[str, float]] = [{} for _ in self.urls]
        self.reads: list[float] = []

    @property
    def counters(self) -> dict[str, float]:
        total: dict[str, float] = collections.defaultdict(float)
        for counters in self.by_process:
            for key, value in counters.items():
                total[key] += value
        return dict(total)

    def poll(self) -> None:
        self.reads.append(time.time())
        self.by_process = [self.read(url) for url in self.urls]

    def read(self, url: str) -> dict[str, float]:
        """One process's /metrics: its evaluation times into ``times``; its counters."""
        with urllib.request.urlopen(url, timeout=60) as answer:
            text = answer.read().decode()
        wanted = "\n".join(line for line in text.splitlines() if line.startswith(WANTED))
        counters: dict[str, float] = collections.defaultdict(float)
        for family in text_string_to_metric_families(wanted + "\n"):
            for sample in family.samples:
                if sample.name == "cachescale_last_evaluation_timestamp_seconds":
                    seen = self.times[f"{sample.labels['namespace']}/{sample.labels['policy']}"]
                    if not seen or seen[-1] != sample.value:
                        seen.append(sample.value)
                elif not sample.name.endswith("_created"):
                    key = sample.name + json.dumps(
                        {k: v for k, v in sample.labels.items() if k not in PER_POLICY},
                        sort_keys=True,
                    )
                    counters[key] += sample.value
        return dict(counters)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time between two reads that started in [start, end]."""
        inside = [t for t in self.reads if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(inside)), default=math.nan)


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def schedule(
    times: Mapping[str, list[float]],
    names: Sequence[str],
    start: float,
    end: float,
    interval: float,
) -> tuple[list[float], int, int]:
    """Lateness of each evaluation in [start, end], intervals missed, evaluations counted.

    Lateness is the gap since the policy's previous evaluation minus the interval; a gap
    (the one still open at ``end`` included) of more than 1.5 intervals misses the
    intervals it spans beyond the first.
    """
    lateness: list[float] = []
    missed = counted = 0
    for name in names:
        seen = [t for t in times.get(name, []) if t <= end]
        inside = [t for t in seen if t >= start]
        counted += len(inside)
        edges = [t for t in seen if t < start][-1:] + inside
        if not edges:
            missed += round((end - start) / interval)
            continue
        for previous, following in itertools.pairwise([*edges, end]):
            gap = following - previous
            if following != end:
                lateness.append(max(0.0, gap - interval))
            if gap > 1.5 * interval:
                missed += math.floor(gap / interval + 0.5) - 1
    return lateness, missed, counted


PROFILE_RATE = 100
"""py-spy's samples per second."""


@contextlib.contextmanager
def profiled(out: Path | None, pid: int, seconds: float, log: Path) -> Iterator[None]:
    """py-spy samples the thread holding the GIL in process ``pid`` from now for
    ``seconds`` into ``out`` (collapsed stacks); its output goes to ``log``. On the way
    out, waits until it wrote ``out`` and raises if it failed. ``out`` None: nothing is
    sampled."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("--profile: no py-spy (pip install -e '.[dev]')")
    duration = math.ceil(seconds)
    command = [
        spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(PROFILE_RATE),
        "--duration", str(duration), "--gil", "--output", str(out),
    ]  # fmt: skip
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT)
    try:
        yield
        process.wait(timeout=duration + 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"py-spy failed ({process.returncode}):\n{log.read_text()[-2000:]}")


@dataclass
class Snapshot:
    """Every counter at one moment."""

    at: float
    prometheus: dict[str, float]
    api: dict[str, float]
    cpu: dict[str, float]
    own: dict[str, float]
    """The operators' own counters, summed over the processes."""
    load: str
    bench: dict[str, float]
    """The API requests the bench itself sent so far (its pod restarts), as ``api``."""
    shards: list[dict[str, float]] = field(default_factory=list)
    """Each operator process's own counters, as ``own``."""
    proxy: dict[str, float] = field(default_factory=dict)
    """The slow proxy's requests so far (``SlowProxy.snapshot``)."""


def snapshot(
    prom_port: int,
    kube: Kube,
    pids: Mapping[str, int],
    evaluations: Evaluations,
    rollout: Rollout | None = None,
    proxy: SlowProxy | None = None,
) -> Snapshot:
    return Snapshot(
        at=time.time(),
        prometheus=prometheus_requests(prom_port),
        api=api_requests(kube),
        cpu={name: cpu_s(pid) for name, pid in pids.items()},
        own=evaluations.counters,
        load=Path("/proc/loadavg").read_text(encoding="ascii").split()[0],
        bench=dict(rollout.sent) if rollout is not None else {},
        shards=[dict(counters) for counters in evaluations.by_process],
        proxy=proxy.snapshot() if proxy is not None else {},
    )


def delta(after: Mapping[str, float], before: Mapping[str, float], per: float) -> dict[str, float]:
    """``after - before`` per key, divided by ``per``; keys that did not move left out."""
    moved = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / per for k in set(after) | set(before)}
    return {k: v for k, v in sorted(moved.items()) if round(v, 1) != 0}


@dataclass
class Run:
    """What one size measured (:func:`measure`), before rendering."""

    shape: Shape
    creation_s: float
    first_round_s: float
    first_pass_s: float
    """When kopf stopped patching the policies (its finalizer and annotation, once each)."""
    evaluated: int
    evaluated_namespaces: int
    """Namespaces with a policy evaluated in the first round."""
    a: Snapshot
    b: Snapshot
    baseline: dict[str, float]
    """The API server's own requests per interval, before the operator started."""
    evaluations: Evaluations
    rss_mib: list[float]
    """Each operator process's peak RSS (MiB): one, or a shard each."""
    then: Disruption | None = None


@dataclass
class Disruption:
    """The window right after ``--then``: from the fault (the first round included)."""

    what: str
    a: Snapshot
    b: Snapshot
    rss_mib: list[float]
