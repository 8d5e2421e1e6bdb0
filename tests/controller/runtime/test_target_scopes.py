"""A cluster-wide shard's informers, on demand (``members.Runtime.targets``,
``controller/kube/target_informers.py`` ``TargetInformers``): a namespace's informers start when
the first of the shard's policies there joins, and only there (the fake API server sees
lists and watches under that namespace alone); a second policy there starts nothing; they
stop when the last one leaves, its objects gone from the stores, each start and stop
logged once. Without a shard's informers the runtime follows nothing.

The same on a real API server, read from its audit log: e2e/test_operator_shards.py.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf
import pytest

from cachescale.controller.kube import informer as inf
from cachescale.controller.kube import target_informers as targets
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.runtime.members import Runtime
from tests.controller.cluster import PODS, FakeCluster, policy
from tests.polling import wait_for

KINDS = inf.target_kinds(keda=False)


def join(runtime: Runtime, name: str, namespace: str) -> None:
    """Policy ``name`` of ``namespace`` (uid ``uid-NAME``) joins, as its watch event would
    have it."""
    raw = policy(name, prometheus_url="http://127.0.0.1:1")
    raw["metadata"]["namespace"] = namespace
    claims: Any = {}  # kopf's index, not read when joining
    runtime.join(kopf.Body(cast(kopf.RawBody, raw)), claims)


def pod(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "vllm"}},
    }


def target_requests(cluster: FakeCluster) -> list[tuple[str, str]]:
    """(list or watch, path) of every request of a target kind the fake API server got."""
    plurals = {kind.plural for kind in KINDS}
    return [
        ("watch" if r.params.get("watch") == "true" else "list", str(r.url.path))
        for r in cluster.requests("get")
        if str(r.url.path).rsplit("/", 1)[-1] in plurals
    ]


def followed(cluster: FakeCluster, namespace: str) -> list[tuple[str, str]] | None:
    """Every kind listed and watched in ``namespace``, once each: the requests, or None
    while not all are sent yet."""
    expected = sorted((verb, kind.path(namespace)) for kind in KINDS for verb in ("list", "watch"))
    sent = sorted(target_requests(cluster))
    return sent if sent == expected else None


def test_a_namespaces_informers_follow_its_first_policy_to_its_last(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    for namespace in ("a", "b"):
        cluster.put(PODS, pod(f"vllm-{namespace}", namespace))
    informers = targets.TargetInformers(lambda: cluster.api, (), keda=False, on_demand=True)
    runtime = Runtime(Operator(cluster.api), targets=informers)
    caplog.set_level(logging.INFO, "cachescale.operator")
    try:
        informers.start()
        assert informers.informers == []
        assert target_requests(cluster) == [], "nothing followed before a policy joins"

        join(runtime, "first", "a")
        wait_for(lambda: followed(cluster, "a"), 5, "a's kinds listed and watched")
        started = informers.informers
        assert sorted(i.name for i in started) == sorted(f"{k.plural} in a" for k in KINDS)
        wait_for(lambda: informers.index("pods", "a"), 5, "a's pods listed")
        assert informers.index("pods", "b") is None, "b is not followed"

        join(runtime, "second", "a")
        assert informers.informers == started, "a second policy there starts nothing"
        runtime.leave("uid-first")
        assert informers.informers == started, "a policy is still there"
        assert caplog.text.count("following its targets") == 1

        runtime.leave("uid-second")
        assert informers.informers == []
        assert informers.index("pods", "a") is None
        assert informers._stores["pods"].objects() == 0, "a's objects dropped at once"
        for informer in started:
            informer.join(timeout_s=5)
            assert informer._thread is not None
            assert not informer._thread.is_alive()
        assert followed(cluster, "a") is not None, "never anything but a's collections"
        assert caplog.text.count("a: no longer following its targets") == 1
    finally:
        informers.stop()


def test_a_peering_pause_stops_every_namespace_and_the_relisting_starts_them_again(
    cluster: FakeCluster,
) -> None:
    informers = targets.TargetInformers(lambda: cluster.api, (), keda=False, on_demand=True)
    runtime = Runtime(Operator(cluster.api), targets=informers)
    try:
        for name, namespace in (("first", "a"), ("second", "b")):
            join(runtime, name, namespace)
        assert {i.namespace for i in informers.informers} == {"a", "b"}
        runtime.turn(False)
        assert informers.informers == []
        runtime.turn(True)
        join(runtime, "second", "b")
        assert {i.namespace for i in informers.informers} == {"b"}
    finally:
        informers.stop()


def test_without_on_demand_informers_nothing_is_counted(cluster: FakeCluster) -> None:
    runtime = Runtime(Operator(cluster.api))
    join(runtime, "first", "a")
    runtime.leave("uid-first")
    assert runtime._per_namespace == {}
    assert target_requests(cluster) == []
