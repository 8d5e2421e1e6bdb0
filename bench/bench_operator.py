"""Operator throughput: N policies against one real Prometheus, evaluated every interval.

Run from the repository root (about five minutes for the defaults on a 2-core machine)::

    .venv/bin/python -m bench.bench_operator                 # 200 policies, 3 rounds
    .venv/bin/python -m bench.bench_operator --policies 50 --rounds 4 --no-append

The goal (bench/RESULTS.md records each run): 200 policies reading one Prometheus are each
evaluated within their 30 s interval on 2 cores. What runs, all on this machine and on
loopback:

* **Engines**: ``python -m cachescale.emulator`` serving a fixed fleet of emulated vLLM
  pods (real exposition: ~126 series per pod), in real time.
* **Prometheus**: the Debian ``/usr/bin/prometheus`` binary, throw-away TSDB, scraping
  every ``--scrape-interval`` (15 s). Each policy gets its own series (see ``--same-series``
  for the other choice): the file_sd lists every emulated pod once per policy with target
  labels ``namespace="llm"``, ``model_name="<policy>"``, ``pod="<policy>-<k>"``, so policy
  ``p007`` selects ``{namespace="llm", model_name="p007"}`` and nothing else, as 200
  distinct deployments would. The target label wins over the engine's own ``model_name``
  (``honor_labels: false``).
* **Kubernetes**: kmock's ``KubernetesEmulator`` (``tests/controller/cluster.py``) in a
  child process, holding per policy a Deployment, an HPA, its pods and the policy
  (``mode: Enforce``, ``window: 5m``, ``interval: 30s``). Each policy's status is seeded
  with ``memory.dataSince`` an hour back, so the decisions are real ones from the first
  round (otherwise every decision would be ``WaitingForFullWindow`` for 5 minutes).

Two measurements:

1. **Pool-driven** (all policies): ``evaluate`` from ``cachescale.controller.evaluation``
   driven exactly as the kopf daemon in ``handlers.py`` drives it, without kopf: one
   asyncio loop per policy, all starting together (as kopf starts the daemons on the
   initial listing), each awaiting ``evaluate`` on a 16-worker ``ThreadPoolExecutor`` and
   then sleeping the interval. The policy body is re-read from the API after each
   evaluation, on a separate small pool and off the clock (kopf has it from its watch).
   Timed subclasses of ``KubeApi`` (get/items/patch/post) and ``PrometheusClient``
   (detect/query_many/query), and timed ``gather_signals`` and ``decide``, handed to the
   ``Operator`` through its public seams, time each evaluation's parts (the operator code
   runs unchanged). Afterwards, 20 evaluations run one at a time, for the cost of one
   evaluation without contention (wall and CPU seconds).
2. **Through ``cachescale run``** (``--kopf-policies``, default: all): the real operator
   process (kopf) against a fresh kmock; evaluations are observed by polling its
   ``/metrics`` every 2 s (``cachescale_last_evaluation_timestamp_seconds`` and the
   ``cachescale_evaluation_duration_seconds`` histogram, per policy).

**On time**: an evaluation is *due* when its loop wants it (the start of the run for the
first one; the previous one's end plus the interval after that, which is how the daemon
sleeps). It misses if it ends more than one interval after it was due (queueing for a
worker included), or never ends. The script exits 1 if any evaluation missed, in either
measurement. Each run lasts ``--rounds`` × interval of wall time; evaluations due after
that are not counted.

CPU is reported in cores (1.00 = one core busy all the time; the machine has ``nproc``);
RSS from ``/proc/<pid>/status``. The other processes (Prometheus, kmock, the emulator)
share the same 2 cores, which a real cluster would not ask of the operator's node.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import functools
import json
import multiprocessing
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from cachescale.controller.evaluation import Operator, PolicyObject, evaluate
from cachescale.controller.handlers import WORKERS
from cachescale.controller.kube import KubeApi
from cachescale.decide import decide
from cachescale.gather.prometheus import PrometheusClient
from cachescale.gather.signals import gather_signals
from tests.controller.cluster import NAMESPACE, deployment, fake_cluster, hpa, pods, policy
from tests.polling import wait_for
from tests.prometheus_fixture import (
    JOB,
    PROMETHEUS,
    PrometheusServer,
    fixed_fleet_scenario,
    free_port,
    http_get,
)
from tests.prometheus_fixture import run_prometheus as start_prometheus

ROOT = Path(__file__).resolve().parent.parent
PODS = 2
"""Emulated vLLM pods (each policy's Deployment has this many)."""
POLICIES = "cachescale.dev/v1alpha1/cachescalingpolicies"
SEQUENTIAL = 20
"""Evaluations run one at a time after the pool phase."""
POLL_S = 2.0
"""How often the kopf phase reads the operator's /metrics."""
HEADING = "Operator: {n} policies, one Prometheus"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- processes ---------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (its threads included), seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mib(pid: int | str = "self") -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts[:8]) - idle) / CLK_TCK


@dataclass
class Usage:
    """CPU seconds and RSS of the processes involved, sampled once a second."""

    pids: dict[str, int]
    cpu: dict[str, float] = field(default_factory=dict)
    rss_peak: dict[str, float] = field(default_factory=dict)
    rss_last: dict[str, float] = field(default_factory=dict)
    cpu_peak: dict[str, float] = field(default_factory=dict)
    """Highest CPU over any 1-second sample, cores."""
    machine: float = 0.0
    wall: float = 0.0


