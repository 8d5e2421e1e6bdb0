"""Fleet-scale benchmark: ``cachescale run`` against a real API server and a real Prometheus.

Run from the repository root (``make envtest``'s binaries, i.e. ``KUBEBUILDER_ASSETS`` or
``../shared/envtest`` through scripts/envtest-assets.sh, and Debian's Prometheus)::

    nice -n 10 .venv/bin/python -m bench.bench_fleet --policies 1000
    nice -n 10 .venv/bin/python -m bench.bench_fleet --policies 10000 --rounds 3 --append

What runs, all on this machine and on loopback, stood up by ``bench/fleet_rig.py`` (the
engines by ``bench/fleet_engines.py``, each policy's place in the fleet from
``bench/fleet_shape.py``):

* **Kubernetes**: etcd and kube-apiserver from the e2e harness (``e2e/harness/``), without
  the controller-manager: no ReplicaSets, pods or HPA controller, so the API server serves
  the operator and nothing else. Per policy a Deployment (1 replica, its status written as
  a settled rollout's), its one pod (created by the bench, its status written Running and
  ready since an hour back, so ``read_target`` knows its age), an HPA on it, and the policy
  itself, its status seeded with ``memory.dataSince`` an hour back so the decisions are
  real from the first round, ``cache.podWarmupSeconds`` the default 600 (every first pod
  is warm). ``--namespaces N`` (default 1: every policy in ``llm``)
  spreads the policies round-robin over ``llm-0`` … ``llm-{N-1}``, each created first
  (with the default ServiceAccount the absent controller-manager would add), each
  policy's objects and selector in its own namespace.
* **Engines**: no emulator process (at 10,000 policies it would be 10,000 scrape targets).
  An HTTP thread serves ``bench/vllm_engine.prom`` (one emulated vLLM pod, trimmed to
  the families the operator reads) once per policy, with the labels a PodMonitor would
  give (``namespace`` the policy's, ``model_name``, ``pod``), counters advancing at the
  pod's rate. Each engine has a hit rate of its own, 0.3 to 0.9 by policy index (its
  prefix-cache hits that share of its lookups, the prefill it computes the rest). The
  fleet is cut into shards of 500 policies, each a scrape target of its own.
* **Prometheus**: ``/usr/bin/prometheus``, a throw-away TSDB, scraping every 15 s. The
  "two servers" are one process reached through two URLs (``127.0.0.1`` and
  ``localhost``): the operator keeps one client per URL, so it sees two.
* **The mix**: 90% of the policies select ``{namespace, model_name}`` (same label names,
  distinct values); 10% add a label name of their own (``adapter_<policy>``), a unique
  label set. Half the policies use each URL, half each window (2m and 5m). Two options
  (both 0 by default; e.g. ``--namespaces 100 --moving 0.1 --restarting 0.05``) make
  some of them change, so the writes and Events a change costs are measured too:

  - ``--moving F``: that share of policies (a fixed draw) falls for 2 minutes in every
    10, the falls staggered evenly over the 10 so each interval holds as many: its
    engine's hit rate halves, requests queue (half a request more each second, drained
    as fast afterwards) and every request it finishes waits 1.5 s for its first token
    (over the policies' 1 s SLO); then it recovers, as a cache lost under load would.
  - ``--restarting F``: that share of pods (another fixed draw) is deleted and created
    again under the next name (``p00042-0`` → ``p00042-1``), ready from then on, as a
    rollout replaces a pod; spread over the steady window but its last interval, so
    each policy is evaluated after its restart within it (not in the ``--then`` one).
    The engine's series follow the new pod, its counters from 0; its policy, with no
    warm pod left, waits for it (``WaitingForWarmPods``). The bench's own requests for
    it (a DELETE, a POST and a status PATCH per pod) are left out of the API-server
    rows.
* **The operator**: the real ``cachescale run`` process (``e2e/operators.py``), standalone,
  admin kubeconfig, 30 s interval; ``--namespace llm`` with one namespace, every
  namespace (as an operator serving a cluster) with more.

The operator starts once every window holds scraped data only (``FULL_WINDOWS_S`` after
the first scrape). Measured over ``--rounds`` intervals after every policy was evaluated
once, kopf's first pass over the policies (its finalizer and annotation on each) ended,
and one more interval passed, from each component's own counters: Prometheus's
``prometheus_http_requests_total`` (by handler), kube-apiserver's
``apiserver_request_total`` (by verb, resource and subresource, minus the rate it showed
before the operator started), the operator's ``/proc`` CPU time and peak RSS (VmHWM), and
its ``/metrics`` for the evaluations: the headline count is the operator's own (its
lateness histogram's count, one per evaluation started), and CPU per evaluation is the
operator's CPU-seconds over it; beside it (read every 15 s, as a Prometheus would; the
longest gap between two reads is shown, since two evaluations between reads count as one)
each policy's ``cachescale_last_evaluation_timestamp_seconds`` gives the gaps between its
evaluations; lateness is a gap minus the interval, and a gap spanning more than 1.5
intervals counts its extra intervals as missed (a policy with no evaluation in the window
misses them all). Beside them, the deltas of the operator's own counters: decisions by
reason, evaluation errors by kind and, when it exports them,
``cachescale_evaluation_lateness_seconds`` (its p95 bucket),
``cachescale_evaluation_missed_intervals_total`` and ``cachescale_kube_requests_total``.

``--then restart`` or ``--then relist`` adds a second window, measured the same way from
the moment of a fault (the operator killed and started again; or the API server killed,
etcd compacted and the API server started again, so every watch lists anew), its first
round included: whether a restart or a relist is a burst of writes, and whether the
policies stay on schedule through it.

``--profile FILE`` samples the operator's Python stacks with py-spy (the dev extra) over the
steady window only, 100 times a second, and writes them to FILE as collapsed stacks (one
line per distinct stack: frames joined by ``;``, then its sample count);
``bench/profile_summary.py`` ranks its functions. Only the thread holding the GIL is
sampled (``--gil``): py-spy counts threads waiting on a queue or a condition as running,
and the operator's Python runs on that one thread at a time anyway; C code that releases
the GIL (zlib, TLS) is left out, the operator's CPU-seconds row counts it. py-spy stops
the operator for each sample (its non-blocking mode reads stacks while they change and
mixes frames of different calls), so a profiled window is a little slower.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import itertools
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_engines import SHARD, Engines
from bench.fleet_rig import (
    ROOT,
    SCRAPE_S,
    Kube,
    Rollout,
    api_requests,
    cpu_s,
    create_fleet,
    envtest_assets,
    peak_rss_mib,
    prometheus,
    prometheus_requests,
)
from bench.fleet_shape import Shape
from bench.provenance import provenance
from e2e.harness.control_plane import control_plane
from e2e.operators import operator_process
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS
from tests.polling import wait_for
from tests.prometheus_fixture import free_port

FULL_WINDOWS_S = 5 * 60 + 2 * SCRAPE_S
"""From the first scrape until every window holds only scraped data; the operator starts
then. Before, a windowed rate still ramps (Prometheus does not extrapolate back past a
series' first sample): a first decision capped the envelope on a cost read from a partial
window and raised it again five minutes later, inside the measured window."""
POLL_S = 15.0
INTERVAL_S = 30.0
BASELINE_S = 20.0
PER_POLICY = ("policy", "namespace")
"""Labels summed over in the operator's own counters."""
BOTH_PROMETHEUS_NAMES = (
    *LOOPBACK_PROMETHEUS,
    "--allowed-prometheus-url",
    r"re:http://localhost:[0-9]+",
)
"""The operator's allow list: the one Prometheus by both its URLs (half the policies name
``localhost``); without the second, every such policy ends in ``MetricsURLNotAllowed``."""


# --- the operator's evaluations ------------------------------------------------------------


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
    """The operator's /metrics, read every :data:`POLL_S`: each policy's evaluation times
    (by ``namespace/name``).
    Two evaluations of a policy between two reads count as one, so each read's start is
    kept (``reads``) to show the longest gap between reads beside the counts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.counters: dict[str, float] = {}
        self.reads: list[float] = []

    def poll(self) -> None:
        self.reads.append(time.time())
        with urllib.request.urlopen(self.url, timeout=60) as answer:
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
        self.counters = dict(counters)

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


# --- the run -------------------------------------------------------------------------------


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
    load: str
    bench: dict[str, float]
    """The API requests the bench itself sent so far (its pod restarts), as ``api``."""


KOPF_PATCHES = "PATCH cachescalingpolicies"
"""kopf's own writes to a policy (its finalizer; no diff base): none once steady."""


def wait_for_first_pass(kube: Kube, limit_s: float) -> float:
    """Until an interval passes without kopf patching a policy (at most ``limit_s``): a
    fleet created before its operator gets each policy patched once, and a window
    measured during that pass measures the pass. Returns when it ended (epoch seconds)."""
    deadline = time.time() + limit_s
    last = api_requests(kube).get(KOPF_PATCHES, 0.0)
    while time.time() < deadline:
        time.sleep(INTERVAL_S)
        now = api_requests(kube).get(KOPF_PATCHES, 0.0)
        if now == last:
            return time.time() - INTERVAL_S
        last = now
    return time.time()


def snapshot(
    prom_port: int,
    kube: Kube,
    pids: Mapping[str, int],
    evaluations: Evaluations,
    rollout: Rollout | None = None,
) -> Snapshot:
    return Snapshot(
        at=time.time(),
        prometheus=prometheus_requests(prom_port),
        api=api_requests(kube),
        cpu={name: cpu_s(pid) for name, pid in pids.items()},
        own=dict(evaluations.counters),
        load=Path("/proc/loadavg").read_text(encoding="ascii").split()[0],
        bench=dict(rollout.sent) if rollout is not None else {},
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
    rss_mib: float
    then: Disruption | None = None


@dataclass
class Disruption:
    """The window right after ``--then``: from the fault (the first round included)."""

    what: str
    a: Snapshot
    b: Snapshot
    rss_mib: float


DISRUPTIONS = ("restart", "relist")
"""``--then restart``: the operator is killed (SIGKILL) and started again. ``--then
relist``: the API server is killed, etcd's history compacted, the API server started
again, so every watch must list again (410 Gone)."""


def watched(shape: Shape) -> tuple[str, ...]:
    """The operator's ``--namespace`` flags: the one namespace, or none (every namespace,
    as an operator serving a cluster runs) when the fleet spans several."""
    return tuple(shape.all_namespaces()) if shape.namespaces == 1 else ()


def disrupt(
    what: str,
    plane: Any,
    stack: ExitStack,
    workdir: Path,
    metrics_port: int,
    operator: Any,
    shape: Shape,
) -> Any:
    """Cause the fault; the operator process serving afterwards."""
    if what == "relist":
        plane.kill("kube-apiserver")
        plane.compact_etcd()
        plane.restart("kube-apiserver")
        return operator
    operator.process.kill()
    operator.process.wait()
    return stack.enter_context(
        operator_process(
            workdir / "restarted",
            plane.kubeconfig,
            namespaces=watched(shape),
            flags=("--metrics-port", str(metrics_port), *BOTH_PROMETHEUS_NAMES),
        )
    )


def measure(args: argparse.Namespace, workdir: Path) -> Run:
    shape = Shape(args.policies, args.namespaces, args.moving, args.restarting)
    with ExitStack() as stack:
        plane = stack.enter_context(control_plane(envtest_assets(workdir)))
        engines = Engines(shape)
        exporter_port = stack.enter_context(engines.serve())
        shards = math.ceil(shape.count / SHARD)
        server = stack.enter_context(prometheus(workdir, exporter_port, shards))
        prom_port = server.port
        creation_s = create_fleet(plane, shape, prom_port, args.threads)
        print(f"created {shape.count} policies in {creation_s:.0f} s: {shape.words()}", flush=True)
        wait_for(
            lambda: len(server.query("up == 1")) == shards or None,
            120.0,
            "every shard scraped",
            every_s=1.0,
        )
        windows_full_at = time.time() + FULL_WINDOWS_S
        kube = Kube(plane, 2)
        before = api_requests(kube)
        time.sleep(BASELINE_S)
        baseline = delta(api_requests(kube), before, BASELINE_S / INTERVAL_S)
        time.sleep(max(0.0, windows_full_at - time.time()))  # the first decisions are steady
        metrics_port = free_port()
        operator = stack.enter_context(
            operator_process(
                workdir / "operator",
                plane.kubeconfig,
                namespaces=watched(shape),
                flags=("--metrics-port", str(metrics_port), *BOTH_PROMETHEUS_NAMES),
            )
        )
        pids = {
            "operator": operator.process.pid,
            "prometheus": server.process.pid,
            "apiserver": plane.component("kube-apiserver").process.pid,
        }
        evaluations = Evaluations(f"http://127.0.0.1:{metrics_port}/metrics")
        names = shape.keys()
        started = time.time()

        def all_evaluated() -> bool | None:
            evaluations.poll()
            return True if all(evaluations.times.get(n) for n in names) else None

        with contextlib.suppress(AssertionError):  # never all evaluated: measured all the same
            wait_for(all_evaluated, args.settle, "every policy evaluated", every_s=5.0)
        first_round_s = time.time() - started
        evaluated = sum(1 for n in names if evaluations.times.get(n))
        spaces = len({n.split("/")[0] for n in names if evaluations.times.get(n)})
        print(
            f"{evaluated} policies in {spaces} namespaces evaluated after {first_round_s:.0f} s",
            flush=True,
        )
        first_pass_s = wait_for_first_pass(kube, args.settle) - started
        print(f"kopf's first pass over the policies ended after {first_pass_s:.0f} s", flush=True)
        time.sleep(args.warmup)  # the first round's writes are not steady
        evaluations.poll()
        window_s = args.rounds * INTERVAL_S
        rollout = Rollout(Kube(plane, 2), shape, engines)
        with profiled(args.profile, pids["operator"], window_s, workdir / "py-spy.log"):
            a = snapshot(prom_port, kube, pids, evaluations, rollout)
            rollout.start(window_s - INTERVAL_S)  # each restart evaluated in the window
            while time.time() < a.at + window_s:
                time.sleep(POLL_S)
                evaluations.poll()
            rollout.join()
            b = snapshot(prom_port, kube, pids, evaluations, rollout)
        if operator.process.poll() is not None:
            raise RuntimeError(f"cachescale run exited:\n{operator.tail()}")
        rss = peak_rss_mib(operator.process.pid)
        run = Run(
            shape,
            creation_s,
            first_round_s,
            first_pass_s,
            evaluated,
            spaces,
            a,
            b,
            baseline,
            evaluations,
            rss,
        )
        if args.then:
            operator = disrupt(args.then, plane, stack, workdir, metrics_port, operator, shape)
            pids["operator"] = operator.process.pid
            pids["apiserver"] = plane.component("kube-apiserver").process.pid  # after a relist
            evaluations.poll()  # a restarted operator's own counters start from 0
            c = snapshot(prom_port, Kube(plane, 2), pids, evaluations)
            if args.then == "relist":
                c.api = {}  # the restarted API server counts from 0
            while time.time() < c.at + args.rounds * INTERVAL_S:
                time.sleep(POLL_S)
                evaluations.poll()
            d = snapshot(prom_port, Kube(plane, 2), pids, evaluations)
            run.then = Disruption(args.then, c, d, peak_rss_mib(operator.process.pid))
    return run


def render(args: argparse.Namespace, run: Run) -> str:
    """The run as a Markdown block for bench/RESULTS.md."""
    rounds = (run.b.at - run.a.at) / INTERVAL_S
    command = " ".join(["python -m bench.bench_fleet", *sys.argv[1:]])
    count = run.shape.count
    lines = [
        f"### {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: {count:,} policies, `{command}`",
        "",
        *(f"- `{line}`" for line in provenance()),
        f"- fleet: {run.shape.words()}",
        f"- setup: {count:,} × (Deployment + pod + HPA + policy) created in "
        f"{run.creation_s:.0f} s "
        f"({args.threads} threads, 7 requests each); {run.evaluated:,} policies in "
        f"{run.evaluated_namespaces:,} namespaces evaluated at "
        f"least once {run.first_round_s:.0f} s after the operator started (once every window "
        f"held 5 minutes of scraped data); kopf's first pass over the policies (its "
        f"finalizer and annotation) over after {run.first_pass_s:.0f} s; then measured "
        f"{rounds:.2f} intervals of 30 s, {args.warmup:.0f} s later; 1-minute load average "
        f"{run.a.load} at its start, {run.b.load} at its end (everything runs under nice 10 "
        "on a machine shared with other jobs)",
        *(
            [
                f"- profiled: py-spy stopped the operator {PROFILE_RATE} times a second over "
                "the steady window to sample the stack holding the GIL"
            ]
            if args.profile
            else []
        ),
        "",
        *window_rows(run, run.a, run.b, run.rss_mib),
    ]
    if run.then is not None:
        then = run.then
        lines += [
            "",
            f"Then `{then.what}` ({DISRUPTION_WORDS[then.what]}), measured from the fault "
            f"for {(then.b.at - then.a.at) / INTERVAL_S:.2f} intervals, its first round "
            f"included; load {then.a.load} → {then.b.load}:",
            "",
            *window_rows(run, then.a, then.b, then.rss_mib),
        ]
    return "\n".join(lines) + "\n"


DISRUPTION_WORDS = {
    "restart": "the operator SIGKILLed and started again",
    "relist": "kube-apiserver killed, etcd compacted, kube-apiserver restarted",
}


def window_rows(run: Run, a: Snapshot, b: Snapshot, rss_mib: float) -> list[str]:
    """One measured window as table rows, per 30 s interval."""
    rounds = (b.at - a.at) / INTERVAL_S
    names = run.shape.keys()
    late, missed, counted = schedule(run.evaluations.times, names, a.at, b.at, INTERVAL_S)
    api = delta(b.api, a.api, rounds)
    bench = delta(b.bench, a.bench, rounds)
    api = {k: v - run.baseline.get(k, 0.0) - bench.get(k, 0.0) for k, v in api.items()}
    api = {k: v for k, v in api.items() if round(v, 1) != 0}
    by_verb: dict[str, float] = collections.defaultdict(float)
    for key, value in api.items():
        by_verb[key.split()[0]] += value
    prom = delta(b.prometheus, a.prometheus, rounds)
    cpu = delta(b.cpu, a.cpu, rounds)
    own = delta(b.own, a.own, rounds)
    evaluated = own.get(OWN_EVALUATIONS)
    operator_cpu = cpu.get("operator", 0.0)
    return [
        "| per 30 s interval | value |",
        "|---|---|",
        f"| evaluations, the operator's own count (wanted {run.shape.count:,}) | "
        + (f"{evaluated:,.0f} |" if evaluated is not None else "– |"),
        "| operator CPU per evaluation (ms) | "
        + (f"{1000 * operator_cpu / evaluated:.2f} |" if evaluated else "– |"),
        f"| evaluations seen between /metrics reads | {counted / rounds:,.0f} |",
        f"| missed intervals (policy × interval, whole window) | {missed:,} |",
        f"| longest gap between two reads of the operator's /metrics (s) | "
        f"{run.evaluations.longest_gap(a.at, b.at):.1f} |",
        f"| lateness p95 / max (s), over {len(late):,} evaluations after a first | "
        + (f"{quantile(late, 0.95):.1f} / {max(late):.1f} |" if late else "– |"),
        f"| Prometheus API requests | {sum(prom.values()):,.0f} "
        f"({', '.join(f'{k} {v:,.0f}' for k, v in prom.items())}) |",
        f"| API-server requests (minus its own baseline and the bench's restarts) | "
        f"{sum(api.values()):,.1f} "
        f"({', '.join(f'{k} {v:,.1f}' for k, v in by_verb.items())}) |",
        *(f"| — {k} | {v:,.1f} |" for k, v in sorted(api.items(), key=lambda kv: -kv[1])),
        f"| operator CPU-seconds | {cpu.get('operator', 0.0):.2f} "
        f"({cpu.get('operator', 0.0) / INTERVAL_S:.2f} cores) |",
        f"| operator peak RSS (VmHWM) | {rss_mib:,.0f} MiB |",
        f"| Prometheus / API-server CPU-seconds | {cpu.get('prometheus', 0.0):.2f} "
        f"/ {cpu.get('apiserver', 0.0):.2f} |",
        *own_rows(own),
    ]


OWN_EVALUATIONS = "cachescale_evaluation_lateness_seconds_count{}"
"""The operator's own count of the evaluations it started (one lateness each): what the
headline row counts. The stamps seen between /metrics reads miss an evaluation that
started but had not ended at a read, and count two between reads as one."""


def own_rows(own: Mapping[str, float]) -> list[str]:
    """The operator's own counters, per interval; its lateness histogram as a p95 bound."""
    bucket = "cachescale_evaluation_lateness_seconds_bucket"
    buckets = sorted(
        (float(json.loads(k[len(bucket) :])["le"]), v)
        for k, v in own.items()
        if k.startswith(bucket)
    )
    rows = [f"| operator's own `{k}` | {v:,.1f} |" for k, v in own.items() if bucket not in k]
    if buckets and buckets[-1][1] > 0:
        bound = next(le for le, seen in buckets if seen >= 0.95 * buckets[-1][1])
        rows.append(f"| operator's own lateness histogram: p95 ≤ | {bound:g} s |")
    return rows


def count_of(text: str) -> int:
    """An argument that is a whole number ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: not ≥ 1")
    return value


def share_of(text: str) -> float:
    """An argument that is a share, 0 to 1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: not within 0..1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="intervals measured")
    parser.add_argument(
        "--settle",
        type=float,
        default=300.0,
        help="seconds to wait for every first evaluation, and again for kopf's first pass",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=INTERVAL_S,
        help="seconds between kopf's first pass and the steady window: a fleet created "
        "before its operator is first written in full (every status, HPA and finalizer), "
        "which at 10,000 policies on 2 cores outlasts one interval",
    )
    parser.add_argument("--threads", type=int, default=16, help="creation threads")
    parser.add_argument(
        "--namespaces",
        type=count_of,
        default=1,
        metavar="N",
        help="spread the policies round-robin over N namespaces (llm-0 … llm-{N-1}, the "
        "operator watching all namespaces); 1: all in llm, the operator watching it alone",
    )
    parser.add_argument(
        "--moving",
        type=share_of,
        default=0.0,
        metavar="F",
        help="share of policies whose hit rate halves, a queue grows and TTFT passes the "
        "SLO for 2 of every 10 minutes, staggered",
    )
    parser.add_argument(
        "--restarting",
        type=share_of,
        default=0.0,
        metavar="F",
        help="share of pods deleted and re-created under a new name during the steady window",
    )
    parser.add_argument(
        "--then",
        choices=DISRUPTIONS,
        help="after the steady window, a fault and --rounds more intervals measured",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help=f"sample the operator's GIL holder with py-spy ({PROFILE_RATE} Hz) over the "
        "steady window into FILE, as collapsed stacks (python -m bench.profile_summary FILE "
        "ranks them)",
    )
    parser.add_argument("--append", action="store_true", help="append to bench/RESULTS.md")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR (new or empty) and keep it: the operators' logs are "
        "DIR/operator/operator.log and, after --then restart, DIR/restarted/operator.log",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as scope:
        if args.keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-")))
        else:
            args.keep.mkdir(parents=True, exist_ok=True)
            if any(args.keep.iterdir()):
                parser.error(f"--keep {args.keep}: not empty")
            workdir = args.keep
        try:
            block = render(args, measure(args, workdir))
        except Exception:
            for log in sorted(workdir.rglob("*.log")):
                print(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    print(block)
    if args.append:
        with (ROOT / "bench" / "RESULTS.md").open("a", encoding="utf-8") as results:
            results.write("\n" + block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
