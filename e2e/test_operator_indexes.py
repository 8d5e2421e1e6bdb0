"""Watches, not reads, on a real API server (``controller/kube/indexes.py``).

The operator runs as the chart's ServiceAccount (its RBAC must let its informers list and
watch Deployments, HPAs and pods: ``controller/kube/informer.py``), scoped to one namespace,
on a real Deployment with Ready pods and its HPA. The policy is in Advise mode and its
Prometheus does not answer, so every evaluation reads the target, freezes and writes its
status, whose ``lastDecision.maxReplicas`` is the HPA's ``maxReplicas`` as the evaluation
read it.
Asserted: once two evaluations are done, ``cachescale_kube_requests_total`` for get and
list does not move over the following ones, nor is the status written but by the
periodic refresh (whose first slot after a write falls anywhere in its period, so
``--verbose`` logs why each write was made), and a user's edit of the HPA's maxReplicas
is in the status within one interval, still without a read (that status write is
counted: the counter is live). In Enforce mode too an evaluation that changes nothing
reads nothing; one that patches reads the HPA whole first
(tests/controller/kube/test_indexes.py).

Then the reads themselves, without the operator: ``read_target`` through indexes built
from the API server's own lists equals ``read_target`` sent to it, and the pod selectors
the indexes match in memory pick the same pods as the API server's ``labelSelector``
(kmock, in the unit tests, ignores selectors). About 40 s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachescale.api.spec import TargetSpec
from cachescale.controller.kube import indexes as ix
from cachescale.controller.kube.client import KubeApi, load_config
from cachescale.controller.target.workload import _selector, read_target
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import PAUSE, apply, get, until
from e2e.operators import operator_process
from e2e.serving import APP, create_stack
from tests.controller.cluster import Clock
from tests.controller.cluster import policy as policy_body
from tests.controller.kube.test_indexes import LABELS, SELECTORS, comparable
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess
from tests.prometheus_fixture import free_port

INTERVAL_S = 10.0
MODEL = "llama-3-8b"


def evaluations(operator: OperatorProcess, namespace: str) -> int:
    """How many evaluations of the policy the process logged."""
    return len(re.findall(rf"{re.escape(namespace)}/{APP}: ", operator.output()))


def requests_sent(operator: OperatorProcess) -> dict[str, float]:
    """``cachescale_kube_requests_total`` by verb, from the operator's ``/metrics``."""
    sent = operator.samples("cachescale_kube_requests_total")
    return {dict(labels)["verb"]: value for labels, value in sent.items()}


def status_writes(operator: OperatorProcess, namespace: str) -> list[str]:
    """Why each status write of the policy was made, as the process logged it
    (``--verbose``)."""
    pattern = rf"status of {re.escape(namespace)}/{APP} written: (.*)"
    return re.findall(pattern, operator.output())


def decided_max(cluster: Cluster, namespace: str) -> int | None:
    body = get(cluster, "cachescalingpolicy", APP, "-n", namespace)
    return (((body or {}).get("status") or {}).get("lastDecision") or {}).get("maxReplicas")