class Sampler:
    """Samples CPU and RSS of named processes between ``start`` and ``stop``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._usage = Usage(pids)
        self._cpu0: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        out = {}
        for name, pid in self._pids.items():
            try:
                out[name] = proc_cpu_s(pid)
            except OSError:
                out[name] = self._cpu0.get(name, 0.0)
        return out

    def _sample(self) -> None:
        for name, pid in self._pids.items():
            try:
                rss, _ = proc_rss_mib(pid)
            except OSError:
                continue
            self._usage.rss_last[name] = rss
            self._usage.rss_peak[name] = max(self._usage.rss_peak.get(name, 0.0), rss)

    def _run(self) -> None:
        previous, at = self._cpu(), time.monotonic()
        while not self._stop.wait(1.0):
            self._sample()
            now_cpu, now = self._cpu(), time.monotonic()
            for name, seconds in now_cpu.items():
                cores = (seconds - previous.get(name, seconds)) / (now - at)
                self._usage.cpu_peak[name] = max(self._usage.cpu_peak.get(name, 0.0), cores)
            previous, at = now_cpu, now

    def __enter__(self) -> Sampler:
        self._cpu0 = self._cpu()
        self._machine0 = machine_busy_s()
        self._t0 = time.monotonic()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        cpu = self._cpu()
        self._usage.cpu = {name: cpu[name] - self._cpu0.get(name, 0.0) for name in cpu}
        self._usage.machine = machine_busy_s() - self._machine0
        self._usage.wall = time.monotonic() - self._t0

    @property
    def usage(self) -> Usage:
        return self._usage


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM the process we started; SIGKILL it if it does not exit in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def run_emulator(workdir: Path, duration_s: float) -> Iterator[tuple[int, list[str]]]:
    """The emulated fleet: (pid, pod addresses)."""
    scenario = fixed_fleet_scenario(replicas=PODS, duration_s=duration_s)
    scenario_file = workdir / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    file_sd = workdir / "emulator-targets.json"
    command = [
        sys.executable,
        "-m",
        "cachescale.emulator",
        "--scenario-file",
        str(scenario_file),
        "--speed",
        "1",
        "--namespace",
        NAMESPACE,
        "--write-file-sd",
        str(file_sd),
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT / "operator")}
    with (workdir / "emulator.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:

        def addresses() -> list[str] | None:
            if process.poll() is not None:
                raise RuntimeError((workdir / "emulator.log").read_text())
            if not file_sd.exists():
                return None
            groups = json.loads(file_sd.read_text(encoding="utf-8"))
            found = sorted(
                (g["labels"]["pod"], g["targets"][0]) for g in groups if g.get("targets")
            )
            return [address for _, address in found] if len(found) == PODS else None

        yield process.pid, wait_for(addresses, 30.0, "the emulated pods")
    finally:
        stop_process(process)


def file_sd_groups(names: Sequence[str], addresses: Sequence[str], same_series: bool) -> list[Any]:
    """Every emulated pod once per policy (distinct series), or once (shared series)."""
    models = ["shared"] if same_series else list(names)
    return [
        {
            "targets": [address],
            "labels": {"namespace": NAMESPACE, "model_name": model, "pod": f"{model}-{k}"},
        }
        for model in models
        for k, address in enumerate(addresses)
    ]


@contextmanager
def run_prometheus(workdir: Path, groups: list[Any], scrape_s: float) -> Iterator[PrometheusServer]:
    """The test suite's Prometheus, scraping ``groups`` (written as file_sd) every
    ``scrape_s`` seconds."""
    file_sd = workdir / "targets.json"
    file_sd.write_text(json.dumps(groups), encoding="utf-8")
    with start_prometheus(workdir, file_sd, scrape_interval_s=scrape_s) as server:
        yield server


def wait_for_data(prometheus: PrometheusServer, series: int, timeout_s: float) -> None:
    """Until every target is up and every engine series has two samples (a rate needs 2)."""

    def up() -> bool | None:
        rows = prometheus.query(f'sum(up{{job="{JOB}"}})')
        return True if rows and float(rows[0]["value"][1]) >= series else None

    wait_for(up, timeout_s, f"{series} targets up")

    def sampled() -> bool | None:
        promql = "count(count_over_time(vllm:num_requests_running[5m]) >= 2)"
        rows = prometheus.query(promql)
        return True if rows and float(rows[0]["value"][1]) >= series else None

    wait_for(sampled, timeout_s, "two samples of every series")


# --- the fake cluster, in a child process ---------------------------------------------------


def stack_objects(
    names: Sequence[str], prometheus_url: str, interval_s: float, window: str, same_series: bool
) -> list[tuple[str, dict[str, Any]]]:
    """Per policy: Deployment, HPA, pods and the policy (with seeded memory)."""
    now = dt.datetime.now(dt.UTC)
    since = (now - dt.timedelta(hours=1)).isoformat()
    objects: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        metrics: dict[str, Any] = {"window": window, "interval": f"{interval_s:g}s"}
        if same_series:
            metrics["selector"] = {"namespace": NAMESPACE, "model_name": "shared"}
        body = policy(
            name,
            prometheus_url=prometheus_url,
            mode="Enforce",
            deployment_name=name,
            hpa_name=name,
            extra={"metrics": metrics},
        )
        body["status"] = {"memory": {"dataSince": since}}  # as the operator writes it
        objects.append(("apps/v1/deployments", deployment(name, replicas=PODS)))
        objects.append(("autoscaling/v2/horizontalpodautoscalers", hpa(name, target=name)))
        objects.extend(("v1/pods", pod) for pod in pods(name, PODS, now))
        objects.append((POLICIES, body))
    return objects


_served: collections.Counter[str] = collections.Counter()


def _forgetful(handle: Callable[..., Any]) -> Callable[..., Any]:
    """kmock's ``_handle``, dropping each request from kmock's request log once served.

    kmock matches every request against its whole log (which exists for assertions on
    history): O(requests served so far) per request, ~45 µs per logged request here, so
    a 250 ms answer after 5,000 requests and seconds in a benchmark. With this, the log
    holds only the requests in flight. (Benchmark only; the tests keep the log.)
    """

    @functools.wraps(handle)
    async def wrapper(self: Any, request: Any) -> Any:
        try:
            return await handle(self, request)
        finally:
            _served[request.method.value] += 1
            log = self._requests
            for index in range(len(log) - 1, -1, -1):
                if log[index] is request:
                    del log[index]
                    break

    return wrapper


def serve_kmock(conn: Any, objects: list[tuple[str, dict[str, Any]]]) -> None:
    """Child process: kmock with ``objects``; sends its URL, serves until told to stop."""
    kmock.KubernetesEmulator._handle = _forgetful(kmock.KubernetesEmulator._handle)
    with fake_cluster() as cluster:
        # What kopf needs beyond the tests: watchable, patchable policies with a status
        # subresource, and a namespaces resource (kopf waits for it even cluster-wide).
        extra = {
            POLICIES: {
                "namespaced": True,
                "kind": "CacheScalingPolicy",
                "verbs": ["get", "list", "watch", "patch", "update"],
                "subresources": ["status"],
            },
            "v1/namespaces": {"namespaced": False, "kind": "Namespace", "verbs": ["list", "watch"]},
        }
        for key, info in extra.items():
            cluster.serve_resource(key, info)
        for resource_name, obj in objects:
            cluster.put(resource_name, obj)
        conn.send(cluster.url.rstrip("/"))
        conn.recv()
        conn.send(dict(_served))


@dataclass
class Kmock:
    url: str
    pid: int
    conn: Any
    process: Any

    def stop(self) -> dict[str, int]:
        self.conn.send("stop")
        requests: dict[str, int] = self.conn.recv() if self.conn.poll(30) else {}
        self.process.join(15)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        return requests


@contextmanager
def run_kmock(objects: list[tuple[str, dict[str, Any]]]) -> Iterator[Kmock]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=serve_kmock, args=(child, objects), daemon=True)
    process.start()
    kmock = None
    try:
        if not parent.poll(120):
            raise RuntimeError("kmock did not start")
        kmock = Kmock(parent.recv(), process.pid, parent, process)
        yield kmock
    finally:
        if process.is_alive():
            if kmock is not None:
                kmock.stop()
            else:
                process.terminate()
                process.join(5)


def policy_path(name: str) -> str:
    return f"/apis/cachescale.dev/v1alpha1/namespaces/{NAMESPACE}/cachescalingpolicies/{name}"


def kube_api(url: str) -> KubeApi:
    configuration = client.Configuration()
    configuration.host = url
    return KubeApi(client.ApiClient(configuration))


# --- instrumentation -------------------------------------------------------------------------

_current = threading.local()
_query_latencies: list[float] = []
_kube_latencies: dict[str, list[float]] = collections.defaultdict(list)
KUBE_RESOURCES = (
    "cachescalingpolicies",
    "horizontalpodautoscalers",
    "deployments",
    "pods",
    "events",
    "secrets",
)


def kube_kind(method: str, path: str) -> str:
    """``GET deployments``, ``PATCH cachescalingpolicies/status``, ..."""
    parts = path.split("/")
    found = next((p for p in parts if p in KUBE_RESOURCES), "other")
    return f"{method} {found}{'/status' if parts[-1] == 'status' else ''}"


@dataclass
class Record:
    """One evaluation, as the benchmark saw it (monotonic seconds)."""

    policy: str
    due: float
    submitted: float
    start: float = 0.0
    end: float = 0.0
    reason: str = ""
    parts: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))


def _timed(fn: Callable[..., Any], part: str, count: Callable[..., int] | None = None) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        record: Record | None = getattr(_current, "record", None)
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if record is not None:
                record.parts[part] += time.perf_counter() - started
                record.calls[part] += count(*args, **kwargs) if count else 1

    return wrapper


def _timed_kube(fn: Callable[..., Any], method: str) -> Any:
    @functools.wraps(fn)
    def wrapper(self: KubeApi, path: str, *args: Any, **kwargs: Any) -> Any:
        record: Record | None = getattr(_current, "record", None)
        started = time.perf_counter()
        try:
            return fn(self, path, *args, **kwargs)
        finally:
            if record is not None:
                took = time.perf_counter() - started
                record.parts["kube"] += took
                record.calls["kube"] += 1
                _kube_latencies[kube_kind(method, path)].append(took)

    return wrapper


def _timed_query(fn: Callable[..., Any]) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _query_latencies.append(time.perf_counter() - started)

    return wrapper


class TimedKubeApi(KubeApi):
    """The operator's Kubernetes client, each call timed into the running evaluation."""

    get = _timed_kube(KubeApi.get, "GET")
    items = _timed_kube(KubeApi.items, "GET")
    patch = _timed_kube(KubeApi.patch, "PATCH")
    post = _timed_kube(KubeApi.post, "POST")


