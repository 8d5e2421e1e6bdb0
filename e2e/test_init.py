"""A new user's first hour on a real API server: ``cachescale init`` against a vLLM
Deployment and HPA already running, ``kubectl apply`` of what it prints, the operator (as
the chart's ServiceAccount) reading it in Advise mode, ``kubectl describe`` showing signals
and a decision, and nothing patched (``docs/quickstart-existing-vllm.md``).

The Deployment and HPA are real, their pods are real, and the engines' metrics come from
``cachescale emulate`` through a real Prometheus under the real pods' names
(e2e/serving.py). The failures a user meets first are here too: a Deployment that does
not exist, one without an HPA, a Prometheus that does not answer, and series that are
not there; each is one line and the documented exit code.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.controller.test_operator_process as scenario
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, get, until
from e2e.serving import APP, Metrics, create_stack, emulated_metrics
from tests.controller.process_fixture import cachescale_command, start_operator
from tests.prometheus_fixture import free_port_block

HISTORY = "2m"
"""The test's stack holds seconds to minutes of history, not an hour: ``--history`` says so,
and ``--allow-short-history`` measures over what it holds."""


@dataclass
class Serving:
    """An existing vLLM Deployment behind an HPA, scraped by a real Prometheus."""

    cluster: Cluster
    namespace: str
    metrics: Metrics
    hpa_spec: dict[str, Any]
    workdir: Path


@pytest.fixture(scope="module")
def serving(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    workdir = tmp_path_factory.mktemp("init")
    namespace = f"cachescale-e2e-init-{int(time.time()) % 100000}"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    with ExitStack() as stack:
        hpa_spec, pods = create_stack(cluster, namespace, scenario.MODEL, 2)
        metrics = stack.enter_context(
            emulated_metrics(
                workdir, namespace, scenario.MODEL, scenario.collapse_scenario(), pods,
                speed=scenario.SPEED,
            )
        )  # fmt: skip
        yield Serving(cluster, namespace, metrics, hpa_spec, workdir)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def init(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*cachescale_command(), "init", "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def drafted(serving: Serving) -> subprocess.CompletedProcess[str]:
    """The draft for a chart installed with ``prometheus.url``: no URL in the policy."""
    return init(
        serving.cluster,
        "--namespace", serving.namespace, "--deployment", APP,
        "--prometheus", serving.metrics.prometheus.url, "--history", HISTORY,
        "--allow-short-history", "--operator-default-prometheus",
    )  # fmt: skip


def test_init_drafts_a_policy_the_api_server_takes_and_the_operator_only_advises_on(
    serving: Serving, release: Release
) -> None:
    cluster, namespace = serving.cluster, serving.namespace
    result = drafted(serving)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "# Measured over " in result.stdout
    policy = yaml.safe_load(result.stdout)
    spec = policy["spec"]
    assert spec["mode"] == "Advise"
    assert spec["target"] == {
        "deploymentName": APP, "hpaName": APP, "containerName": "vllm", "engine": "vllm",
    }  # fmt: skip
    # The narrowest selector that returns this Deployment's series: namespace + model.
    assert spec["metrics"]["selector"] == {"namespace": namespace, "model_name": scenario.MODEL}
    assert "prometheusUrl" not in spec["metrics"]
    assert spec["budget"]["minReplicas"] == serving.hpa_spec["minReplicas"]
    assert spec["budget"]["maxReplicas"] == serving.hpa_spec["maxReplicas"]
    # The numbers the comments quote are the ones the proposal was made from.
    assert "--max-num-seqs is 32" in result.stdout
    assert spec["budget"]["gpuSecondsPer1kRequests"] > 0
    assert spec["slo"]["ttftP95Seconds"] >= 0.5

    kubeconfig = cluster.token_kubeconfig(
        serving.workdir / "operator.kubeconfig", release.namespace, release.service_account
    )
    hpa_before = get(cluster, "hpa", APP, "-n", namespace)["spec"]
    deployment_before = get(cluster, "deployment", APP, "-n", namespace)["spec"]
    url = serving.metrics.prometheus.url
    with start_operator(
        serving.workdir, kubeconfig, "--namespace", namespace, "--standalone",
        "--default-prometheus-url", url,
    ):  # fmt: skip
        applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=result.stdout)
        assert applied.returncode == 0, applied.stderr

        def described() -> str | None:
            shown = cluster.kubectl("describe", "csp", APP, "-n", namespace).stdout
            seen = ("Signals:", "Requests Per Second:", "Last Decision:")
            return shown if all(part in shown for part in seen) else None

        text = until(described, "describe showing signals and a decision", 90)
    assert "Advise" in text
    assert f"{url} (the operator's default)" in text
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    plane = cluster.plane
    if plane is not None:  # the server's own audit log: nothing written to the workload
        for resource in ("horizontalpodautoscalers", "deployments"):
            assert plane.writes(user, resource, namespace) == [], resource
    assert get(cluster, "hpa", APP, "-n", namespace)["spec"] == hpa_before
    assert get(cluster, "deployment", APP, "-n", namespace)["spec"] == deployment_before


def test_init_says_in_one_line_what_is_missing(serving: Serving, namespace: str) -> None:
    cluster, url = serving.cluster, serving.metrics.prometheus.url
    missing = init(cluster, "--namespace", namespace, "--deployment", "nope", "--prometheus", url)
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == f"cachescale init: Deployment nope not found in namespace {namespace}"
    )

    # A Deployment with no HPA scaling it.
    lonely = get(cluster, "deployment", APP, "-n", serving.namespace)
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "lonely"},
        "spec": {**lonely["spec"], "replicas": 0},
    }
    apply(cluster, namespace, body)
    no_hpa = init(cluster, "--namespace", namespace, "--deployment", "lonely", "--prometheus", url)
    assert no_hpa.returncode == 1
    assert "no HorizontalPodAutoscaler" in no_hpa.stderr
    assert "lonely" in no_hpa.stderr
    assert no_hpa.stderr.count("\n") == 1


def test_init_tells_unreachable_prometheus_from_missing_series(serving: Serving) -> None:
    cluster, namespace = serving.cluster, serving.namespace
    closed = f"http://127.0.0.1:{free_port_block(1)}"
    down = init(cluster, "--namespace", namespace, "--deployment", APP, "--prometheus", closed,
                "--timeout", "2")  # fmt: skip
    assert down.returncode == 3, down.stderr
    assert down.stderr.count("\n") == 1
    assert "Traceback" not in down.stderr

    # Series before the stack existed: nothing to measure, and the selectors tried are named.
    long_ago = init(
        cluster, "--namespace", namespace, "--deployment", APP,
        "--prometheus", serving.metrics.prometheus.url, "--history", "1m",
        "--at", "2020-01-01T00:00:00Z",
    )  # fmt: skip
    assert long_ago.returncode == 1, long_ago.stderr
    assert f'model_name="{scenario.MODEL}"' in long_ago.stderr
    assert long_ago.stderr.count("\n") == 1

    # Less data than the hour asked for: refused in one line naming both spans.
    short = init(cluster, "--namespace", namespace, "--deployment", APP,
                 "--prometheus", serving.metrics.prometheus.url)  # fmt: skip
    assert short.returncode == 1, short.stderr
    assert short.stderr.startswith("cachescale init: Prometheus holds ")
    assert "less than --history 1h" in short.stderr
    assert short.stderr.count("\n") == 1
