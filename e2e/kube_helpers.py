"""Small helpers the e2e tests share: waiting, applying objects, reading them as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from e2e.harness.cluster import Cluster
from tests.polling import wait_for

T = TypeVar("T")
PAUSE = "registry.k8s.io/pause:3.10"


def until(check: Callable[[], T | None], what: str, timeout_s: float = 120.0) -> T:
    """Poll ``check`` every 0.5 s until it returns something other than None (a test
    failure after ``timeout_s``)."""
    return wait_for(check, timeout_s, what, every_s=0.5)


def apply(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> None:
    """``kubectl apply`` one object (as JSON on stdin); fail the test on an error."""
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(obj))
    assert result.returncode == 0, result.stderr


def get(cluster: Cluster, *args: str) -> Any:
    """``kubectl get ... -o json`` decoded (None when it is not found)."""
    result = cluster.kubectl("get", *args, "-o", "json")
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    return json.loads(result.stdout)


def ready_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods matching ``selector`` that are Ready and not being deleted."""
    pods = get(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return [
        pod
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
    ]


def events_for(cluster: Cluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """Core/v1 Events whose involved object is ``kind/name``."""
    return [
        event
        for event in get(cluster, "events", "-n", namespace)["items"]
        if event["involvedObject"].get("kind") == kind and event["involvedObject"]["name"] == name
    ]


def condition_of(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` of an object (None when it has none yet)."""
    for entry in obj.get("status", {}).get("conditions", []):
        if entry.get("type") == kind:
            return dict(entry)
    return None
