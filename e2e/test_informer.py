"""The target informers (``controller/kube/informer.py``) on a real API server.

Informers for one namespace and cluster-wide list a real Deployment (its pods made by the
real controllers and the node stand-in) and its HPA, then follow an HPA edit, a pod
labelled and unlabelled (the old label no longer finds it), a pod deleted and replaced,
and a second Deployment created. Then their watches are cut (each stream closed, as a
dropped connection): they watch again from their last resourceVersion, with no list, and
catch up with a scale-up made meanwhile.

Then (envtest only) the API server is killed, etcd compacted, and the API server started
again, as e2e/test_faults.py's "watch expired": the informers' watches die with it, they
back off while it is down, and the resourceVersion they resume from is older than the new
API server keeps, so it answers 410 Gone (as an answer or an ERROR event, whichever it
sends): every informer lists again, and the stores hold exactly what the API server
lists, with no duplicate and no stale entry, then follow a deletion. After each step the
stores are compared whole with the entries built from the API server's own lists. About
30 s, then 30 s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from cachescale.controller.kube import informer as inf
from cachescale.controller.kube import target_informers as targets
from cachescale.controller.kube.client import KubeApi, load_config
from e2e.harness.cluster import Cluster
from e2e.kube_helpers import PAUSE, apply, until
from e2e.serving import APP, create_stack

MODEL = "llama-3-8b"
Canonical = dict[Any, list[dict[str, Any]]]


def canonical(index: Mapping[Any, Any], namespace: str) -> Canonical:
    """An index's entries of ``namespace``, each key's projections in name order."""
    return {
        key: sorted(index[key], key=lambda p: str(p["metadata"]["name"]))
        for key in index
        if key[0] == namespace
    }


def listed(api: KubeApi, kind: inf.Kind, namespace: str) -> Canonical:
    """What an informer of ``kind`` should hold for ``namespace``: the API server's list,
    as entries."""
    built: dict[Any, list[dict[str, Any]]] = {}
    for item in api.items(kind.path(namespace)):
        for key, value in kind.entries(item).items():
            built.setdefault(key, []).append(value)
    return canonical(built, namespace)


class Counted:
    """Requests sent by the informers, by verb."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def __call__(self, verb: str) -> None:
        self.sent[verb] = self.sent.get(verb, 0) + 1


@contextmanager
def running(api: inf.ListWatch, namespaces: list[str]) -> Iterator[targets.TargetInformers]:
    informers = targets.TargetInformers(lambda: api, namespaces, keda=False)
    informers.start()
    try:
        yield informers
    finally:
        informers.stop()


def converged(
    reference: KubeApi, namespace: str, *every: targets.TargetInformers, timeout_s: float = 30
) -> None:
    """Until every informer's stores hold exactly what the API server lists (twice the
    same list, so the objects stood still in between)."""

    def same() -> bool | None:
        for kind in inf.target_kinds(keda=False):
            expected = listed(reference, kind, namespace)
            for informers in every:
                store = informers._stores[kind.index]
                if canonical(store, namespace) != expected:
                    return None
            if listed(reference, kind, namespace) != expected:
                return None
        return True

    until(same, "the stores to hold what the API server lists", timeout_s)


def pod_names(informers: targets.TargetInformers, key: tuple[str, str, str]) -> list[str]:
    pods = informers.index("pods", key[0])
    assert pods is not None
    return sorted(p["metadata"]["name"] for p in pods.get(key) or ())


def wait_for(check: Callable[[], bool], what: str) -> None:
    until(lambda: True if check() else None, what, 30)


def kubectl(cluster: Cluster, *args: str) -> None:
    done = cluster.kubectl(*args)
    assert done.returncode == 0, done.stderr


def needs_controllers(cluster: Cluster) -> None:
    if cluster.envtest and not cluster.plane.has_controller_manager:  # type: ignore[union-attr]
        pytest.skip("KUBEBUILDER_ASSETS has no kube-controller-manager: no Deployment controller")


