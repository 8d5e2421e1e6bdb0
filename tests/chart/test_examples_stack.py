"""examples/stack/: a complete, valid, self-consistent stack for one model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart_helpers import REPO, STACK, Manifest, by_kind, one, validation_errors

Stack = list[tuple[Path, Manifest]]


def stack() -> Stack:
    files = sorted(STACK.glob("*.yaml"))
    assert files, "examples/stack/ is empty"
    return [
        (path, doc)
        for path in files
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]


def manifests() -> list[Manifest]:
    return [doc for _, doc in stack()]


def engine_args() -> dict[str, str]:
    """The vllm container's ``--flag=value`` args (``--flag`` alone maps to "")."""
    deployment = one(manifests(), "Deployment")
    (engine,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"
    ]
    parsed: dict[str, str] = {}
    for arg in engine["args"]:
        flag, _, value = arg.partition("=")
        parsed[flag] = value
    return parsed


def policy_spec() -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests(), "CacheScalingPolicy")["spec"]
    return spec


def test_the_stack_has_every_piece() -> None:
    kinds = sorted(doc["kind"] for doc in manifests())
    assert kinds == sorted(
        [
            "Namespace",
            "Deployment",
            "Service",
            "HorizontalPodAutoscaler",
            "PodMonitor",
            "CacheScalingPolicy",
        ]
    )


@pytest.mark.parametrize("name", sorted(p.name for p in STACK.glob("*.yaml")))
def test_every_file_is_commented(name: str) -> None:
    assert (STACK / name).read_text(encoding="utf-8").startswith("#"), name


@pytest.mark.parametrize(
    "kind", ["Namespace", "Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor"]
)
def test_kubernetes_objects_are_valid(kind: str) -> None:
    """Built-in kinds through kubernetes-validate (strict); the PodMonitor through the
    minimal Prometheus Operator schema in chart_helpers (see its docstring)."""
    for doc in by_kind(manifests(), kind):
        assert validation_errors(doc) == [], kind


def test_policy_is_valid_for_cachescale_and_the_crd() -> None:
    path = STACK / "50-cachescalingpolicy.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cachescale.commands.main import main; main()",
            "validate",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert validation_errors(one(manifests(), "CacheScalingPolicy")) == []


def test_everything_lives_in_the_stack_namespace() -> None:
    namespace = one(manifests(), "Namespace")["metadata"]["name"]
    for doc in manifests():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["kind"]
    assert policy_spec()["metrics"]["selector"]["namespace"] == namespace


def test_policy_targets_the_deployment_container_and_hpa() -> None:
    docs = manifests()
    target = policy_spec()["target"]
    deployment, hpa = one(docs, "Deployment"), one(docs, "HorizontalPodAutoscaler")
    assert target["deploymentName"] == deployment["metadata"]["name"]
    assert target["hpaName"] == hpa["metadata"]["name"]
    containers = {c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert target["containerName"] in containers
    assert target["engine"] == "vllm"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


def test_hpa_scales_on_the_engine_queue_within_the_budget_envelope() -> None:
    hpa = one(manifests(), "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    budget = policy_spec()["budget"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        budget["minReplicas"],
        budget["maxReplicas"],
    )


def test_engine_args_agree_with_the_policy() -> None:
    args, batching = engine_args(), policy_spec()["batching"]
    seqs = int(args["--max-num-seqs"])
    assert batching["minNumSeqs"] <= seqs <= batching["maxNumSeqs"]
    assert float(args["--gpu-memory-utilization"]) == batching["gpu"]["gpuMemoryUtilization"]
    assert "--enable-prefix-caching" in args
    model = args["--served-model-name"]
    assert policy_spec()["metrics"]["selector"]["model_name"] == model


def test_engine_requests_one_gpu() -> None:
    deployment = one(manifests(), "Deployment")
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    resources = engine["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]


def test_service_and_pod_monitor_select_the_engine_pods() -> None:
    docs = manifests()
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service, monitor = one(docs, "Service"), one(docs, "PodMonitor")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (engine,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    ports = {p["name"] for p in engine["ports"]}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    assert service["spec"]["ports"][0]["targetPort"] in ports