class TimedPrometheusClient(PrometheusClient):
    """The operator's Prometheus client, each request timed into the running evaluation
    (``query_many`` counts its queries) and each query's latency kept."""

    detect = _timed(PrometheusClient.detect, "prom_http")
    query_many = _timed(
        PrometheusClient.query_many, "prom_http", lambda self, queries, at: len(queries)
    )
    query = _timed_query(PrometheusClient.query)


def instrumented_operator(url: str) -> Operator:
    """The operator with its I/O and its two computing parts timed, through the
    ``Operator``'s seams (behaviour unchanged)."""
    configuration = client.Configuration()
    configuration.host = url
    return Operator(
        TimedKubeApi(client.ApiClient(configuration)),
        new_client=TimedPrometheusClient,
        read_signals=_timed(gather_signals, "gather"),
        make_decision=_timed(decide, "decide"),
    )


class PoolWarnings:
    """Counts urllib3's 'Connection pool is full' and new connections, per port."""

    def __init__(self) -> None:
        self.full = 0
        self.new_connections: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def install(self) -> None:
        import logging

        counter = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                msg = str(record.msg)
                with counter._lock:
                    if msg.startswith("Connection pool is full"):
                        counter.full += 1
                    elif msg.startswith("Starting new HTTP connection") and record.args:
                        counter.new_connections[str(record.args[-1])] += 1

        logger = logging.getLogger("urllib3.connectionpool")
        logger.addHandler(Handler())
        logger.setLevel(logging.DEBUG)
        logger.propagate = False

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return self.full, dict(self.new_connections)


