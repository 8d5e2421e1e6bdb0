"""The fleet ``bench_fleet`` measures, stood up on loopback, and the components' own counters.

Stands up what the "What runs" part of bench/bench_fleet.py's docstring describes: the
engines' series (:class:`Fleet`, one HTTP thread serving ``bench/vllm_engine.prom`` once
per policy, in shards), the tests' Prometheus scraping them, etcd and kube-apiserver from
the e2e harness, and every policy's Deployment, pod, HPA and policy created in bulk; then
reads what each component counts of itself (kube-apiserver's and Prometheus's requests, a
process's CPU time and peak RSS). Apart from the measurement, which only uses these, so a
reader of either finds one concern: how the fleet is built, or how it is measured.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import math
import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import urllib3
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness.cluster import tool
from e2e.harness.control_plane import ControlPlane
from tests.controller.cluster import NAMESPACE, deployment, hpa, pods, policy
from tests.polling import wait_for
from tests.prometheus_fixture import PrometheusServer, run_prometheus

ROOT = Path(__file__).resolve().parent.parent
ENGINE = Path(__file__).with_name("vllm_engine.prom")
ENGINE_AGE_S = 280.0
"""Simulated seconds behind ``vllm_engine.prom``'s counters: they grow by value/age per s."""
SHARD = 500
SCRAPE_S = 15
WINDOWS = ("2m", "5m")
CLK_TCK = os.sysconf("SC_CLK_TCK")
OPERATOR_RESOURCES = frozenset(
    [
        "cachescalingpolicies",
        "deployments",
        "horizontalpodautoscalers",
        "pods",
        "events",
        "replicasets",
        "configmaps",
        "secrets",
        "scaledobjects",
        "kopfpeerings",
        "clusterkopfpeerings",
    ]
)
"""What the operator reads and writes; the API server's own loopback clients (lease
renewals, its informers' periodic re-watches) touch others, and are left out."""
POLICIES = f"/apis/cachescale.dev/v1alpha1/namespaces/{NAMESPACE}/cachescalingpolicies"


def name_of(k: int) -> str:
    return f"p{k:05d}"


def groupable(k: int) -> bool:
    """Nine policies in ten share label names; the tenth has one of its own."""
    return k % 10 != 9


# --- the engines' series --------------------------------------------------------------------


class Fleet:
    """The exposition of every policy's engine, cut into shards of :data:`SHARD`."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.started = time.time()
        kinds: dict[str, str] = {}
        self.series: list[tuple[str, str, float, bool]] = []
        for line in ENGINE.read_text(encoding="utf-8").splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split()
                kinds[family] = kind
            elif line and not line.startswith("#"):
                head, value = line.rsplit(" ", 1)
                name, _, labels = head.partition("{")
                family = re.sub(r"_(bucket|sum|count)$", "", name)
                growing = kinds.get(family, kinds.get(name)) != "gauge"
                self.series.append((name, labels.rstrip("}"), float(value), growing))

    def shard(self, index: int) -> bytes:
        """Shard ``index``'s exposition now, each sample stamped with the time its value
        is for: Prometheus would otherwise stamp it with the scrape's start, and on a
        loaded machine the render's lag behind that varies by tenths of a second, enough
        to move a 2-minute rate (and the cost per request read from it) by its display
        precision."""
        now = time.time()
        grown = 1.0 + (now - self.started) / ENGINE_AGE_S
        stamp = round(now * 1000)
        lines = []
        for k in range(index * SHARD, min(self.count, (index + 1) * SHARD)):
            name = name_of(k)
            own = "" if groupable(k) else f',adapter_{name}="lora"'
            labels = f'namespace="{NAMESPACE}",model_name="{name}",pod="{name}-0"{own}'
            for metric, extra, value, growing in self.series:
                shown = value * grown if growing else value
                lines.append(f"{metric}{{{labels},{extra}}} {shown!r} {stamp}\n")
        return "".join(lines).encode()

    @contextmanager
    def serve(self) -> Iterator[int]:
        """Serve ``/shard/N`` on a free port until the context closes."""
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = fleet.shard(int(self.path.rsplit("/", 1)[1]))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield int(server.server_address[1])
        finally:
            server.shutdown()


@contextmanager
def prometheus(workdir: Path, exporter_port: int, shards: int) -> Iterator[PrometheusServer]:
    """The tests' Prometheus (``run_prometheus``) scraping every shard every
    :data:`SCRAPE_S`, within the interval, keeping the shards' own labels."""
    targets = [
        {
            "targets": [f"127.0.0.1:{exporter_port}"],
            "labels": {"__metrics_path__": f"/shard/{i}", "shard": str(i)},
        }
        for i in range(shards)
    ]
    file_sd = workdir / "targets.json"
    file_sd.write_text(json.dumps(targets), encoding="utf-8")
    with run_prometheus(
        workdir, file_sd, SCRAPE_S, scrape_timeout_s=SCRAPE_S, honor_labels=True
    ) as server:
        yield server


# --- the API server ------------------------------------------------------------------------


