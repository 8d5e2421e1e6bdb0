"""Real processes for integration tests: a Prometheus server and ``cachescale emulate``.

(Plus the small scenarios they run and an in-process emulator for the faster tests.)

Both run as plain subprocesses on loopback, the way a developer would run them: Prometheus
from the Debian package's binary with a throw-away TSDB and a 1 s scrape interval, the
emulator through ``python -m cachescale.emulator`` with a small, fast scenario. Nothing
here starts a system service. Helpers wait for readiness explicitly (``/-/ready``, targets
in file_sd, targets scraped) instead of sleeping, and kill what they started on exit.

Without ``/usr/bin/prometheus`` the Prometheus tests skip locally and fail under ``CI``
(``apt-get install -y prometheus`` provides it).
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prometheus_client import disable_created_metrics

from cachescale.commands.simulate import build_autoscaler
from cachescale.emulator.runtime import Emulator, EmulatorSettings, EngineKind
from cachescale.sim.run import Simulation
from cachescale.sim.scenario import Scenario
from tests.polling import wait_for
from tests.tools import require_tool

PROMETHEUS = Path("/usr/bin/prometheus")
SOURCE_ROOT = Path(__file__).resolve().parent.parent / "operator"
JOB = "cachescale-emulator"

T = TypeVar("T")

SMALL_SCENARIO: dict[str, Any] = {
    "name": "emulator-test",
    "description": "Two small pods under an HPA that scales down, then up, then rolls out.",
    "seed": 3,
    "duration_s": 90,
    "fleet": {
        "profile": "llama3-8b-a100",
        "max_num_seqs": 8,
        "replicas": 2,
        "pod_start_delay_s": 5,
        "router": "round_robin",
    },
    "workload": {
        "rate_per_s": 12,
        "tools": {"count": 2, "tokens_each": 100},
        "system_tokens": 300,
        "retrieval": {
            "topics": 20,
            "docs_per_topic": 4,
            "tokens_per_doc": 512,
            "chunk_size": 256,
            "top_k": 2,
            "mode": "per_topic",
        },
        "sessions": {"mean_turns": 2.0, "concurrent": 32},
        "output_tokens": {"mean_tokens": 60, "sigma": 0.2, "min_tokens": 20, "max_tokens": 120},
    },
    "autoscaler": {"min_replicas": 1, "max_replicas": 6, "target_average_value": 2},
    "perturbations": [{"kind": "rolling_restart", "at_s": 45}],
}
"""Runs 90 simulated seconds in ~0.2 s of CPU. Seed 3 under the HPA: engine-0 is drained
at 15 s, four pods are added at 30 s (ready at 35 s), and a rollout from 45 s replaces
every pod."""


def small_scenario(**overrides: Any) -> dict[str, Any]:
    """A copy of :data:`SMALL_SCENARIO` with top-level keys replaced."""
    return copy.deepcopy(SMALL_SCENARIO) | overrides


def fixed_fleet_scenario(replicas: int = 3, duration_s: float = 40) -> dict[str, Any]:
    """The small workload on a fixed fleet: every pod served from start to end."""
    scenario = small_scenario(autoscaler=None, perturbations=[], duration_s=duration_s)
    scenario["fleet"]["replicas"] = replicas
    return scenario


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_port_block(count: int) -> int:
    """A base port with ``count`` free ports from it, below Linux's ephemeral range.

    Ports handed out for port 0 (and to outgoing connections) come from the ephemeral
    range (32768-60999 by default), so a port below it that a test has just closed is not
    silently reused, and "nothing listens there any more" stays a meaningful check.
    """
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 32000 - count)
        if all(_is_free(port) for port in range(base, base + count)):
            return base
    raise AssertionError(f"no block of {count} free ports found")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def http_get(url: str, timeout_s: float = 5.0) -> bytes:
    """GET ``url`` and return the body (raises on connection errors and HTTP errors)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body: bytes = response.read()
        return body


def refuses_connections(address: str) -> bool:
    """Whether nothing listens on ``host:port`` any more."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _stop_process(process: subprocess.Popen[bytes], sig: int, timeout_s: float) -> int:
    """Send ``sig`` and wait; kill if it does not exit in time. Returns the exit code."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"process {process.args!r} ignored signal {sig}") from None
    return process.returncode


# -- the emulator -------------------------------------------------------------------------