# --- on-time accounting ----------------------------------------------------------------------


@dataclass
class Timing:
    """The per-policy schedule check shared by both measurements."""

    evaluations: int = 0
    misses: list[str] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    """end − due of every counted evaluation."""
    periods: list[float] = field(default_factory=list)
    """end-to-end gaps between a policy's consecutive evaluations."""


def check_schedule(
    runs: dict[str, list[tuple[float, float]]],
    first_due: float,
    deadline: float,
    observed_until: float,
    interval: float,
    names: Sequence[str],
) -> Timing:
    """``runs``: policy → [(start, end)] in order. Due = first_due, then end + interval."""
    timing = Timing()
    for name in names:
        due = first_due
        previous_end = None
        for start, end in runs.get(name, []):
            if due >= deadline:
                break
            timing.evaluations += 1
            timing.lateness.append(end - due)
            if end - due > interval:
                timing.misses.append(
                    f"{name}: ended {end - due:.1f}s after due (start {start:.1f})"
                )
            if previous_end is not None:
                timing.periods.append(end - previous_end)
            previous_end = end
            due = end + interval
        else:
            if due < deadline and observed_until - due > interval:
                timing.misses.append(f"{name}: no evaluation ended within {interval:g}s of due")
    return timing


def quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(p50, p95, max); zeros when empty."""
    if not values:
        return 0.0, 0.0, 0.0
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95, ordered[-1]


def ms(values: Sequence[float]) -> str:
    p50, p95, top = quantiles(values)
    return f"{p50 * 1000:,.0f} / {p95 * 1000:,.0f} / {top * 1000:,.0f} ms"


# --- Prometheus' own view --------------------------------------------------------------------


def prometheus_counters(url: str) -> dict[str, float]:
    """Query-handler request time and engine slices (sums and counts) from /metrics."""
    text = http_get(f"{url}/metrics").decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name.startswith("prometheus_http_request_duration_seconds_")
                and labels.get("handler") == "/api/v1/query"
                and sample.name.endswith(("_sum", "_count"))
            ):
                out[f"http_{sample.name.rsplit('_', 1)[1]}"] = sample.value
            elif sample.name.startswith("prometheus_engine_query_duration_seconds_") and (
                sample.name.endswith(("_sum", "_count"))
            ):
                out[f"{labels['slice']}_{sample.name.rsplit('_', 1)[1]}"] = sample.value
    return out


def prometheus_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean seconds per query: HTTP handler, and each engine slice."""
    out = {}
    for key in ("http", "queue_time", "prepare_time", "inner_eval", "result_sort"):
        count = after.get(f"{key}_count", 0.0) - before.get(f"{key}_count", 0.0)
        total = after.get(f"{key}_sum", 0.0) - before.get(f"{key}_sum", 0.0)
        out[key] = total / count if count else 0.0
        out[f"{key}_n"] = count
    return out


# --- measurement 1: the operator's pool, driven like the daemon -------------------------------


@dataclass
class PoolResult:
    records: list[Record]
    timing: Timing
    wall_s: float
    usage: Usage
    rss_before: float
    rss_after: float
    maxrss: float
    burst_s: float
    rounds: list[tuple[int, float]]
    """(evaluations, span seconds) per round index."""
    sequential: list[tuple[float, float]]
    """(wall, cpu) of evaluations run one at a time."""
    prometheus: dict[str, float]
    pool_full: int
    new_connections: dict[str, int]
    query_latencies: list[float]
    kube_latencies: dict[str, list[float]]
    kube_requests: dict[str, int]


def run_one(operator: Operator, body: dict[str, Any], record: Record) -> Record:
    """Worker side: one evaluation, timed."""
    _current.record = record
    record.start = time.monotonic()
    try:
        record.reason = evaluate(operator, PolicyObject.of(body)).reason
    except Exception as error:  # the daemon logs and counts these; so do we
        frames = traceback.extract_tb(error.__traceback__)
        ours = [f for f in frames if "cachescale" in f.filename] or frames
        first_line = " ".join(str(error).split())[:160]
        record.reason = (
            f"Internal: {type(error).__name__} at {Path(ours[-1].filename).name}:"
            f"{ours[-1].lineno} ({ours[-1].name}): {first_line}"
        )
    finally:
        record.end = time.monotonic()
        _current.record = None
    return record


