"""The harness itself: RBAC is on, and the real controllers plus the node stand-in turn a
Deployment into Running, Ready pods with real owners, names and creation times."""

from __future__ import annotations

import pytest

from e2e.harness.cluster import Cluster
from e2e.kube_helpers import PAUSE, apply, get, ready_pods, until


def test_rbac_is_enforced(cluster: Cluster, namespace: str) -> None:
    created = cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    assert created.returncode == 0, created.stderr
    can = cluster.kubectl(
        "auth", "can-i", "list", "pods", "-n", namespace,
        f"--as=system:serviceaccount:{namespace}:nobody",
    )  # fmt: skip
    assert can.stdout.strip() == "no", can.stdout + can.stderr


def test_a_deployment_gets_running_ready_pods(cluster: Cluster, namespace: str) -> None:
    if cluster.envtest and not cluster.plane.has_controller_manager:  # type: ignore[union-attr]
        pytest.skip("KUBEBUILDER_ASSETS has no kube-controller-manager: no Deployment controller")
    labels = {"app": "web"}
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": PAUSE}]},
                },
            },
        },
    )
    pods = until(
        lambda: (
            ready_pods(cluster, namespace, "app=web") or None
            if len(ready_pods(cluster, namespace, "app=web")) == 2
            else None
        ),
        "two Ready pods",
        60,
    )
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["containerStatuses"][0]["ready"] is True
        assert pod["spec"]["nodeName"]

    def available() -> bool | None:
        status = get(cluster, "deployment", "web", "-n", namespace)["status"]
        return True if status.get("availableReplicas") == 2 else None

    until(available, "the Deployment to report 2 available replicas", 60)
