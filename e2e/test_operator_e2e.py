"""The whole path on a real Kubernetes API server (kind or any conformant cluster).

What runs where: the API server is the cluster's; the CRD is the one the Helm chart
renders (`helm template --show-only templates/crd.yaml`, applied server-side);
the serving Deployment and its HPA are real objects (a `pause` container stands in for
vLLM: no GPU needed); the engines' metrics come from `cachescale emulate` on this
machine, scraped by a real Prometheus here; the operator runs out of cluster
(`cachescale run --kubeconfig $KUBECONFIG`). The emulated pods are named like three bare
Pods created in the namespace with the Deployment's label, so the operator finds their
ages on the Kubernetes side, as it would for real engine pods.

The scenario is the incident's release mid-run (tests/controller/test_operator_process.py
explains the numbers). Asserted: the Warning Event `PrefixCollapse`, `CacheHealthy=False`,
the HPA's maxReplicas held, `kubectl describe csp` showing the evidence, and on deletion
the HPA's original envelope restored. About 3 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cachescale.controller.kube import KubeApi, NotFoundError, load_config

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
PAUSE = "registry.k8s.io/pause:3.10"
TIMEOUT_S = 240.0


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, check=False
    )


def apply(namespace: str, obj: dict[str, Any]) -> None:
    result = kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(obj))
    assert result.returncode == 0, result.stderr


def until(check: Callable[[], T | None], what: str, timeout_s: float = TIMEOUT_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result is not None:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"cachescale-e2e-{uuid.uuid4().hex[:6]}"
    created = kubectl("create", "namespace", name)
    assert created.returncode == 0, created.stderr
    yield name
    kubectl("delete", "namespace", name, "--wait=false")


def install_crd_from_the_chart() -> None:
    """The CRD exactly as the chart renders it (the operator itself runs out of cluster
    here, so the chart's Deployment is not installed)."""
    helm = shutil.which("helm") or str(REPO / ".tools" / "bin" / "helm")
    if not Path(helm).exists():
        pytest.skip("helm is not installed (make tools)")
    rendered = subprocess.run(
        [
            helm,
            "template",
            "cachescale",
            str(REPO / "charts" / "cachescale"),
            "--show-only",
            "templates/crd.yaml",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    applied = kubectl("apply", "--server-side", "-f", "-", stdin=rendered.stdout)
    assert applied.returncode == 0, applied.stderr
    waited = kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/cachescalingpolicies.cachescale.dev",
    )
    assert waited.returncode == 0, waited.stderr


def stack(namespace: str, prometheus_url: str, pods: list[str], model: str) -> dict[str, Any]:
    """The Deployment (pause), three bare Pods named like the emulated engines, the HPA,
    and returns the HPA's spec as created."""
    from cluster import deployment, hpa

    dep = deployment("vllm", replicas=3, gpus=0, args=["--model", model, "--max-num-seqs", "32"])
    dep["metadata"]["namespace"] = namespace
    engine = dep["spec"]["template"]["spec"]["containers"][1]
    engine["image"] = PAUSE
    engine.pop("resources")
    dep["spec"]["template"]["spec"]["containers"] = [engine]
    dep.pop("status")
    apply(namespace, dep)
    for name in pods:
        apply(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": PAUSE}]},
            },
        )
    autoscaler = hpa("vllm", min_replicas=2, max_replicas=40, average_value="24")
    autoscaler["metadata"]["namespace"] = namespace
    apply(namespace, autoscaler)
    for name in pods:
        ready = kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", "--timeout=120s", f"pod/{name}"
        )
        assert ready.returncode == 0, ready.stderr
    return dict(autoscaler["spec"])


def test_a_collapse_is_held_explained_and_undone_on_a_real_api_server(
    namespace: str, tmp_path: Path
) -> None:
    import test_operator_process as scenario
    from cluster import policy as policy_body
    from process_fixture import run_operator

    from prometheus_fixture import prometheus_binary, run_emulator, run_prometheus

    prometheus_binary()
    install_crd_from_the_chart()
    api = KubeApi(load_config(os.environ["KUBECONFIG"]))
    with ExitStack() as stack_:
        flags = ("--namespace", namespace, "--model-name", scenario.MODEL, "--linger", "30")
        emulator = stack_.enter_context(
            run_emulator(tmp_path, scenario.collapse_scenario(), *flags, speed=scenario.SPEED)
        )
        prometheus = stack_.enter_context(run_prometheus(tmp_path, emulator.file_sd))
        emulator.wait_for_targets()
        prometheus.wait_for_targets_up(set(scenario.pod_names()))
        original = stack(namespace, prometheus.url, scenario.pod_names(), scenario.MODEL)
        body = policy_body(
            "vllm",
            prometheus_url=prometheus.url,
            extra={
                "metrics": {"selector": {"namespace": namespace, "model_name": scenario.MODEL}},
                "budget": {"gpuSecondsPer1kRequests": scenario.BUDGET},
                "cache": {"onCollapse": "Hold"},
            },
        )
        body["metadata"] = {"name": "vllm", "namespace": namespace}
        stack_.enter_context(run_operator(tmp_path, Path(os.environ["KUBECONFIG"]), namespace))
        apply(namespace, body)

        policy_path = (
            f"/apis/cachescale.dev/v1alpha1/namespaces/{namespace}/cachescalingpolicies/vllm"
        )
        hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/vllm"

        def condition(kind: str) -> tuple[str, str] | None:
            status = api.get(policy_path).get("status", {})
            for entry in status.get("conditions", []):
                if entry["type"] == kind:
                    return entry["status"], entry["reason"]
            return None

        until(
            lambda: condition("CacheHealthy") == ("False", "PrefixCollapse") or None, "the collapse"
        )
        events = api.items(f"/api/v1/namespaces/{namespace}/events")
        assert any(
            e["type"] == "Warning"
            and e["reason"] == "PrefixCollapse"
            and e["involvedObject"]["name"] == "vllm"
            for e in events
        )
        held = api.get(hpa_path)["spec"]["maxReplicas"]
        assert held == 3, "held at the pre-collapse replicas (see the process test)"
        described = kubectl("describe", "csp", "-n", namespace, "vllm")
        assert described.returncode == 0, described.stderr
        assert "token hit rate" in described.stdout
        assert "PrefixCollapse" in described.stdout

        deleted = kubectl("delete", "csp", "-n", namespace, "vllm", "--timeout=60s")
        assert deleted.returncode == 0, deleted.stderr

        def restored() -> bool | None:
            hpa_now = api.get(hpa_path)
            back = hpa_now["spec"]["maxReplicas"] == original["maxReplicas"]
            annotated = "cachescale.dev/original-envelope" in hpa_now["metadata"].get(
                "annotations", {}
            )
            return True if back and not annotated else None

        until(restored, "the HPA's original envelope")
        with pytest.raises(NotFoundError):
            api.get(policy_path)