async def drive(
    operator: Operator,
    reader: KubeApi,
    names: Sequence[str],
    interval: float,
    duration: float,
) -> tuple[list[Record], float, float]:
    """One loop per policy, as ``handlers.policy_loop`` runs them."""
    loop = asyncio.get_running_loop()
    workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="evaluate")
    readers = ThreadPoolExecutor(4, thread_name_prefix="reader")
    records: list[Record] = []
    bodies = await asyncio.gather(
        *(loop.run_in_executor(readers, reader.get, policy_path(n)) for n in names)
    )
    t0 = time.monotonic()
    deadline = t0 + duration

    async def policy_loop(name: str, body: dict[str, Any]) -> None:
        due = t0
        path = policy_path(name)
        while due < deadline:
            record = Record(name, due, time.monotonic())
            await loop.run_in_executor(workers, run_one, operator, body, record)
            records.append(record)
            due = record.end + interval
            body = await loop.run_in_executor(readers, reader.get, path)  # kopf: the watch
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    try:
        await asyncio.gather(*(policy_loop(n, b) for n, b in zip(names, bodies, strict=True)))
    finally:
        workers.shutdown()
        readers.shutdown()
    return records, t0, deadline


def measure_pool(
    kmock: Kmock,
    prometheus: PrometheusServer,
    names: Sequence[str],
    interval: float,
    rounds: int,
    pids: dict[str, int],
    warnings: PoolWarnings,
) -> PoolResult:
    operator = instrumented_operator(kmock.url)
    reader = kube_api(kmock.url)
    duration = rounds * interval
    rss_before, _ = proc_rss_mib()
    prom_before = prometheus_counters(prometheus.url)
    full0, conns0 = warnings.snapshot()
    _query_latencies.clear()
    _kube_latencies.clear()
    with Sampler(pids | {"operator": os.getpid()}) as sampler:
        records, t0, deadline = asyncio.run(drive(operator, reader, names, interval, duration))
    observed_until = max(r.end for r in records)
    prom = prometheus_delta(prom_before, prometheus_counters(prometheus.url))
    full1, conns1 = warnings.snapshot()
    rss_after, _ = proc_rss_mib()
    runs: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    by_round: dict[int, list[Record]] = collections.defaultdict(list)
    for record in sorted(records, key=lambda r: r.start):
        by_round[len(runs[record.policy])].append(record)
        runs[record.policy].append((record.start - t0, record.end - t0))
    timing = check_schedule(runs, 0.0, deadline - t0, observed_until - t0, interval, names)
    rounds_out = [
        (len(rs), max(r.end for r in rs) - min(r.due for r in rs))
        for _, rs in sorted(by_round.items())
    ]
    burst = max(r.end for r in by_round[0]) - t0
    query_latencies = list(_query_latencies)
    kube_latencies = {k: list(v) for k, v in _kube_latencies.items()}
    sequential = []
    for name in names[:SEQUENTIAL]:
        body = reader.get(policy_path(name))
        cpu0, wall0 = time.process_time(), time.monotonic()
        run_one(operator, body, Record(name, 0.0, 0.0))
        sequential.append((time.monotonic() - wall0, time.process_time() - cpu0))
    return PoolResult(
        records=records,
        timing=timing,
        wall_s=observed_until - t0,
        usage=sampler.usage,
        rss_before=rss_before,
        rss_after=rss_after,
        maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        burst_s=burst,
        rounds=rounds_out,
        sequential=sequential,
        prometheus=prom,
        pool_full=full1 - full0,
        new_connections={k: v - conns0.get(k, 0) for k, v in conns1.items()},
        query_latencies=query_latencies,
        kube_latencies=kube_latencies,
        kube_requests={},
    )


# --- measurement 2: the real `cachescale run` -------------------------------------------------


@dataclass
class KopfResult:
    policies: int
    evaluations: list[tuple[str, float, float]]
    """(policy, start, duration), wall clock."""
    timing: Timing
    usage: Usage
    rss_peak: float
    hwm: float
    burst_s: float
    errors: dict[str, float]
    reasons: dict[str, float]
    log_tail: str


def read_operator_metrics(url: str) -> dict[str, dict[str, float]]:
    """Per policy: evaluation count, duration sum, last evaluation time; plus counters."""
    out: dict[str, dict[str, float]] = collections.defaultdict(dict)
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            policy_name = sample.labels.get("policy")
            if policy_name is None:
                continue
            if sample.name == "cachescale_evaluation_duration_seconds_count":
                out[policy_name]["count"] = sample.value
            elif sample.name == "cachescale_evaluation_duration_seconds_sum":
                out[policy_name]["sum"] = sample.value
            elif sample.name == "cachescale_last_evaluation_timestamp_seconds":
                out[policy_name]["last"] = sample.value
            elif sample.name == "cachescale_decisions_total":
                key = f"reason:{sample.labels['reason']}"
                out["_"][key] = out["_"].get(key, 0.0) + sample.value
            elif sample.name == "cachescale_evaluation_errors_total":
                key = f"error:{sample.labels['kind']}"
                out["_"][key] = out["_"].get(key, 0.0) + sample.value
    return out


