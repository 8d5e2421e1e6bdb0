"""The informers (``controller/kube/informer.py``): a store's changes and reads, an informer's
list and watch against a scripted API (pages, events, 410 Gone as an answer and as an
event, other failures, a list that fails and the fallback to the API server meanwhile),
its thread stopped by closing its watch, and the kopf startup handler against kmock:
every kind listed before it returns, reads served from the stores, a change followed.

The same on a real API server, with the watch cut and expired: e2e/test_informer.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from cachescale.controller.kube import indexes as ix
from cachescale.controller.kube import informer as inf
from cachescale.controller.kube import target_informers as targets
from cachescale.controller.kube.client import MERGE_PATCH, GoneError, KubeError, NotFoundError
from cachescale.controller.kube.store import Store
from cachescale.controller.reconcile.context import Operator
from tests.controller.cluster import (
    DEPLOYMENTS,
    HPAS,
    NAMESPACE,
    PODS,
    Clock,
    FakeCluster,
    deployment,
    hpa,
    pods,
)
from tests.controller.test_shard import parse_run
from tests.polling import wait_for

Query = Sequence[tuple[str, str]]


def pod(name: str, namespace: str = NAMESPACE, version: int = 1, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(version),
            "labels": labels,
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def event(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": dict(body)}


def bookmark(version: int) -> dict[str, Any]:
    return event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": str(version)}})


def gone() -> dict[str, Any]:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    return event("ERROR", status)


class Stream:
    """A scripted watch: its events, then the server ends it (or, ``held``, it waits
    until closed, as an open watch with nothing to say)."""

    def __init__(self, events: list[dict[str, Any]], held: bool = False) -> None:
        self.events = events
        self.held = held
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self.events
        if self.held:
            self.closed.wait(10)

    def close(self) -> None:
        self.closed.set()


class ScriptedApi:
    """An API server of one collection: lists what ``objects`` holds now, page by page;
    each watch plays the next of ``watches`` (a :class:`Stream`, or an error raised when
    it is opened). Every request is kept in ``sent``."""

    def __init__(self, objects: list[dict[str, Any]], version: int = 10) -> None:
        self.objects = objects
        self.version = version
        self.watches: list[Stream | Exception] = []
        self.list_errors: list[Exception] = []
        self.sent: list[tuple[str, str, dict[str, str]]] = []

    def list_page(self, path: str, query: Query) -> dict[str, Any]:
        asked = dict(query)
        self.sent.append(("list", path, asked))
        if self.list_errors:
            raise self.list_errors.pop(0)
        start, limit = int(asked.get("continue", "0")), int(asked["limit"])
        more = start + limit < len(self.objects)
        meta = {
            "resourceVersion": str(self.version),
            "continue": str(start + limit) if more else "",
        }
        return {"metadata": meta, "items": self.objects[start : start + limit]}

    def watch(self, path: str, query: Query, idle_timeout_s: float) -> Stream:
        self.sent.append(("watch", path, dict(query)))
        script = self.watches.pop(0) if self.watches else Stream([])
        if isinstance(script, Exception):
            raise script
        return script

    def verbs(self) -> list[str]:
        return [verb for verb, _, _ in self.sent]


def pod_informer(api: ScriptedApi, page: int = 500) -> Any:
    waits: list[int] = []
    informer = inf.Informer(
        api,
        inf.PODS,
        NAMESPACE,
        Store(),
        page=page,
        backoff=lambda n: waits.append(n) or 0,
    )
    informer.waits = waits
    return informer


def names(store: Mapping[Any, Any], key: Any) -> list[str]:
    return sorted(p["metadata"]["name"] for p in store.get(key) or ())


def contents(store: Mapping[Any, Any]) -> dict[Any, list[str]]:
    return {key: names(store, key) for key in store}


# --- the store ----------------------------------------------------------------------------


def test_a_new_version_of_a_pod_drops_the_label_keys_it_lost() -> None:
    store = Store()
    scope = store.open(NAMESPACE)
    store.put(scope, (NAMESPACE, "a"), ix.pod_entries(pod("a", app="vllm", canary="true")))
    store.put(scope, (NAMESPACE, "b"), ix.pod_entries(pod("b", app="vllm")))
    assert contents(store) == {
        (NAMESPACE, "", ""): ["a", "b"],
        (NAMESPACE, "app", "vllm"): ["a", "b"],
        (NAMESPACE, "canary", "true"): ["a"],
    }
    store.put(scope, (NAMESPACE, "a"), ix.pod_entries(pod("a", app="sglang")))
    assert contents(store) == {
        (NAMESPACE, "", ""): ["a", "b"],
        (NAMESPACE, "app", "vllm"): ["b"],
        (NAMESPACE, "app", "sglang"): ["a"],
    }
    assert (NAMESPACE, "canary", "true") not in store
    store.remove(scope, (NAMESPACE, "b"))
    store.remove(scope, (NAMESPACE, "b"))  # a second deletion changes nothing
    assert contents(store) == {(NAMESPACE, "", ""): ["a"], (NAMESPACE, "app", "sglang"): ["a"]}
    assert store.objects() == 1


def test_a_read_is_not_changed_by_later_writes() -> None:
    store = Store()
    scope = store.open(NAMESPACE)
    store.put(scope, (NAMESPACE, "a"), ix.pod_entries(pod("a", app="vllm")))
    read = store[NAMESPACE, "app", "vllm"]
    store.put(scope, (NAMESPACE, "b"), ix.pod_entries(pod("b", app="vllm")))
    store.remove(scope, (NAMESPACE, "a"))
    assert [p["metadata"]["name"] for p in read] == ["a"]


def test_a_relist_replaces_its_namespace_at_once_and_no_other() -> None:
    store = Store()
    a, b = store.open("a"), store.open("b")
    store.put(a, ("a", "old"), ix.pod_entries(pod("old", "a", app="x")))
    store.put(b, ("b", "kept"), ix.pod_entries(pod("kept", "b", app="x")))
    assert not store.listed("a")
    store.replace(a, {("a", "new"): ix.pod_entries(pod("new", "a", app="y"))})
    assert store.listed("a")
    assert not store.listed("b")  # served per namespace: b is not listed yet
    assert contents(store) == {
        ("a", "", ""): ["new"],
        ("a", "app", "y"): ["new"],
        ("b", "", ""): ["kept"],
        ("b", "app", "x"): ["kept"],
    }
    store.replace(b, {})
    assert store.listed("b")
    assert not store.listed("c")
    assert contents(store) == {("a", "", ""): ["new"], ("a", "app", "y"): ["new"]}


def test_a_cluster_wide_relist_replaces_everything() -> None:
    store = Store()
    cluster = store.open(None)
    store.put(cluster, ("a", "old"), ix.pod_entries(pod("old", "a")))
    assert not store.listed("b")
    store.replace(cluster, {("b", "new"): ix.pod_entries(pod("new", "b"))})
    assert contents(store) == {("b", "", ""): ["new"]}
    assert store.listed("a")
    assert store.listed("b")


def test_a_closed_scope_drops_its_objects_at_once_and_writes_nothing_more() -> None:
    store = Store()
    a, b = store.open("a"), store.open("b")
    store.replace(a, {("a", "x"): ix.pod_entries(pod("x", "a", app="y"))})
    store.replace(b, {("b", "kept"): ix.pod_entries(pod("kept", "b"))})
    store.close(a)
    assert contents(store) == {("b", "", ""): ["kept"]}
    assert not store.listed("a")
    # The thread of a stopped informer finishing its list or a watch event: ignored.
    store.replace(a, {("a", "late"): ix.pod_entries(pod("late", "a"))})
    store.put(a, ("a", "late"), ix.pod_entries(pod("late", "a")))
    assert contents(store) == {("b", "", ""): ["kept"]}
    assert not store.listed("a")
    again = store.open("a")  # followed again: the old scope's writes still go nowhere
    store.put(a, ("a", "stale"), ix.pod_entries(pod("stale", "a")))
    store.replace(again, {("a", "new"): ix.pod_entries(pod("new", "a"))})
    assert contents(store) == {("a", "", ""): ["new"], ("b", "", ""): ["kept"]}
    assert store.objects() == 2


# --- one informer against a scripted API ----------------------------------------------------


def test_a_list_is_read_page_by_page_then_watched_from_its_version() -> None:
    api = ScriptedApi([pod(f"p{i}", app="vllm") for i in range(5)], version=42)
    informer = pod_informer(api, page=2)
    informer.step()
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    assert api.sent == [
        ("list", path, {"limit": "2"}),
        ("list", path, {"limit": "2", "continue": "2"}),
        ("list", path, {"limit": "2", "continue": "4"}),
        (
            "watch",
            path,
            {"resourceVersion": "42", "allowWatchBookmarks": "true", "timeoutSeconds": "300"},
        ),
    ]
    assert names(informer.store, (NAMESPACE, "app", "vllm")) == [f"p{i}" for i in range(5)]
    assert informer.store.listed(NAMESPACE)
    assert informer.tried.is_set()


def test_watch_events_change_the_store_and_move_the_version() -> None:
    api = ScriptedApi([pod("a", app="vllm"), pod("b", app="vllm")])
    api.watches = [
        Stream(
            [
                event("ADDED", pod("c", version=11, app="vllm")),
                event("MODIFIED", pod("a", version=12, app="sglang")),
                event("DELETED", pod("b", version=13, app="vllm")),
                bookmark(20),
            ]
        )
    ]
    informer = pod_informer(api)
    informer.step()
    assert contents(informer.store) == {
        (NAMESPACE, "", ""): ["a", "c"],
        (NAMESPACE, "app", "vllm"): ["c"],
        (NAMESPACE, "app", "sglang"): ["a"],
    }
    assert informer.version == "20"
    informer.step()  # the server ended that watch: the next goes on from the bookmark
    assert api.verbs() == ["list", "watch", "watch"]
    assert api.sent[-1][2]["resourceVersion"] == "20"
    assert informer.waits == []


@pytest.mark.parametrize("how", ["event", "answer"])
def test_410_gone_lists_again_and_replaces_the_store(how: str) -> None:
    api = ScriptedApi([pod("a", app="vllm"), pod("b", app="vllm")])
    api.watches = [Stream([event("ADDED", pod("c", version=11)), gone()])]
    if how == "answer":
        api.watches = [Stream([event("ADDED", pod("c", version=11))]), GoneError(410, "too old")]
    informer = pod_informer(api)
    informer.step()
    if how == "answer":
        informer.step()
    assert informer.version is None
    # Meanwhile a was deleted, b relabelled, d created, and c's events were missed.
    api.objects = [pod("b", version=30, app="sglang"), pod("d", version=31, app="vllm")]
    api.version = 31
    informer.step()
    assert contents(informer.store) == {
        (NAMESPACE, "", ""): ["b", "d"],
        (NAMESPACE, "app", "vllm"): ["d"],
        (NAMESPACE, "app", "sglang"): ["b"],
    }
    assert api.verbs().count("list") == 2
    assert api.sent[-1] == (
        "watch",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {"resourceVersion": "31", "allowWatchBookmarks": "true", "timeoutSeconds": "300"},
    )
    assert informer.waits == []  # relisted at once


def test_another_failure_waits_and_watches_again_from_the_last_version() -> None:
    api = ScriptedApi([pod("a")])
    api.watches = [
        Stream([event("ADDED", pod("b", version=11))]),
        KubeError(503, "unavailable"),
        Stream([event("ERROR", {"kind": "Status", "code": 500, "message": "boom"})]),
        Stream([event("ADDED", pod("c", version=12))]),
    ]
    informer = pod_informer(api)
    for _ in range(4):
        informer.step()
    assert informer.waits == [1, 2]  # two failures in a row; the next watch resets it
    assert api.verbs() == ["list", "watch", "watch", "watch", "watch"]
    assert [sent[2]["resourceVersion"] for sent in api.sent[1:]] == ["10", "11", "11", "11"]
    assert names(informer.store, (NAMESPACE, "", "")) == ["a", "b", "c"]


def test_a_failed_first_list_leaves_pods_to_the_api_server_until_it_lists(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    api = ScriptedApi([pod("vllm-0", app="vllm")])
    api.list_errors = [KubeError(403, 'pods is forbidden: User "x" cannot list')]
    informers = targets.TargetInformers(lambda: api, [NAMESPACE], keda=False)
    informer = next(i for i in informers.informers if i.kind == inf.PODS)
    informer._backoff = lambda n: 0.0
    informer.step()
    assert informer.tried.is_set()
    assert informers.index("pods", NAMESPACE) is None
    assert "pods in llm: list failed (HTTP 403" in caplog.text
    assert "until it lists, pods are read from the API server" in caplog.text

    reads = ix.IndexedReads(cluster.api, informers)
    cluster.put(PODS, pod("vllm-9", app="vllm"))
    before = len(cluster.requests("get"))
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    assert [p["metadata"]["name"] for p in reads.items(path, "app=vllm")] == ["vllm-9"]
    assert len(cluster.requests("get")) == before + 1

    informer.step()  # listed now: served from the store, with no read
    assert informers.index("pods", NAMESPACE) is not None
    assert [p["metadata"]["name"] for p in reads.items(path, "app=vllm")] == ["vllm-0"]
    assert len(cluster.requests("get")) == before + 1


def test_a_kind_not_served_is_said_so() -> None:
    api = ScriptedApi([])
    api.list_errors = [NotFoundError(404, "the server could not find the requested resource")]
    informers = targets.TargetInformers(lambda: api, [], keda=True)
    keda = next(i for i in informers.informers if i.kind == inf.SCALED_OBJECTS)
    assert keda.name == "scaledobjects cluster-wide"
    keda._backoff = lambda n: 0.0
    keda.step()
    assert informers.index("scaled_objects", NAMESPACE) is None
    assert api.sent[0][1] == "/apis/keda.sh/v1alpha1/scaledobjects"


def test_scaled_objects_are_watched_only_with_the_keda_flag() -> None:
    assert parse_run("--keda").keda is True
    assert parse_run().keda is False
    plurals = [k.plural for k in inf.target_kinds(keda=False)]
    assert plurals == ["deployments", "horizontalpodautoscalers", "pods"]
    assert [k.plural for k in inf.target_kinds(keda=True)] == [*plurals, "scaledobjects"]
    informers = targets.TargetInformers(lambda: ScriptedApi([]), ["a", "b"], keda=False)
    assert sorted(i.name for i in informers.informers) == sorted(
        f"{plural} in {ns}" for plural in plurals for ns in ("a", "b")
    )
    assert informers.index("scaled_objects", "a") is None


def test_the_backoff_doubles_to_its_bound_drawn_in_its_upper_half() -> None:
    assert inf.backoff_s(1, lambda: 0.0) == inf.FIRST_BACKOFF_S / 2
    assert inf.backoff_s(1, lambda: 1.0) == inf.FIRST_BACKOFF_S
    assert inf.backoff_s(3, lambda: 1.0) == 4 * inf.FIRST_BACKOFF_S
    assert inf.backoff_s(50, lambda: 1.0) == inf.MAX_BACKOFF_S
    assert inf.backoff_s(50, lambda: 0.0) == inf.MAX_BACKOFF_S / 2


def test_stop_closes_the_open_watch_and_ends_the_thread() -> None:
    api = ScriptedApi([pod("a")])
    held = Stream([], held=True)
    api.watches = [held]
    informer = pod_informer(api)
    informer.start()
    assert informer.tried.wait(5)
    wait_for(lambda: held if informer._stream is held else None, 5, "the watch open")
    informer.stop()
    assert held.closed.is_set()
    assert informer.store.objects() == 0  # its objects went at once
    informer.join(timeout_s=5)
    assert informer._thread is not None
    assert not informer._thread.is_alive()


# --- informers on demand (a cluster-wide shard) -------------------------------------------


class Gated:
    """The fake API server, whose lists of ``held`` wait until :attr:`gate` opens."""

    def __init__(self, api: inf.ListWatch, held: str) -> None:
        self.api = api
        self.held = f"/namespaces/{held}/"
        self.gate = threading.Event()

    def list_page(self, path: str, query: Query) -> dict[str, Any]:
        if self.held in path:
            self.gate.wait(10)
        return self.api.list_page(path, query)

    def watch(self, path: str, query: Query, idle_timeout_s: float) -> inf.Events:
        return self.api.watch(path, query, idle_timeout_s)


def test_on_demand_a_namespace_not_listed_yet_is_read_from_the_api_server_alone(
    cluster: FakeCluster,
) -> None:
    """A namespace whose informers have just started (their lists under way) is read from
    the API server; every namespace already listed is still served from the stores."""
    for namespace in ("a", "b"):
        cluster.put(PODS, pod(f"vllm-{namespace}", namespace, app="vllm"))
    gated = Gated(cluster.api, held="b")
    informers = targets.TargetInformers(lambda: gated, (), keda=False, on_demand=True)
    reads = ix.IndexedReads(cluster.api, informers)

    def pod_reads(namespace: str) -> int:
        path = f"/api/v1/namespaces/{namespace}/pods"
        listed = [r for r in cluster.requests("get") if r.params.get("watch") != "true"]
        return sum(1 for r in listed if str(r.url.path) == path)

    def read(namespace: str) -> list[str]:
        found = reads.items(f"/api/v1/namespaces/{namespace}/pods", "app=vllm")
        return [p["metadata"]["name"] for p in found]

    try:
        informers.open("a")
        informers.open("b")
        wait_for(lambda: informers.index("pods", "a"), 5, "a's pods listed")
        before = {namespace: pod_reads(namespace) for namespace in ("a", "b")}
        assert read("a") == ["vllm-a"]
        assert pod_reads("a") == before["a"], "a served from its store"
        assert informers.index("pods", "b") is None
        assert read("b") == ["vllm-b"]
        assert pod_reads("b") == before["b"] + 1, "b, not listed yet, read from the API"

        gated.gate.set()
        wait_for(lambda: informers.index("pods", "b"), 5, "b's pods listed")
        assert read("b") == ["vllm-b"]
        assert pod_reads("b") == before["b"] + 2, "b's list, and no read since"
        informers.close("a")
        assert informers.index("pods", "a") is None, "a no longer followed: read from the API"
        assert read("b") == ["vllm-b"]
    finally:
        gated.gate.set()
        informers.stop()


def test_on_demand_informers_start_with_nothing_and_log_once_per_namespace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = ScriptedApi([])
    api.watches = [Stream([], held=True) for _ in range(3)]
    informers = targets.TargetInformers(lambda: api, (), keda=False, on_demand=True)
    caplog.set_level(logging.DEBUG, "cachescale.operator")
    informers.start()
    assert informers.informers == []
    assert api.sent == []
    informers.open("a")
    informers.open("a")  # already followed: nothing more
    wait_for(lambda: True if api.verbs().count("watch") == 3 else None, 5, "three watches")
    informers.close("a")
    informers.close("a")
    informers.stop()
    assert {path for _, path, _ in api.sent} == {
        kind.path("a") for kind in inf.target_kinds(keda=False)
    }
    told = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert told == [
        "a: following its targets (the first policy there joined)",
        "a: no longer following its targets (the last policy there left)",
    ]
    informers.open("b")  # stopped with the operator: nothing starts again
    assert informers.informers == []


# --- the kopf startup handler, against kmock --------------------------------------------------


def test_startup_lists_every_kind_then_serves_and_follows_them(cluster: FakeCluster) -> None:
    cluster.put(DEPLOYMENTS, deployment("vllm", replicas=2))
    cluster.put(HPAS, hpa("vllm"))
    for each in pods("vllm", 2, Clock().now):
        cluster.put(PODS, each)
    informers = targets.TargetInformers(lambda: cluster.api, [NAMESPACE], keda=False)
    operator = Operator(cluster.api)
    memo = SimpleNamespace(runtime=SimpleNamespace(operator=operator), informers=informers)
    asyncio.run(targets.start_informers(memo=memo))
    try:
        assert isinstance(operator.reads, ix.IndexedReads)
        kinds = inf.target_kinds(keda=False)
        assert None not in [informers.index(kind.index, NAMESPACE) for kind in kinds]
        listed = [r for r in cluster.requests("get") if r.params.get("watch") != "true"]
        paths = [f"{kind.prefix}/namespaces/{NAMESPACE}/{kind.plural}" for kind in kinds]
        assert sorted(str(r.url.path) for r in listed) == sorted(paths)  # each listed once
        before = len(cluster.requests("get"))
        hpa_path = f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/vllm"
        assert operator.reads.get(hpa_path)["spec"]["maxReplicas"] == 40
        pod_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        assert len(operator.reads.items(pod_path, "app=vllm")) == 2

        patch = {"spec": {"maxReplicas": 12}}
        cluster.api.patch(hpa_path, patch, MERGE_PATCH)  # kmock tells the watch: MODIFIED
        wait_for(
            lambda: True if operator.reads.get(hpa_path)["spec"]["maxReplicas"] == 12 else None,
            5,
            "the edit followed",
        )
        later = cluster.requests("get")[before:]
        assert [r for r in later if r.params.get("watch") != "true"] == []  # all from stores
    finally:
        asyncio.run(targets.stop_informers(memo=memo))
    assert all(not i._thread.is_alive() for i in informers.informers if i._thread)


def test_startup_without_informers_leaves_the_reads_direct(cluster: FakeCluster) -> None:
    operator = Operator(cluster.api)
    memo = SimpleNamespace(runtime=SimpleNamespace(operator=operator))
    asyncio.run(targets.start_informers(memo=memo))
    asyncio.run(targets.stop_informers(memo=memo))
    assert operator.reads is cluster.api