def test_a_steady_state_evaluation_reads_nothing_and_sees_an_hpa_edit(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    create_stack(cluster, namespace, MODEL, replicas=2)
    body = policy_body(
        APP,
        prometheus_url=f"http://127.0.0.1:{free_port()}",  # nothing listens: frozen
        mode="Advise",
        extra={"metrics": {"selector": {"namespace": namespace, "model_name": MODEL}}},
    )
    body["metadata"] = {"name": APP}
    apply(cluster, namespace, body)
    workdir, verbose = tmp_path / "operator", ("--verbose", *LOOPBACK_PROMETHEUS)
    with operator_process(workdir, kubeconfig, (namespace,), flags=verbose) as operator:
        until(
            lambda: True if evaluations(operator, namespace) >= 2 else None,
            "two evaluations",
            INTERVAL_S * 3,
        )
        assert decided_max(cluster, namespace) == 40
        status = get(cluster, "cachescalingpolicy", APP, "-n", namespace)["status"]
        assert status["signals"]["readyReplicas"] == 2  # the pods came from the index
        settled = requests_sent(operator)
        written = len(status_writes(operator, namespace))
        done = evaluations(operator, namespace)
        until(
            lambda: True if evaluations(operator, namespace) >= done + 2 else None,
            "two more evaluations",
            INTERVAL_S * 3,
        )
        steady = requests_sent(operator)
        assert (steady["get"], steady["list"]) == (settled["get"], settled["list"]), steady
        # Nothing changed, so nothing is written but the periodic refresh, whose first
        # slot after a write falls anywhere in the refresh period (from the uid).
        refreshes = status_writes(operator, namespace)[written:]
        assert set(refreshes) <= {"refresh"}, refreshes
        patched = steady.get("patch", 0) - settled.get("patch", 0)
        assert patched == len(refreshes), "nothing changed: nothing written but a refresh"
        # The operator's health is one histogram, not one per policy, and no counter
        # exports a `_created` twin (each doubled the lines of every /metrics scrape).
        assert list(operator.samples("cachescale_evaluation_duration_seconds_count")) == [
            frozenset()
        ]
        assert operator.samples("cachescale_decisions_created") == {}

        edited = cluster.kubectl(
            "patch",
            "hpa",
            APP,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec":{"maxReplicas":12}}',
        )
        assert edited.returncode == 0, edited.stderr
        until(
            lambda: True if decided_max(cluster, namespace) == 12 else None,
            "the edited maxReplicas in the status",
            INTERVAL_S + 5,
        )
        after = requests_sent(operator)
        assert (after["get"], after["list"]) == (settled["get"], settled["list"]), after
        assert after["patch"] > steady["patch"], "the changed status was written: counted"
        assert "Traceback" not in operator.output(), operator.tail()


def test_indexed_reads_equal_the_api_servers(cluster: Cluster, namespace: str) -> None:
    api = KubeApi(load_config(str(cluster.kubeconfig)))
    create_stack(cluster, namespace, MODEL, replicas=2)
    for i, labels in enumerate(LABELS):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"labelled-{i}", "labels": labels},
            "spec": {"containers": [{"name": "pause", "image": PAUSE}]},
        }
        apply(cluster, namespace, pod)
    target = TargetSpec(deployment_name=APP, hpa_name=APP)
    now = Clock().now

    def both() -> tuple[Any, Any] | None:
        """The two reads, once the objects stood still between them (the controllers
        may still be updating the Deployment's status)."""
        indexes = indexes_of(api, namespace)
        indexed = comparable(read_target(ix.IndexedReads(api, indexes), namespace, target, now))
        direct = comparable(read_target(api, namespace, target, now))
        return (direct, indexed) if indexes == indexes_of(api, namespace) else None

    direct, indexed = until(both, "two reads of an unchanged target", 30)
    assert indexed == direct
    assert len(direct.pod_ages) == 2

    pod_path = f"/api/v1/namespaces/{namespace}/pods"
    pods = indexes_of(api, namespace).pods
    for selector, _ in SELECTORS:
        text = _selector({"spec": {"selector": selector}})
        matched = ix.select(pods, namespace, text)
        assert matched is not None
        served = [p["metadata"]["name"] for p in api.items(pod_path, text)]
        assert [p["metadata"]["name"] for p in matched] == served, text


def indexes_of(api: KubeApi, namespace: str) -> ix.Indexes:
    """The indexes as the informers fill them from the API server's lists of
    ``namespace``."""

    def build(path: str, entries: Callable[[dict[str, Any]], dict[Any, Any]]) -> Any:
        built: dict[Any, list[dict[str, Any]]] = {}
        for item in api.items(path.format(namespace)):
            for key, value in entries(item).items():
                built.setdefault(key, []).append(value)
        return built

    return ix.Indexes(
        deployments=build("/apis/apps/v1/namespaces/{}/deployments", ix.deployment_entries),
        hpas=build("/apis/autoscaling/v2/namespaces/{}/horizontalpodautoscalers", ix.hpa_entries),
        pods=build("/api/v1/namespaces/{}/pods", ix.pod_entries),
    )