def measure_kopf(
    workdir: Path,
    kmock: Kmock,
    names: Sequence[str],
    interval: float,
    rounds: int,
    pids: dict[str, int],
) -> KopfResult:
    kubeconfig = workdir / "kubeconfig.yaml"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": kmock.url}}],
                "users": [{"name": "bench", "user": {"token": "bench"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "bench"}}],
                "current-context": "kmock",
            }
        ),
        encoding="utf-8",
    )
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "cachescale.cli",
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port",
        str(port),
        "--health-port",
        "0",
        "--standalone",
    ]
    # kopf logs in through $KUBECONFIG (or ~/.kube/config): --kubeconfig alone only
    # reaches the operator's own API client.
    env = os.environ | {"PYTHONPATH": str(ROOT / "operator"), "KUBECONFIG": str(kubeconfig)}
    log = workdir / "operator.log"
    url = f"http://127.0.0.1:{port}/metrics"
    seen: dict[str, tuple[float, float, float]] = {}
    evaluations: list[tuple[str, float, float]] = []
    rss_peak = 0.0
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=env)
    try:
        sampler = Sampler(pids | {"operator": process.pid})
        with sampler:
            first_start: float | None = None
            stop_at = time.time() + 60.0  # until the first evaluation, then the run
            latest: dict[str, dict[str, float]] = {}
            while time.time() < stop_at:
                time.sleep(POLL_S)
                if process.poll() is not None:
                    raise RuntimeError(f"cachescale run exited:\n{log.read_text()[-3000:]}")
                try:
                    latest = read_operator_metrics(url)
                except OSError:
                    continue
                rss_peak = max(rss_peak, proc_rss_mib(process.pid)[0])
                for name, values in latest.items():
                    if name == "_" or "count" not in values:
                        continue
                    count, total = values["count"], values["sum"]
                    before_count, before_sum, before_last = seen.get(name, (0.0, 0.0, 0.0))
                    # The histogram is observed just before the timestamp is set: a poll in
                    # between sees the new count with the old start; wait for both.
                    if count > before_count and values.get("last", 0.0) > before_last:
                        new = int(count - before_count)
                        each = (total - before_sum) / new
                        # Only the last start is exported; earlier ones in the same poll
                        # (never at a 30 s interval and a 2 s poll) are placed before it.
                        for k in range(new):
                            start = values["last"] - (new - 1 - k) * (interval + each)
                            evaluations.append((name, start, each))
                        seen[name] = (count, total, values["last"])
                        if first_start is None:
                            first_start = min(
                                values["last"]
                                for n, values in latest.items()
                                if n != "_" and "last" in values
                            )
                            stop_at = first_start + rounds * interval + interval + 5.0
            _, hwm = proc_rss_mib(process.pid)
    finally:
        stop_process(process)
    if first_start is None:
        raise RuntimeError(f"no evaluation observed:\n{log.read_text()[-3000:]}")
    first_start = min(start for _, start, _ in evaluations)
    runs: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for name, start, duration in sorted(evaluations, key=lambda e: e[1]):
        runs[name].append((start - first_start, start + duration - first_start))
    deadline = rounds * interval
    observed = stop_at - POLL_S - first_start
    timing = check_schedule(runs, 0.0, deadline, observed, interval, names)
    burst = max(runs[n][0][1] for n in names if runs.get(n)) if runs else 0.0
    counters = latest.get("_", {})
    return KopfResult(
        policies=len(names),
        evaluations=evaluations,
        timing=timing,
        usage=sampler.usage,
        rss_peak=rss_peak,
        hwm=hwm,
        burst_s=burst,
        errors={k[6:]: v for k, v in counters.items() if k.startswith("error:")},
        reasons={k[7:]: v for k, v in counters.items() if k.startswith("reason:")},
        log_tail=log.read_text(errors="replace")[-2000:],
    )


# --- report ---------------------------------------------------------------------------------


def machine_facts() -> list[str]:
    model = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    version = subprocess.run(
        [str(PROMETHEUS), "--version"], capture_output=True, text=True, check=False
    )
    prom_version = (version.stdout or version.stderr).splitlines()[0] if version else "?"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- nproc: {len(os.sched_getaffinity(0))}; CPU: {model}; "
        f"{platform.system()} {platform.release()}",
        f"- Python: {platform.python_implementation()} {platform.python_version()}; "
        f"{prom_version.strip()}",
        f"- load average before the run: {load} (1, 5, 15 min)",
    ]


def cpu_line(usage: Usage) -> str:
    wall = usage.wall or 1.0
    parts = [
        f"{name} {seconds / wall:.2f} (peak {usage.cpu_peak.get(name, 0.0):.2f})"
        for name, seconds in sorted(usage.cpu.items())
    ]
    return f"{', '.join(parts)}; whole machine {usage.machine / wall:.2f} (of {os.cpu_count()})"


def part_table(records: Sequence[Record]) -> list[str]:
    evaluated = [r for r in records if r.end > r.start]
    total = [r.end - r.start for r in evaluated]
    rows = {
        "Kubernetes calls (all `KubeApi` requests)": [r.parts["kube"] for r in evaluated],
        "gather: Prometheus HTTP (detect + query_many)": [r.parts["prom_http"] for r in evaluated],
        "gather: turning results into signals": [
            r.parts["gather"] - r.parts["prom_http"] for r in evaluated
        ],
        "decide": [r.parts["decide"] for r in evaluated],
        "the rest (spec validation, status render, metrics)": [
            (r.end - r.start) - r.parts["kube"] - r.parts["gather"] - r.parts["decide"]
            for r in evaluated
        ],
    }
    whole = sum(total) or 1.0
    lines = [
        "| part of one evaluation (wall, inside the worker) | p50 / p95 / max | share |",
        "|---|---|---|",
    ]
    for label, values in rows.items():
        lines.append(f"| {label} | {ms(values)} | {100 * sum(values) / whole:.0f}% |")
    lines.append(f"| whole evaluation | {ms(total)} | 100% |")
    return lines


