"""A serving stack on the real API server, with its metrics from ``cachescale emulate``.

The Deployment is real (a ``pause`` container stands in for vLLM, requesting one GPU of
the node stand-in's capacity), so its pods are made by the real Deployment and ReplicaSet
controllers, with real names and creation times. The engines' metrics come from
``cachescale emulate`` on loopback, one port per emulated pod (``--base-port``), and a
real Prometheus scrapes them with each target labelled with the name of a real pod, as
Kubernetes service discovery labels a real engine's series. Nothing is named to match:
the emulated pods are named after the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.harness.cluster import Cluster
from e2e.kube_helpers import PAUSE, apply, ready_pods, until
from tests.controller.cluster import deployment as deployment_body
from tests.controller.cluster import hpa as hpa_body
from tests.polling import wait_for
from tests.prometheus_fixture import (
    EmulatorProcess,
    PrometheusServer,
    free_port_block,
    prometheus_binary,
    run_emulator,
    run_prometheus,
)

APP = "vllm"


def create_serving_deployment(
    cluster: Cluster, namespace: str, model: str, replicas: int, max_num_seqs: int = 32
) -> list[str]:
    """The serving Deployment (``pause`` standing in for vLLM); waits for ``replicas``
    Ready pods and returns their names."""
    body = deployment_body(
        APP, replicas=replicas, gpus=1, args=["--model", model, "--max-num-seqs", str(max_num_seqs)]
    )
    engine = body["spec"]["template"]["spec"]["containers"][1]
    engine["image"] = PAUSE
    body["spec"]["template"]["spec"]["containers"] = [engine]
    body["metadata"] = {"name": APP}
    body.pop("status")
    apply(cluster, namespace, body)

    def all_ready() -> list[str] | None:
        pods = ready_pods(cluster, namespace, f"app={APP}")
        return sorted(p["metadata"]["name"] for p in pods) if len(pods) == replicas else None

    return until(all_ready, f"{replicas} Ready pods of Deployment {APP}", 90)


def create_stack(
    cluster: Cluster, namespace: str, model: str, replicas: int, max_num_seqs: int = 32
) -> tuple[dict[str, Any], list[str]]:
    """The Deployment and its HPA (min 2, max 40, 24 running requests per pod); waits for
    ``replicas`` Ready pods; returns the HPA's spec as created and the pods' names."""
    autoscaler = hpa_body(APP, min_replicas=2, max_replicas=40, average_value="24")
    autoscaler["metadata"] = {"name": APP}
    autoscaler.pop("status", None)
    names = create_serving_deployment(cluster, namespace, model, replicas, max_num_seqs)
    apply(cluster, namespace, autoscaler)
    return dict(autoscaler["spec"]), names


def write_targets(path: Path, namespace: str, base_port: int, pods: list[str]) -> None:
    """file_sd for Prometheus: emulated engine N (on base_port + N) is real pod N."""
    groups = [
        {
            "targets": [f"127.0.0.1:{base_port + index}"],
            "labels": {"namespace": namespace, "pod": pod},
        }
        for index, pod in enumerate(pods)
    ]
    _write_json(path, groups)


def _write_json(path: Path, groups: list[dict[str, Any]]) -> None:
    """Replace ``path`` atomically (Prometheus may read it at any moment)."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(groups), encoding="utf-8")
    partial.replace(path)


@dataclass
class Metrics:
    """The emulator and the Prometheus that scrapes it under the real pods' names."""

    emulator: EmulatorProcess
    prometheus: PrometheusServer
    targets: Path
    base_port: int
    namespace: str

    def point(self, pairs: list[tuple[int, str]]) -> None:
        """Scrape the emulated engine on each port as the named real pod."""
        groups = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": self.namespace, "pod": pod}}
            for port, pod in pairs
        ]
        _write_json(self.targets, groups)


@contextmanager
def emulated_metrics(
    workdir: Path,
    namespace: str,
    model: str,
    scenario: dict[str, Any],
    pods: list[str],
    speed: float,
) -> Iterator[Metrics]:
    """Start ``cachescale emulate`` on ``scenario`` and Prometheus on the real pod names;
    wait until every pod is scraped and has a rate."""
    prometheus_binary()
    base_port = free_port_block(len(pods))
    targets = workdir / "pods.json"
    write_targets(targets, namespace, base_port, pods)
    flags = (
        "--namespace", namespace, "--model-name", model, "--linger", "30",
        "--base-port", str(base_port), "--ground-truth-interval", "1",
    )  # fmt: skip
    with ExitStack() as stack:
        emulator = stack.enter_context(run_emulator(workdir, scenario, *flags, speed=speed))
        prometheus = stack.enter_context(run_prometheus(workdir, targets))
        emulator.wait_for_targets()
        prometheus.wait_for_targets_up(set(pods), timeout_s=30)
        metrics = Metrics(emulator, prometheus, targets, base_port, namespace)
        wait_for_rates(metrics, model, len(pods))
        yield metrics


def wait_for_rates(metrics: Metrics, model: str, count: int, timeout_s: float = 30.0) -> None:
    """Until every pod's counters have two samples, so the first evaluation reads rates."""
    selector = f'{{namespace="{metrics.namespace}",model_name="{model}"}}'
    query = f"rate(vllm:prefix_cache_queries_total{selector}[1m])"
    wait_for(
        lambda: True if len(metrics.prometheus.query(query)) >= count else None,
        timeout_s,
        "Prometheus to hold rates for every emulated pod",
        every_s=0.2,
    )
