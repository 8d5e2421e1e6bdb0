"""``cachescale emulate --pods-of`` on a real API server: the quickstart without a GPU.

A real Deployment (``pause`` standing in for vLLM) and its HPA, with pods named by the real
Deployment and ReplicaSet controllers; a decoy Deployment beside it in the same namespace.
``cachescale emulate --pods-of NAMESPACE/vllm`` reads the Deployment's pods through the
kubeconfig and writes file_sd with their names; a real Prometheus scrapes it; the operator
(as the chart's ServiceAccount, reading the chart's default Prometheus, as the quickstart
sets it up) evaluates an Advise policy on the Deployment. Nothing in the test names a pod.

The operator matches the series' ``pod`` label against the pods it reads from the API: the
warm-pod hit rate (``status.signals.tokenHitRate``) is known only for pods whose age it
has, so a known hit rate shows the names matched, beside ``MetricsAvailable=True``. A pod
deleted while the emulator runs is followed: its replacement's name takes over the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, condition_of, get, ready_pods, until
from e2e.serving import APP, create_stack
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import start_operator
from tests.prometheus_fixture import fixed_fleet_scenario, run_emulator, run_prometheus

MODEL = "llama-3-8b"
PODS = 2
DECOY = "decoy"


def decoy_deployment(cluster: Cluster, namespace: str) -> str:
    """A second Deployment in the namespace, labelled apart; its one pod's name."""
    body = get(cluster, "deployment", APP, "-n", namespace)
    spec = body["spec"]
    spec["replicas"] = 1
    spec["selector"] = {"matchLabels": {"app": DECOY}}
    spec["template"]["metadata"]["labels"] = {"app": DECOY}
    apply(
        cluster,
        namespace,
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": DECOY}, "spec": spec},
    )
    found = until(
        lambda: ready_pods(cluster, namespace, f"app={DECOY}") or None, "the decoy's pod", 90
    )
    return str(found[0]["metadata"]["name"])


def scenario() -> dict[str, Any]:
    """Two fixed vLLM pods under steady load, longer than the test runs."""
    body = fixed_fleet_scenario(replicas=PODS, duration_s=3600)
    body["workload"]["rate_per_s"] = 8
    return body


def advise_policy(namespace: str) -> dict[str, Any]:
    """An Advise policy on the Deployment with no ``prometheusUrl``: the operator's default."""
    body = policy_body(
        APP,
        prometheus_url="unused",
        mode="Advise",
        extra={"metrics": {"selector": {"namespace": namespace, "model_name": MODEL}}},
    )
    body["spec"]["metrics"].pop("prometheusUrl")
    body["metadata"] = {"name": APP}
    return body


def signals_read(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    """The policy's status once MetricsAvailable is True and the warm hit rate is known."""
    status = (get(cluster, "csp", APP, "-n", namespace) or {}).get("status", {})
    available = condition_of({"status": status}, "MetricsAvailable")
    if available is None or available["status"] != "True":
        return None
    return status if status.get("signals", {}).get("tokenHitRate") is not None else None


def replaced(cluster: Cluster, namespace: str, gone: str) -> set[str] | None:
    """The Deployment's ready pods once ``gone`` has been replaced."""
    names = {p["metadata"]["name"] for p in ready_pods(cluster, namespace, f"app={APP}")}
    return names if gone not in names and len(names) == PODS else None


def test_a_policy_reads_the_emulator_as_the_real_deployments_pods(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    _, pods = create_stack(cluster, namespace, MODEL, PODS)
    decoy = decoy_deployment(cluster, namespace)
    flags = (
        "--pods-of", f"{namespace}/{APP}", "--kubeconfig", str(cluster.kubeconfig),
        "--model-name", MODEL,
    )  # fmt: skip
    with (
        run_emulator(tmp_path, scenario(), *flags, speed=4.0) as emulator,
        run_prometheus(tmp_path, emulator.file_sd) as prometheus,
    ):
        emulator.wait_for_targets()
        assert emulator.pods() == set(pods), emulator.output()
        assert decoy not in emulator.pods()
        assert {group["labels"]["namespace"] for group in emulator.targets()} == {namespace}
        prometheus.wait_for_targets_up(set(pods), timeout_s=30)

        kubeconfig = cluster.token_kubeconfig(
            tmp_path / "operator.kubeconfig", release.namespace, release.service_account
        )
        with start_operator(
            tmp_path, kubeconfig, "--namespace", namespace, "--standalone",
            "--default-prometheus-url", prometheus.url,
        ):  # fmt: skip
            apply(cluster, namespace, advise_policy(namespace))
            status = until(lambda: signals_read(cluster, namespace), "signals read", 120)
        assert status["signals"]["warmReplicas"] == PODS
        assert "(the operator's default)" in status["signals"]["prometheus"]
        series = prometheus.by_pod(f'vllm:num_requests_running{{namespace="{namespace}"}}')
        assert set(series) == set(pods)

        # The ReplicaSet replaces a deleted pod under a new name: the target follows it.
        gone = pods[0]
        deleted = cluster.kubectl("delete", "pod", gone, "-n", namespace, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        now = until(lambda: replaced(cluster, namespace, gone), f"{gone} replaced", 90)
        until(lambda: emulator.pods() == now or None, "file_sd to follow the pods", 30)
        prometheus.wait_for_targets_up(now, timeout_s=30)
    assert f"- {namespace}/{gone}" in emulator.output()
