"""The fleet ``bench_fleet`` measures, stood up on loopback, and the components' own counters.

Stands up what the "What runs" part of bench/bench_fleet.py's docstring describes: the
tests' Prometheus scraping the engines' series (``bench/fleet_engines.py``), etcd and
kube-apiserver from the e2e harness, and every policy's namespace, Deployment, pod, HPA
and policy created in bulk (laid out by ``bench/fleet_shape.py``); restarts pods during
a measured window (:class:`Rollout`); then reads what each component counts of itself
(kube-apiserver's and Prometheus's requests, a process's CPU time and peak RSS). Apart
from the measurement, which only uses these, so a reader of either finds one concern:
how the fleet is built, or how it is measured.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import math
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import urllib3
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_engines import Engines
from bench.fleet_shape import SHARD_LABEL, Shape, groupable, name_of
from e2e.harness.cluster import tool
from e2e.harness.control_plane import ControlPlane
from tests.controller.cluster import deployment, hpa, pods, policy
from tests.polling import wait_for
from tests.prometheus_fixture import PrometheusServer, run_prometheus

ROOT = Path(__file__).resolve().parent.parent
SCRAPE_S = 15
WINDOWS = ("2m", "5m")
POD_WARMUP_S = 600
"""The policies' ``cache.podWarmupSeconds``, the CRD's default: the fleet's first pods
(ready an hour back) are warm from the start, a restarted one (``Rollout``) is cold for
10 minutes, so its one-pod policy waits for it (``WaitingForWarmPods``), as in a cluster."""
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


def policies_path(namespace: str) -> str:
    return f"/apis/cachescale.dev/v1alpha1/namespaces/{namespace}/cachescalingpolicies"


# --- Prometheus ----------------------------------------------------------------------------


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


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``obj`` (one of the tests' objects, made for their namespace) moved to ``namespace``."""
    obj["metadata"]["namespace"] = namespace
    return obj


def create_pod(kube: Kube, namespace: str, app: str, pod_name: str, ready_since: str) -> None:
    """Pod ``pod_name`` of Deployment ``app``, Running and ready since ``ready_since``
    (ISO 8601), started then: created, then given its status (2 requests)."""
    [pod] = pods(app, 1, dt.datetime.fromisoformat(ready_since), age_s=0.0)
    pod["metadata"]["name"] = pod_name
    status = {"phase": "Running", "startTime": ready_since, **pod.pop("status")}
    engine = {"name": "vllm", "image": "vllm/vllm-openai:v0.13.0"}
    pod["spec"] = {"containers": [engine], "automountServiceAccountToken": False}
    kube.send("POST", f"/api/v1/namespaces/{namespace}/pods", in_namespace(pod, namespace))
    path = f"/api/v1/namespaces/{namespace}/pods/{pod_name}/status"
    kube.send("PATCH", path, {"status": status}, patch=True)


def prometheus_url(shape: Shape, k: int, prometheus_port: int, slow_port: int | None) -> str:
    """Policy ``k``'s Prometheus: ``127.0.0.1`` or ``localhost`` by turns, or the slow
    proxy (``localhost`` too) for a policy of ``shape.slowed``."""
    if k in shape.slowed:
        assert slow_port is not None, "a slowed fleet needs its proxy"
        return f"http://localhost:{slow_port}"
    return f"http://{'127.0.0.1' if k % 2 == 0 else 'localhost'}:{prometheus_port}"