def render(
    args: argparse.Namespace,
    facts: list[str],
    setup: dict[str, Any],
    pool: PoolResult,
    kopf: KopfResult | None,
) -> str:
    n = len(setup["names"])
    interval = args.interval
    records = pool.records
    latency = [r.end - r.start for r in records]
    waits = [r.start - r.submitted for r in records]
    reasons = collections.Counter(r.reason.split(":")[0] for r in records)
    internal = collections.Counter(r.reason for r in records if r.reason.startswith("Internal"))
    per_eval_queries = statistics.fmean(
        r.calls["prom_http"] for r in records if r.calls["prom_http"]
    )
    per_eval_kube = statistics.fmean(r.calls["kube"] for r in records)
    seq_wall = [w for w, _ in pool.sequential]
    seq_cpu = [c for _, c in pool.sequential]
    op_cpu = pool.usage.cpu.get("operator", 0.0)
    cpu_per_eval = op_cpu / max(1, len(records))
    prom = pool.prometheus
    series = "its own series" if not args.same_series else 'the same series (`model_name="shared"`)'
    lines = [
        f"### {setup['date']}: `python -m bench.bench_operator --policies {n} "
        f"--rounds {args.rounds}`",
        "",
        *facts,
        f"- setup: {PODS} emulated vLLM pods (`cachescale emulate`, real time); Prometheus "
        f"scraping every {args.scrape_interval:g} s, {setup['targets']} targets "
        f"({setup['series']:,} series); {n} policies, each reading {series}, `window: "
        f"{args.window}`, `interval: {interval:g}s`, `mode: Enforce`; kmock in a child process "
        f"with {n} Deployments, HPAs and policies and {n * PODS} pods (its request log cut "
        "to the requests in flight: kmock scans the whole log on every request)",
        "",
        f"#### 1. `evaluate()` on the operator's {WORKERS}-worker pool, driven like the kopf "
        "daemon (no kopf), all policies",
        "",
        "| | |",
        "|---|---|",
        f"| run | {pool.wall_s:.0f} s, {len(records)} evaluations "
        f"({len(pool.rounds)} rounds; rounds × interval = {args.rounds * interval:g} s) |",
        f"| evaluations per second | {len(records) / pool.wall_s:.1f} sustained (what {n} "
        f"policies ask for at this interval); the first round drained {n} at once at "
        f"{n / pool.burst_s:.1f}/s |",
        f"| one full round of {n} | {pool.burst_s:.1f} s for the first (all {n} due at "
        f"once); later rounds spread: "
        + ", ".join(f"{s:.1f} s" for _, s in pool.rounds[1:])
        + " from first due to last end |",
        f"| evaluation latency p50 / p95 / max | {ms(latency)} |",
        f"| wait for a worker p50 / p95 / max | {ms(waits)} |",
        f"| due → end p50 / p95 / max | {ms(pool.timing.lateness)} (limit {interval:g} s) |",
        f"| end-to-end period per policy p50 / p95 / max | {ms(pool.timing.periods)} |",
        f"| **missed intervals** | **{len(pool.timing.misses)}** of "
        f"{pool.timing.evaluations} evaluations |",
        f"| CPU, cores (busy seconds / wall) | {cpu_line(pool.usage)} |",
        f"| CPU of the evaluating process / evaluations | {cpu_per_eval * 1000:.0f} ms |",
        f"| RSS of the evaluating process | {pool.rss_before:.0f} MiB before, peak "
        f"{pool.usage.rss_peak.get('operator', 0):.0f} MiB, {pool.rss_after:.0f} MiB after "
        f"(ru_maxrss {pool.maxrss:.0f} MiB) |",
        "| RSS of the others (peak) | "
        + ", ".join(
            f"{k} {v:.0f} MiB" for k, v in sorted(pool.usage.rss_peak.items()) if k != "operator"
        )
        + " |",
        f"| requests per evaluation | {per_eval_queries:.0f} Prometheus queries, "
        f"{per_eval_kube:.1f} Kubernetes calls |",
        f"| Prometheus query, client side p50 / p95 / max | {ms(pool.query_latencies)} |",
        f"| Prometheus query, server side (mean) | HTTP handler {prom['http'] * 1000:.1f} ms; "
        f"queue {prom['queue_time'] * 1000:.2f} ms, inner eval "
        f"{prom['inner_eval'] * 1000:.2f} ms ({prom['http_n']:.0f} queries) |",
        f"| urllib3 'connection pool is full' (connection discarded) | {pool.pool_full:,}; new "
        "connections: "
        + ", ".join(
            f"{setup['ports'].get(port, port)} {count:,}"
            for port, count in sorted(pool.new_connections.items())
        )
        + " |",
        f"| one evaluation alone ({SEQUENTIAL} in a row) | wall {ms(seq_wall)}; CPU "
        f"{statistics.fmean(seq_cpu) * 1000:.0f} ms mean |",
        "| decisions | " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()) + " |",
        "| exceptions out of `evaluate` | "
        + (
            "; ".join(f"{count} × `{text[10:]}`" for text, count in internal.most_common())
            or "none"
        )
        + " |",
        "",
        *part_table(records),
        "",
        "| Kubernetes call (during the run) | per evaluation | p50 / p95 / max |",
        "|---|---|---|",
        *(
            f"| {kind} | {len(values) / len(records):.2f} | {ms(values)} |"
            for kind, values in sorted(pool.kube_latencies.items())
        ),
        "",
    ]
    if kopf is not None:
        durations = [d for _, _, d in kopf.evaluations]
        lines += [
            f"#### 2. The real operator: `cachescale run` (kopf), {kopf.policies} policies, "
            f"observed through its `/metrics` every {POLL_S:g} s",
            "",
            "| | |",
            "|---|---|",
            f"| evaluations observed | {len(kopf.evaluations)} (counted against the "
            f"schedule: {kopf.timing.evaluations}) |",
            f"| first round ({kopf.policies} daemons start together) | {kopf.burst_s:.1f} s "
            "from the first start to the last end |",
            f"| evaluation latency p50 / p95 / max | {ms(durations)} "
            "(the operator's own histogram) |",
            f"| due → end p50 / p95 / max | {ms(kopf.timing.lateness)} (limit {interval:g} s) |",
            f"| **missed intervals** | **{len(kopf.timing.misses)}** |",
            f"| CPU, cores | {cpu_line(kopf.usage)} |",
            f"| RSS of `cachescale run` | peak {kopf.rss_peak:.0f} MiB "
            f"(VmHWM {kopf.hwm:.0f} MiB) |",
            "| decisions (operator counter) | "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(kopf.reasons.items()))
            + " |",
            "| evaluation errors | "
            + (", ".join(f"{k} {v:.0f}" for k, v in kopf.errors.items()) or "none")
            + " |",
            "",
        ]
    misses = pool.timing.misses + (kopf.timing.misses if kopf else [])
    verdict = "**met**" if not misses else f"**missed** ({len(misses)} late evaluations)"
    lines.append(f"Goal (every policy evaluated within its {interval:g} s interval): {verdict}.")
    lines.append("")
    return "\n".join(lines)