def envtest_assets(workdir: Path) -> Path:
    """etcd and kube-apiserver only (no controller-manager), in a directory of links."""
    source = (
        os.environ.get("KUBEBUILDER_ASSETS")
        or subprocess.run(
            [str(ROOT / "scripts" / "envtest-assets.sh")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    assets = workdir / "assets"
    assets.mkdir()
    for binary in ("etcd", "kube-apiserver"):
        (assets / binary).symlink_to(Path(source) / binary)
    return assets


class Kube:
    """A keep-alive JSON client with the admin's certificate, for bulk creation."""

    def __init__(self, plane: ControlPlane, threads: int) -> None:
        credentials = plane.admin_api().credentials
        self.pool = urllib3.PoolManager(
            maxsize=threads,
            ca_certs=str(credentials.ca_file),
            cert_file=str(credentials.cert_file),
            key_file=str(credentials.key_file),
        )
        self.server = credentials.server.rstrip("/")

    def send(self, method: str, path: str, body: Any = None, patch: bool = False) -> bytes:
        kind = "application/merge-patch+json" if patch else "application/json"
        answer = self.pool.request(
            method,
            self.server + path,
            body=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": kind},
            timeout=60.0,
        )
        if answer.status >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status} {answer.data[:300]!r}")
        return bytes(answer.data)


def create_policy(kube: Kube, k: int, prometheus_port: int, since: str) -> None:
    """Deployment (settled), its pod (ready for an hour), HPA, policy (memory seeded): each
    created, then given its status."""
    name = name_of(k)
    apps = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    kube.send("POST", apps, deployment(name, replicas=1))
    settled = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1}
    settled |= {"readyReplicas": 1, "availableReplicas": 1}
    kube.send("PATCH", f"{apps}/{name}/status", {"status": settled}, patch=True)
    [pod] = pods(name, 1, dt.datetime.fromisoformat(since), age_s=0.0)
    ready = {"status": {"phase": "Running", **pod.pop("status")}}
    engine = {"name": "vllm", "image": "vllm/vllm-openai:v0.13.0"}
    pod["spec"] = {"containers": [engine], "automountServiceAccountToken": False}
    kube.send("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    kube.send("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}-0/status", ready, patch=True)
    body = hpa(name, target=name, min_replicas=1)
    kube.send("POST", f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers", body)
    host = "127.0.0.1" if k % 2 == 0 else "localhost"
    selector = {"namespace": NAMESPACE, "model_name": name}
    if not groupable(k):
        selector[f"adapter_{name}"] = "lora"
    metrics = {
        "prometheusUrl": f"http://{host}:{prometheus_port}",
        "selector": selector,
        "window": WINDOWS[(k // 2) % 2],
        "interval": "30s",
    }
    spec = policy(name, prometheus_url="", deployment_name=name, hpa_name=name)
    spec["spec"]["metrics"] = metrics
    spec["spec"]["budget"]["minReplicas"] = 1
    for key in ("uid", "generation"):
        del spec["metadata"][key]
    kube.send("POST", POLICIES, spec)
    memory = {"status": {"memory": {"dataSince": since}}}
    kube.send("PATCH", f"{POLICIES}/{name}/status", memory, patch=True)


def create_fleet(plane: ControlPlane, count: int, prometheus_port: int, threads: int) -> float:
    """Every policy's objects, ``threads`` at a time; the wall seconds it took."""
    admin = plane.admin_api()
    admin.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    # Pods need the namespace's default ServiceAccount, which the (absent)
    # controller-manager would create.
    admin.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}})
    crd = ROOT / "crds" / "cachescalingpolicies.cachescale.dev.yaml"
    applied = subprocess.run(
        [str(tool("kubectl")), "--kubeconfig", str(plane.kubeconfig), "apply", "-f", str(crd)],
        capture_output=True,
        text=True,
        check=False,
    )
    if applied.returncode != 0:
        raise RuntimeError(applied.stderr)
    kube = Kube(plane, threads)

    def served() -> bool | None:
        try:
            return bool(kube.send("GET", POLICIES))
        except RuntimeError:  # 404 until the CRD is established
            return None

    wait_for(served, 30.0, "the policy CRD served", every_s=0.5)
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: create_policy(kube, k, prometheus_port, since), range(count)))
    return time.monotonic() - started


# --- counters ------------------------------------------------------------------------------


def samples(text: str, wanted: str) -> Iterator[tuple[dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == wanted:
                yield sample.labels, sample.value


def api_requests(kube: Kube) -> dict[str, float]:
    """kube-apiserver's requests so far, by "VERB resource[/subresource]"."""
    out: dict[str, float] = collections.defaultdict(float)
    for labels, value in samples(kube.send("GET", "/metrics").decode(), "apiserver_request_total"):
        if labels.get("resource") in OPERATOR_RESOURCES:
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            out[f"{labels['verb']} {labels['resource']}{sub}"] += value
    return out


def prometheus_requests(port: int) -> dict[str, float]:
    """Prometheus's HTTP API requests so far, by handler."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    out: dict[str, float] = collections.defaultdict(float)
    for labels, value in samples(text, "prometheus_http_requests_total"):
        if labels["handler"].startswith("/api/"):
            out[labels["handler"]] += value
    return out


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan
