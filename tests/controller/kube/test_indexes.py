"""The watch-fed indexes (``controller/kube/indexes.py``): what each projection keeps, label
selectors matched in memory as the API server matches them, and reads served from the
indexes equal to the same reads sent to the API server (kmock), for every field
``read_target`` and a whole evaluation use, with no read sent; a kind with no index (not
listed yet) read from the API server. Secrets are kept for ``SECRET_TTL_S``, and every
request ``KubeApi`` sends is counted by verb. The informers that fill the indexes:
tests/controller/kube/test_informer.py.

kmock ignores ``labelSelector`` (it lists every pod of the namespace), so selector
matching is checked here against the API server's rules written out, and on a real API
server in e2e/test_operator_indexes.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from cachescale.api.label_selector import LabelSelector
from cachescale.api.policy import MAX_NUM_SEQS_CHANGED, ORIGINAL_ENVELOPE, PROMETHEUS_CREDENTIALS
from cachescale.api.spec import TargetSpec
from cachescale.controller.kube import indexes as ix
from cachescale.controller.kube.client import KubeApi, NotFoundError
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import evaluate
from cachescale.controller.reconcile.metrics import OperatorMetrics
from cachescale.controller.target.workload import Target, TargetError, _selector, read_target
from tests.controller.cluster import (
    DEPLOYMENTS,
    HPAS,
    NAMESPACE,
    PODS,
    POLICIES,
    Clock,
    FakeCluster,
    deployment,
    fake_cluster,
    hpa,
    pods,
    policy,
)
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.target.test_keda import SCALED_OBJECTS, keda_hpa, scaled_object
from tests.gather.gather_fakes import FakePrometheus

HPA_TARGET = TargetSpec(deployment_name="vllm", hpa_name="vllm")
KEDA_TARGET = TargetSpec(deployment_name="vllm", scaled_object_name="vllm")


def build(
    cluster: FakeCluster, plural_path: str, entries: Callable[[dict[str, Any]], dict[Any, Any]]
) -> dict[Any, list[dict[str, Any]]]:
    """An index as an informer fills it from a list of ``plural_path``."""
    index: dict[Any, list[dict[str, Any]]] = {}
    for body in cluster.api.items(plural_path):
        for key, value in entries(body).items():
            index.setdefault(key, []).append(value)
    return index


def indexes_of(cluster: FakeCluster, keda: bool = False) -> ix.Indexes:
    """The four indexes of what the cluster holds now (a watch caught up)."""
    namespaced = f"namespaces/{NAMESPACE}"
    return ix.Indexes(
        deployments=build(
            cluster, f"/apis/apps/v1/{namespaced}/deployments", ix.deployment_entries
        ),
        hpas=build(
            cluster, f"/apis/autoscaling/v2/{namespaced}/horizontalpodautoscalers", ix.hpa_entries
        ),
        pods=build(cluster, f"/api/v1/{namespaced}/pods", ix.pod_entries),
        scaled_objects=build(
            cluster, f"/apis/keda.sh/v1alpha1/{namespaced}/scaledobjects", ix.scaled_object_entries
        )
        if keda
        else None,
    )


def reads_sent(cluster: FakeCluster) -> int:
    return len(cluster.requests("get"))


def comparable(target: Target) -> Target:
    """A read target without the raw bodies, which only the projection trims."""
    keda = replace(target.keda, body={}) if target.keda is not None else None
    return replace(target, deployment={}, autoscaler={}, keda=keda)


def both_ways(cluster: FakeCluster, target: TargetSpec, keda: bool = False) -> tuple[Any, Any]:
    """``read_target`` from the API server and from the indexes: (result or the error's
    reason and message) each; the indexed read sends nothing to the API server."""
    now = Clock().now

    def attempt(reads: Any) -> Any:
        try:
            return comparable(read_target(reads, NAMESPACE, target, now, keda_allowed=False))
        except TargetError as error:
            return error.reason, error.message

    direct = attempt(cluster.api)
    facade = ix.IndexedReads(cluster.api, indexes_of(cluster, keda))
    before = reads_sent(cluster)
    indexed = attempt(facade)
    if not isinstance(indexed, tuple):  # a found target is served with no read
        assert reads_sent(cluster) == before
    return direct, indexed


def put_stack(cluster: FakeCluster, **deployment_args: Any) -> dict[str, Any]:
    body = deployment("vllm", replicas=3, **deployment_args)
    body["metadata"]["annotations"] = {
        MAX_NUM_SEQS_CHANGED: "2026-11-30T11:00:00+00:00",
        "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 2000 + "}",
    }
    body["spec"]["template"]["spec"]["containers"][1]["resources"] = {
        "requests": {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    cluster.put(DEPLOYMENTS, body)
    now = Clock().now
    three = pods("vllm", 3, now)
    three[1]["metadata"]["deletionTimestamp"] = now.isoformat()
    three[2]["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now.isoformat()},
        {"type": "Ready", "status": "False", "lastTransitionTime": now.isoformat()},
    ]
    for pod in [*three, *pods("vllm-warm", 2, now - timedelta(minutes=5))]:
        pod["metadata"]["labels"]["app"] = "vllm"  # all picked by the selector
        cluster.put(PODS, pod)
    return body


# --- projections --------------------------------------------------------------------------


def test_a_deployment_projection_keeps_what_is_read_and_drops_the_rest() -> None:
    body = deployment("vllm")
    body["metadata"].update(
        resourceVersion="7",
        annotations={MAX_NUM_SEQS_CHANGED: "t", "kubectl.kubernetes.io/last-applied": "{...}"},
        managedFields=[{"manager": "kubectl"}],
    )
    body["spec"]["template"]["spec"]["containers"][1]["env"] = [{"name": "HF_TOKEN"}]
    projected = ix.deployment_projection(body)
    assert projected["metadata"] == {
        "name": "vllm",
        "namespace": NAMESPACE,
        "generation": 3,
        "resourceVersion": "7",
        "annotations": {MAX_NUM_SEQS_CHANGED: "t"},
    }
    assert projected["spec"]["template"]["spec"]["containers"] == [
        {"name": "sidecar", "resources": {}},
        {
            "name": "vllm",
            "args": ["--model", "llama", "--max-num-seqs", "32"],
            "resources": {"limits": {"nvidia.com/gpu": "2"}},
        },
    ]
    assert projected["status"] == body["status"]
    assert "replicas" in projected["spec"]
    assert "selector" in projected["spec"]


def test_a_pod_is_indexed_under_its_namespace_and_each_label_once() -> None:
    (pod,) = pods("vllm", 1, Clock().now)
    pod["metadata"]["labels"]["pod-template-hash"] = "abc"
    pod["spec"] = {"containers": [{"name": "vllm", "image": "big"}]}
    pod["status"]["conditions"].append({"type": "Initialized", "status": "True"})
    entries = ix.pod_entries(pod)
    assert set(entries) == {
        (NAMESPACE, "", ""),
        (NAMESPACE, "app", "vllm"),
        (NAMESPACE, "pod-template-hash", "abc"),
    }
    (value,) = {id(v): v for v in entries.values()}.values()  # one shared value
    assert value == {
        "metadata": {"name": "vllm-0", "labels": {"app": "vllm", "pod-template-hash": "abc"}},
        "status": {"conditions": [pod["status"]["conditions"][0]]},
    }


def test_each_kind_is_kept_as_its_projection_under_its_key() -> None:
    assert ix.hpa_entries(hpa("vllm")) == {(NAMESPACE, "vllm"): ix.hpa_projection(hpa("vllm"))}
    assert ix.deployment_entries(deployment("vllm")) == {
        (NAMESPACE, "vllm"): ix.deployment_projection(deployment("vllm"))
    }
    assert ix.scaled_object_entries(scaled_object()) == {
        (NAMESPACE, "vllm"): ix.scaled_object_projection(scaled_object())
    }


class Unlisted:
    """Indexes of which none is listed yet (``indexes.TargetIndexes``)."""

    def index(self, kind: ix.IndexName, namespace: str) -> ix.Index | None:
        return None


def test_a_kind_with_no_index_is_read_from_the_api_server(cluster: FakeCluster) -> None:
    """An index not listed yet is not an empty one: an empty pod index would say the
    Deployment has no pods."""
    put_stack(cluster)
    cluster.put(HPAS, hpa("vllm"))
    direct = both_ways(cluster, HPA_TARGET)[0]
    before = reads_sent(cluster)
    facade = ix.IndexedReads(cluster.api, Unlisted())
    assert comparable(read_target(facade, NAMESPACE, HPA_TARGET, Clock().now)) == direct
    assert reads_sent(cluster) == before + 3  # the HPA, the Deployment, its pods


# --- selectors ----------------------------------------------------------------------------

LABELS = [
    {"role": "vllm", "tier": "gpu"},
    {"role": "vllm", "tier": "cpu", "canary": "true"},
    {"role": "vllm"},
    {"role": "sglang", "tier": "gpu"},
    {"role": "vllm", "tier": ""},
    {},
]


SELECTORS: list[tuple[dict[str, Any], list[int]]] = [
    ({"matchLabels": {"role": "vllm"}}, [0, 1, 2, 4]),
    ({"matchLabels": {"role": "vllm", "tier": "gpu"}}, [0]),
    ({"matchLabels": {"tier": ""}}, [4]),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, [0, 3]),
    (
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]},
        [0, 1, 3],
    ),
    (
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]},
        [1, 2, 4, 5],
    ),
    ({"matchExpressions": [{"key": "canary", "operator": "Exists"}]}, [1]),
    ({"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}, [0, 2, 3, 4, 5]),
    (
        {
            "matchLabels": {"role": "vllm"},
            "matchExpressions": [
                {"key": "tier", "operator": "Exists"},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "tier", "operator": "NotIn", "values": ["cpu"]},
            ],
        },
        [0, 4],
    ),
    ({"matchLabels": {"role": "llama"}}, []),
]
"""Deployment selectors of every form ``_selector`` writes, and which of ``LABELS`` each picks."""


@pytest.mark.parametrize(("selector", "chosen"), SELECTORS)
def test_selectors_match_as_the_api_server_matches(
    selector: dict[str, Any], chosen: list[int]
) -> None:
    index: dict[Any, list[dict[str, Any]]] = {}
    for i, labels in enumerate(LABELS):
        body = {"metadata": {"name": f"pod-{i}", "namespace": NAMESPACE, "labels": labels}}
        for key, value in ix.pod_entries(body).items():
            index.setdefault(key, []).append(value)
    text = _selector({"spec": {"selector": selector}})
    found = ix.select(index, NAMESPACE, text)
    assert found is not None
    assert [p["metadata"]["name"] for p in found] == [f"pod-{i}" for i in chosen]
    assert ix.select(index, "elsewhere", text) == []


def test_a_selector_not_matched_in_memory_goes_to_the_api_server(cluster: FakeCluster) -> None:
    assert ix.select({}, NAMESPACE, "replicas>3") is None
    assert ix.select({}, NAMESPACE, "not a selector((") is None
    facade = ix.IndexedReads(cluster.api, ix.Indexes({}, {}, {}))
    before = len(cluster.requests("get"))
    facade.items(f"/api/v1/namespaces/{NAMESPACE}/pods", "replicas>3")
    assert len(cluster.requests("get")) == before + 1


def test_requirements_follow_kubernetes_semantics() -> None:
    (absent_ne,) = LabelSelector.parse("tier!=gpu").requirements
    assert ix.matches(absent_ne, {})
    assert not ix.matches(absent_ne, {"tier": "gpu"})
    (double,) = LabelSelector.parse("tier==gpu").requirements
    assert ix.matches(double, {"tier": "gpu"})
    assert not ix.matches(double, {})


# --- reads served from the indexes equal the direct ones ---------------------------------


def test_an_hpa_target_reads_the_same_from_the_indexes(cluster: FakeCluster) -> None:
    put_stack(cluster)
    body = hpa("vllm")
    body["metadata"]["annotations"] = {
        ORIGINAL_ENVELOPE: '{"maxReplicas": 40, "minReplicas": 2}',
        "unrelated": "x",
    }
    cluster.put(HPAS, body)
    direct, indexed = both_ways(cluster, HPA_TARGET)
    assert isinstance(direct, Target)
    assert direct.state.ready_replicas == 3
    assert len(direct.pod_ages) == 3
    assert indexed == direct


def test_a_scaled_object_target_reads_the_same_from_the_indexes(cluster: FakeCluster) -> None:
    cluster.serve_resource(SCALED_OBJECTS, {"namespaced": True, "kind": "ScaledObject"})
    put_stack(cluster)
    cluster.put(SCALED_OBJECTS, scaled_object(annotations={"autoscaling.keda.sh/paused": "true"}))
    cluster.put(HPAS, keda_hpa())
    direct, indexed = both_ways(cluster, KEDA_TARGET, keda=True)
    assert isinstance(direct, Target)
    assert direct.keda is not None
    assert direct.keda.hpa_desired_replicas == 14
    assert direct.keda.paused is not None
    assert indexed == direct


@pytest.mark.parametrize(
    "case",
    ["no-deployment", "no-hpa", "keda-owned-hpa", "other-deployment", "no-container", "tampered"],
)
def test_a_target_problem_reads_the_same_from_the_indexes(cluster: FakeCluster, case: str) -> None:
    if case != "no-deployment":
        put_stack(cluster, container="engine" if case == "no-container" else "vllm")
    owner = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": "so"}
    body = hpa(
        "vllm",
        target="other" if case == "other-deployment" else "vllm",
        owner=owner if case == "keda-owned-hpa" else None,
    )
    if case == "tampered":
        body["metadata"]["annotations"] = {ORIGINAL_ENVELOPE: '{"maxReplicas": 0}'}
    if case != "no-hpa":
        cluster.put(HPAS, body)
    direct, indexed = both_ways(cluster, HPA_TARGET)
    assert isinstance(direct, tuple)
    assert indexed == direct


def test_a_missing_object_is_confirmed_by_the_api_server(cluster: FakeCluster) -> None:
    facade = ix.IndexedReads(cluster.api, ix.Indexes({}, {}, {}))
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/vllm"
    with pytest.raises(NotFoundError):
        facade.get(path)
    cluster.put(DEPLOYMENTS, deployment("vllm"))  # created before its watch event arrived
    assert facade.get(path)["metadata"]["name"] == "vllm"
    assert len([r for r in cluster.requests("get") if r.url.path == path]) == 2


def stack_in(cluster: FakeCluster, prometheus: FakePrometheus, clock: Clock, mode: str) -> None:
    cluster.put(DEPLOYMENTS, deployment("vllm", replicas=11))
    cluster.put(HPAS, hpa("vllm"))
    for pod in pods("vllm", 11, clock.now):
        cluster.put(PODS, pod)
    cluster.put(POLICIES, policy("vllm", prometheus_url=prometheus.url, mode=mode))


@pytest.mark.parametrize("mode", ["Advise", "Enforce"])
def test_a_whole_evaluation_is_the_same_through_the_indexes(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    mode: str,
) -> None:
    """One stack in two clusters, one operator reading directly and one through indexes
    kept up to date (a watch caught up), 40 rounds: the same statuses and HPAs. The
    indexed one reads nothing but, in Enforce mode, the HPA that ``actions`` reads in
    full before it patches it, in the rounds that patch it and no other."""
    engines.set(
        {"namespace": NAMESPACE, "model_name": "vllm"},
        EngineNumbers(pods=tuple(f"vllm-{i}" for i in range(11))),
    )
    with fake_cluster() as other:
        for each in (cluster, other):
            stack_in(each, prometheus, clock, mode)
        direct = Operator(other.api, clock=clock)
        indexed = Operator(cluster.api, clock=clock)
        read_paths = []
        for _ in range(40):
            evaluate(direct, PolicyObject.of(other.get(POLICIES, "vllm")))
            indexed.indexed_reads = ix.IndexedReads(cluster.api, indexes_of(cluster))
            before = len(cluster.requests("get"))
            evaluate(indexed, PolicyObject.of(cluster.get(POLICIES, "vllm")))
            read_paths += [str(r.url.path) for r in cluster.requests("get")[before:]]
            clock.advance(10)
        for resource in (POLICIES, HPAS, DEPLOYMENTS):
            assert _stable(cluster.get(resource, "vllm")) == _stable(other.get(resource, "vllm"))
    hpa_path = f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/vllm"
    patches = [r for r in cluster.requests("patch") if r.url.path == hpa_path]
    assert read_paths == [hpa_path] * len(patches)
    assert bool(patches) == (mode == "Enforce")


def _stable(body: dict[str, Any]) -> dict[str, Any]:
    """An object without what two API servers number differently."""
    meta = {k: v for k, v in body["metadata"].items() if k not in ("resourceVersion", "uid")}
    return {**body, "metadata": meta}


# --- Secrets ------------------------------------------------------------------------------


def test_an_opted_in_secret_is_read_once_per_ttl_and_nothing_else_kept(
    cluster: FakeCluster,
) -> None:
    now = [0.0]
    facade = ix.IndexedReads(cluster.api, ix.Indexes({}, {}, {}), clock=lambda: now[0])
    path = f"/api/v1/namespaces/{NAMESPACE}/secrets/prom"

    def sent() -> int:
        return len([r for r in cluster.requests("get") if r.url.path == path])

    with pytest.raises(NotFoundError):
        facade.get(path)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "prom",
            "namespace": NAMESPACE,
            "labels": {PROMETHEUS_CREDENTIALS: "true"},
        },
        "data": {"token": "dG9rZW4="},
    }
    cluster.put("v1/secrets", secret)
    first = facade.get(path)
    assert first["data"] == {"token": "dG9rZW4="}
    assert first["metadata"]["labels"] == {PROMETHEUS_CREDENTIALS: "true"}
    assert sent() == 2  # the 404, then one read
    now[0] = ix.SECRET_TTL_S - 1
    facade.get(path)
    assert sent() == 2
    now[0] = ix.SECRET_TTL_S + 1
    facade.get(path)
    assert sent() == 3
    secret["metadata"]["labels"] = {}  # not opted in: read each time, never kept
    cluster.put("v1/secrets", secret)
    now[0] = 3 * ix.SECRET_TTL_S
    assert facade.get(path)["metadata"] == {"labels": {}}
    facade.get(path)
    assert sent() == 5


# --- the request counter ------------------------------------------------------------------


def test_every_request_is_counted_by_verb(cluster: FakeCluster) -> None:
    metrics = OperatorMetrics()
    api = KubeApi(cluster.api._client, on_request=metrics.kube_request)
    cluster.put(DEPLOYMENTS, deployment("vllm"))
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/vllm"
    api.get(path)
    api.get(path)
    api.items(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", "app=vllm")
    api.patch(path, {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json")
    with pytest.raises(NotFoundError):
        api.get(path + "-gone")
    collection = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    listed = api.list_page(collection, [("limit", "500")])
    assert [d["metadata"]["name"] for d in listed["items"]] == ["vllm"]
    watch = api.watch(collection, [("resourceVersion", "1")], idle_timeout_s=5)
    assert next(iter(watch))["object"]["metadata"]["name"] == "vllm"  # kmock replays it
    watch.close()

    def count(verb: str) -> float | None:
        return metrics.registry.get_sample_value("cachescale_kube_requests_total", {"verb": verb})

    counted = (count("get"), count("list"), count("patch"), count("create"), count("watch"))
    assert counted == (3, 2, 1, 0, 1)