def append_results(path: Path, n: int, block: str) -> None:
    heading = f"## {HEADING.format(n=n)}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    intro = (
        f"{heading}\n\n`bench/bench_operator.py` (run: `python -m bench.bench_operator`; its "
        'docstring says what runs and how "on time" is judged). Each run is appended below.\n\n'
    )
    addition = block if heading in text else intro + block
    separator = (
        "" if text.endswith("\n\n") or not text else ("\n" if text.endswith("\n") else "\n\n")
    )
    path.write_text(text + separator + addition, encoding="utf-8")


# --- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="run length in intervals (>= 3)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds (spec interval)")
    parser.add_argument("--window", default="5m", help="spec window")
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument(
        "--kopf-policies",
        type=int,
        default=None,
        help="policies for the `cachescale run` measurement (default: --policies; 0: skip)",
    )
    parser.add_argument(
        "--same-series",
        action="store_true",
        help="every policy selects the same two pods' series (default: one set per policy)",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--no-append", action="store_true", help="print only")
    parser.add_argument("--workdir", type=Path, help="keep logs and the TSDB here")
    args = parser.parse_args(argv)
    if not PROMETHEUS.exists():
        print(f"{PROMETHEUS} not found (apt-get install -y prometheus)", file=sys.stderr)
        return 2
    kopf_n = args.policies if args.kopf_policies is None else args.kopf_policies
    names = [f"p{i:03d}" for i in range(args.policies)]
    facts = machine_facts()
    print("\n".join(facts), flush=True)
    warnings = PoolWarnings()
    warnings.install()
    with ExitStack() as stack:
        if args.workdir:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            import tempfile

            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-op-")))
        run_s = 600 + 3 * args.rounds * args.interval
        emulator_pid, addresses = stack.enter_context(run_emulator(workdir, run_s))
        groups = file_sd_groups(names, addresses, args.same_series)
        prometheus = stack.enter_context(run_prometheus(workdir, groups, args.scrape_interval))
        print(
            f"emulator {addresses}; prometheus {prometheus.url}; {len(groups)} targets", flush=True
        )
        objects = stack_objects(names, prometheus.url, args.interval, args.window, args.same_series)
        kmock = stack.enter_context(run_kmock(objects))
        print(f"kmock {kmock.url} (pid {kmock.pid}); waiting for scrapes", flush=True)
        wait_for_data(prometheus, len(groups), 120.0 + 4 * args.scrape_interval)
        rows = prometheus.query('count({job="cachescale-emulator"})')
        setup = {
            "names": names,
            "targets": len(groups),
            "series": int(float(rows[0]["value"][1])) if rows else 0,
            "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M"),
            "ports": {
                prometheus.url.rsplit(":", 1)[1]: "Prometheus",
                kmock.url.rsplit(":", 1)[1]: "kmock",
            },
        }
        pids = {"prometheus": prometheus.process.pid, "kmock": kmock.pid, "emulator": emulator_pid}
        print(f"pool phase: {len(names)} policies × {args.rounds} rounds", flush=True)
        pool = measure_pool(kmock, prometheus, names, args.interval, args.rounds, pids, warnings)
        pool.kube_requests = kmock.stop()
        kopf = None
        if kopf_n:
            kopf_names = names[:kopf_n]
            objects = stack_objects(
                kopf_names, prometheus.url, args.interval, args.window, args.same_series
            )
            fresh = stack.enter_context(run_kmock(objects))
            pids["kmock"] = fresh.pid
            print(f"kopf phase: `cachescale run`, {kopf_n} policies", flush=True)
            kopf = measure_kopf(workdir, fresh, kopf_names, args.interval, args.rounds, pids)
    block = render(args, facts, setup, pool, kopf)
    print()
    print(block)
    for miss in (pool.timing.misses + (kopf.timing.misses if kopf else []))[:20]:
        print("late:", miss, file=sys.stderr)
    if not args.no_append:
        append_results(args.results, len(names), block)
        print(f"appended to {args.results}")
    missed = pool.timing.misses or (kopf is not None and kopf.timing.misses)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