def make_emulator(
    scenario: dict[str, Any], engine: EngineKind = "vllm", base_port: int | None = None
) -> Emulator:
    """An in-process emulator on ``scenario`` (drive it with ``advance_to``; ``close`` it)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    model = Scenario.model_validate(scenario)
    settings = EmulatorSettings(
        model_name="test-model", engine=engine, deployment=engine, base_port=base_port
    )
    return Emulator(Simulation(model, build_autoscaler("hpa", model)), settings)


class EmulatorProcess:
    """A running ``python -m cachescale.emulator`` and the files it keeps."""

    def __init__(self, process: subprocess.Popen[bytes], workdir: Path) -> None:
        self.process = process
        self.file_sd = workdir / "targets.json"
        self.truth_file = workdir / "truth.json"
        self.log = workdir / "emulator.log"

    def output(self) -> str:
        """Everything it printed so far (stdout and stderr)."""
        return self.log.read_text(encoding="utf-8")

    def targets(self) -> list[dict[str, Any]]:
        """The file_sd groups as written now ([] before the first write)."""
        if not self.file_sd.exists():
            return []
        groups: list[dict[str, Any]] = json.loads(self.file_sd.read_text(encoding="utf-8"))
        return groups

    def pods(self) -> set[str]:
        """The ``pod`` labels in file_sd now."""
        return {group["labels"]["pod"] for group in self.targets()}

    def wait_for_targets(self, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Wait until file_sd lists at least one pod; fail early if the process died."""

        def ready() -> list[dict[str, Any]] | None:
            if self.process.poll() is not None:
                raise AssertionError(f"emulator exited early:\n{self.output()}")
            return self.targets() or None

        return wait_for(ready, timeout_s, "the emulator's first targets")

    def truth(self) -> dict[str, Any]:
        """The latest ground-truth snapshot."""
        snapshot: dict[str, Any] = json.loads(self.truth_file.read_text(encoding="utf-8"))
        return snapshot

    def wait_until_done(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait for the snapshot written when the scenario has been fully simulated."""

        def done() -> dict[str, Any] | None:
            if not self.truth_file.exists():
                return None
            snapshot = self.truth()
            return snapshot if snapshot["done"] else None

        return wait_for(done, timeout_s, "the end of the scenario")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Signal it and wait for the exit code."""
        return _stop_process(self.process, sig, timeout_s)


@contextmanager
def run_emulator(
    workdir: Path, scenario: dict[str, Any], *flags: str, speed: float = 20.0
) -> Iterator[EmulatorProcess]:
    """Start the emulator on ``scenario`` with file_sd and ground truth in ``workdir``."""
    scenario_file = workdir / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "cachescale.emulator",
        "--scenario-file",
        str(scenario_file),
        "--speed",
        str(speed),
        "--write-file-sd",
        str(workdir / "targets.json"),
        "--ground-truth",
        str(workdir / "truth.json"),
        "--ground-truth-interval",
        "0.2",
        *flags,
    ]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")])
        )
    }
    with (workdir / "emulator.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    emulator = EmulatorProcess(process, workdir)
    try:
        yield emulator
    finally:
        _stop_process(process, signal.SIGTERM, 10.0)


# -- Prometheus ---------------------------------------------------------------------------


def prometheus_binary() -> Path:
    """The Prometheus binary, or a skip (locally) / failure (under CI) saying why not."""
    require_tool(
        PROMETHEUS.exists(),
        f"{PROMETHEUS} not found: install the Debian package (apt-get install -y prometheus)",
    )
    return PROMETHEUS


class PrometheusServer:
    """A running Prometheus, queried over its HTTP API."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data`` (fails on a non-success status)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        reply = json.loads(http_get(f"{self.url}/api/v1/{path}{query}"))
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def raw_samples(self, selector: str, at: float) -> dict[str, list[tuple[float, float]]]:
        """The samples a range selector (``metric{...}[12s]``) holds at Unix time ``at``,
        as ``(timestamp, value)`` pairs keyed by the ``pod`` label: exactly what a
        ``rate()`` over the same range, evaluated at ``at``, reads."""
        data = self.api("query", query=selector, time=f"{at:.3f}")
        assert data["resultType"] == "matrix", data
        return {
            row["metric"]["pod"]: [(float(t), float(v)) for t, v in row["values"]]
            for row in data["result"]
        }

    def by_pod(self, promql: str) -> dict[str, float]:
        """An instant query's values keyed by their ``pod`` label."""
        return {row["metric"]["pod"]: float(row["value"][1]) for row in self.query(promql)}

    def wait_for_targets_up(self, pods: set[str], timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Wait until the job's active targets are exactly ``pods``, each scraped and up."""

        def scraped() -> list[dict[str, Any]] | None:
            active = [
                target
                for target in self.api("targets", state="active")["activeTargets"]
                if target["labels"].get("job") == JOB
            ]
            seen = {target["labels"].get("pod") for target in active}
            healthy = all(target["health"] == "up" for target in active)
            return active if seen == pods and healthy else None

        return wait_for(scraped, timeout_s, f"Prometheus to scrape {sorted(pods)}")


PROMETHEUS_CONFIG = """\
global:
  scrape_interval: {scrape}s
  scrape_timeout: {timeout}s
  evaluation_interval: 1s
scrape_configs:
  - job_name: {job}
    honor_labels: {honor_labels}
    file_sd_configs:
      - files: ["{file_sd}"]
        refresh_interval: 1s
"""


@contextmanager
def run_prometheus(
    workdir: Path,
    file_sd: Path,
    scrape_interval_s: float = 1.0,
    *,
    scrape_timeout_s: float | None = None,
    honor_labels: bool = False,
) -> Iterator[PrometheusServer]:
    """Start Prometheus scraping the targets in ``file_sd`` (every second by default,
    within 10 s or the interval if shorter, unless ``scrape_timeout_s`` says otherwise;
    ``honor_labels`` keeps the targets' own ``namespace``/``pod`` labels, as an exporter
    serving many pods' series needs); wait until ready."""
    binary = prometheus_binary()
    config = workdir / "prometheus.yml"
    timeout_s = min(10.0, scrape_interval_s) if scrape_timeout_s is None else scrape_timeout_s
    text = PROMETHEUS_CONFIG.format(
        scrape=f"{scrape_interval_s:g}",
        timeout=f"{timeout_s:g}",
        job=JOB,
        honor_labels=str(honor_labels).lower(),
        file_sd=file_sd,
    )
    config.write_text(text, encoding="utf-8")
    port = free_port()
    log = workdir / "prometheus.log"
    command = [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT)
    server = PrometheusServer(process, port, log)
    try:
        wait_for(lambda: _ready(server), 30.0, "Prometheus /-/ready")
        yield server
    finally:
        _stop_process(process, signal.SIGTERM, 15.0)


def _ready(server: PrometheusServer) -> bool | None:
    if server.process.poll() is not None:
        raise AssertionError(f"Prometheus exited early:\n{server.log.read_text()}")
    try:
        http_get(f"{server.url}/-/ready", timeout_s=1.0)
    except OSError:
        return None
    return True