def create_policy(kube: Kube, shape: Shape, k: int, url: str, since: str) -> None:
    """Deployment (settled), its pod (ready for an hour), HPA, policy (memory seeded, its
    Prometheus ``url``): each created, then given its status. With shards, the policy is
    labelled with its own."""
    name, namespace = name_of(k), shape.namespace(k)
    apps = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    kube.send("POST", apps, in_namespace(deployment(name, replicas=1), namespace))
    settled = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1}
    settled |= {"readyReplicas": 1, "availableReplicas": 1}
    kube.send("PATCH", f"{apps}/{name}/status", {"status": settled}, patch=True)
    create_pod(kube, namespace, name, f"{name}-0", since)
    body = in_namespace(hpa(name, target=name, min_replicas=1), namespace)
    kube.send("POST", f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers", body)
    selector = {"namespace": namespace, "model_name": name}
    if not groupable(k):
        selector[f"adapter_{name}"] = "lora"
    metrics = {
        "prometheusUrl": url,
        "selector": selector,
        "window": WINDOWS[(k // 2) % 2],
        "interval": "30s",
    }
    spec = in_namespace(
        policy(name, prometheus_url="", deployment_name=name, hpa_name=name), namespace
    )
    spec["spec"]["metrics"] = metrics
    spec["spec"]["budget"]["minReplicas"] = 1
    spec["spec"]["cache"]["podWarmupSeconds"] = POD_WARMUP_S
    for key in ("uid", "generation"):
        del spec["metadata"][key]
    if shape.shards > 1:
        spec["metadata"]["labels"] = {SHARD_LABEL: str(shape.shard(k))}
    policies = policies_path(namespace)
    kube.send("POST", policies, spec)
    memory = {"status": {"memory": {"dataSince": since}}}
    kube.send("PATCH", f"{policies}/{name}/status", memory, patch=True)


def create_fleet(
    plane: ControlPlane,
    shape: Shape,
    prometheus_port: int,
    threads: int,
    slow_port: int | None = None,
) -> float:
    """Every namespace, then every policy's objects, ``threads`` at a time; the wall
    seconds the policies' objects took. ``slow_port``: the slow proxy's, for the
    policies of ``shape.slowed``."""
    admin = plane.admin_api()
    for namespace in shape.all_namespaces():
        admin.post("/api/v1/namespaces", {"metadata": {"name": namespace}})
        # Pods need the namespace's default ServiceAccount, which the (absent)
        # controller-manager would create.
        account = {"metadata": {"name": "default"}}
        admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
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
            return bool(kube.send("GET", policies_path(shape.namespace(0))))
        except RuntimeError:  # 404 until the CRD is established
            return None

    wait_for(served, 30.0, "the policy CRD served", every_s=0.5)
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()

    def create(k: int) -> None:
        url = prometheus_url(shape, k, prometheus_port, slow_port)
        create_policy(kube, shape, k, url, since)

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(shape.count)))
    return time.monotonic() - started


RESTART_REQUESTS = ("DELETE pods", "POST pods", "PATCH pods/status")
"""The API requests of one pod restart (:meth:`Rollout.restart`)."""


class Rollout:
    """Restarts the pods of ``shape.restarts`` in a thread, spread evenly over ``span_s``
    from its start: each pod deleted, and a new one (the next name, ready from now)
    created in its place, as a Deployment's rollout would replace it; its engine's series
    follow the new pod from then on. Counts the API requests it sends (``sent``, by
    "VERB resource[/subresource]" as :func:`api_requests`), so the bench can leave them
    out of the operator's."""

    def __init__(self, kube: Kube, shape: Shape, engines: Engines) -> None:
        self.kube, self.shape, self.engines = kube, shape, engines
        self.sent = dict.fromkeys(RESTART_REQUESTS, 0.0)
        self.failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, span_s: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(span_s,), daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for every restart; raise what failed."""
        if self._thread is not None:
            self._thread.join()
        if self.failure is not None:
            raise RuntimeError(f"a pod restart failed: {self.failure}") from self.failure

    def _run(self, span_s: float) -> None:
        began = time.time()
        restarts = self.shape.restarts
        try:
            for i, k in enumerate(restarts):
                time.sleep(max(0.0, began + span_s * i / len(restarts) - time.time()))
                self.restart(k)
        except Exception as failure:  # raised again by join
            self.failure = failure

    def restart(self, k: int) -> None:
        name, namespace = name_of(k), self.shape.namespace(k)
        old = self.engines.pods[k][0]
        new = f"{name}-{int(old.rsplit('-', 1)[1]) + 1}"
        gone = {"gracePeriodSeconds": 0}
        self.kube.send("DELETE", f"/api/v1/namespaces/{namespace}/pods/{old}", gone)
        now = time.time()
        create_pod(
            self.kube, namespace, name, new, dt.datetime.fromtimestamp(now, dt.UTC).isoformat()
        )
        self.engines.restarted(k, new, now)
        for request in RESTART_REQUESTS:
            self.sent[request] += 1


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