def test_informers_follow_the_targets_and_resume_a_cut_watch(
    cluster: Cluster, namespace: str
) -> None:
    needs_controllers(cluster)
    reference = KubeApi(load_config(str(cluster.kubeconfig)))
    counted = Counted()
    api = KubeApi(load_config(str(cluster.kubeconfig)), on_request=counted)
    _, (first, second) = create_stack(cluster, namespace, MODEL, replicas=2)

    with running(api, [namespace]) as scoped, running(api, []) as clusterwide:
        both = (scoped, clusterwide)
        kinds = inf.target_kinds(keda=False)
        assert all(None not in [i.index(k.index, namespace) for k in kinds] for i in both)
        assert counted.sent["list"] == 6  # three kinds, in the namespace and cluster-wide
        converged(reference, namespace, *both)

        # Followed: an HPA edit, a label added then removed, a pod replaced, a new Deployment.
        edit = '{"spec":{"maxReplicas":12}}'
        kubectl(cluster, "patch", "hpa", APP, "-n", namespace, "--type=merge", "-p", edit)
        canary = (namespace, "canary", "true")
        kubectl(cluster, "label", "pod", first, "-n", namespace, "canary=true")
        wait_for(lambda: pod_names(scoped, canary) == [first], "the new label followed")
        kubectl(cluster, "label", "pod", first, "-n", namespace, "canary-")
        wait_for(lambda: pod_names(scoped, canary) == [], "the removed label followed")
        assert canary not in scoped._stores["pods"]
        kubectl(cluster, "delete", "pod", second, "-n", namespace, "--wait=false")
        apply(cluster, namespace, plain_deployment("other", replicas=1))
        converged(reference, namespace, *both)
        hpas = scoped.index("hpas", namespace)
        assert hpas is not None
        assert next(iter(hpas[namespace, APP]))["spec"]["maxReplicas"] == 12
        deployed = (namespace, "app", APP)
        wait_for(lambda: second not in pod_names(scoped, deployed), "the deleted pod gone")
        assert len(pod_names(scoped, deployed)) == 2, "replaced"

        # The watches cut: watched again from where they were, nothing listed.
        lists = counted.sent["list"]
        cut(both)
        kubectl(cluster, "scale", "deployment", "other", "-n", namespace, "--replicas=2")
        converged(reference, namespace, *both)
        assert counted.sent["list"] == lists, "a cut watch is watched again, not relisted"


def test_informers_list_again_when_their_watch_expired(cluster: Cluster, namespace: str) -> None:
    needs_controllers(cluster)
    if cluster.plane is None:
        pytest.skip("needs the session's own control plane (envtest) to restart the API server")
    reference = KubeApi(load_config(str(cluster.kubeconfig)))
    counted = Counted()
    api = KubeApi(load_config(str(cluster.kubeconfig)), on_request=counted)
    create_stack(cluster, namespace, MODEL, replicas=2)
    apply(cluster, namespace, plain_deployment("other", replicas=1))

    with running(api, [namespace]) as scoped, running(api, []) as clusterwide:
        both = (scoped, clusterwide)
        converged(reference, namespace, *both)
        lists = counted.sent["list"]
        cluster.plane.kill("kube-apiserver")
        cluster.plane.compact_etcd()
        cluster.plane.restart("kube-apiserver")
        until(
            lambda: True if counted.sent["list"] >= lists + 6 else None, "every kind relisted", 60
        )
        converged(reference, namespace, *both)
        kubectl(cluster, "delete", "deployment", "other", "-n", namespace)
        converged(reference, namespace, *both)
        assert all((namespace, "other") not in i._stores["deployments"] for i in both)


def cut(every: tuple[targets.TargetInformers, ...]) -> None:
    """Close every open watch, as a dropped connection would end it."""
    for informers in every:
        for each in informers.informers:
            stream = until(lambda each=each: each._stream, f"{each.name}: a watch open", 10)
            stream.close()


def plain_deployment(name: str, replicas: int) -> dict[str, Any]:
    """A second Deployment, of ``pause`` (its pods are not waited for: the informers
    follow them as they come)."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "pause", "image": PAUSE}]},
            },
        },
    }
