"""Namespaces are walls for change correlation, on a real API server (issue 53, finding 2).

A hostile tenant's policy in tenant-a names, as a prompt source, a Deployment in tenant-b
whose args carry a database password. The operator's look (``scan`` and ``describe``
from ``controller/target/changes.py``) runs as the chart's ServiceAccount, whose cluster-wide
role could list ReplicaSets in tenant-b: what stops the read is the operator's own wall
(``--prompt-source-namespace``, none opened by default). Every list the look makes is
recorded: none names tenant-b, the words say tenant-b was not read and which chart value
would open it, and neither the password nor tenant-b's Deployment name appears. The
tenant's own rollout, which changed the same kind of flag, is named by its flag with
hashed values. Opened, tenant-b is read, and its password still appears nowhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from cachescale.api.spec import PromptSourceKind
from cachescale.controller.kube.client import KubeApi, load_config
from cachescale.controller.target.change_scan import Change, Place, scan
from cachescale.controller.target.changes import describe
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, until

PASSWORD_A = "Pa55w0rd-tenant-a"
PASSWORD_B = "Pa55w0rd-tenant-b"


class Recorded:
    """The operator's ``KubeApi``, recording the path of every list the look makes."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.paths: list[str] = []

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        self.paths.append(path)
        return self.api.items(path, selector)

    def metadata_items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        self.paths.append(path)
        return self.api.metadata_items(path, selector)


def deployment(name: str, password: str, revision_note: str) -> dict[str, Any]:
    db_url = f"--db-url=postgres://admin:{password}@db"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": 0,  # no pod needed: the ReplicaSets are what is read
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"note": revision_note}},
                "spec": {"containers": [{"name": "api", "image": "api:1", "args": [db_url]}]},
            },
        },
    }


def rolled_out(cluster: Cluster, api: KubeApi, namespace: str, name: str, password: str) -> None:
    """``name`` in ``namespace``: two revisions, the second with ``password`` in its args."""
    owned = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    apply(cluster, namespace, deployment(name, "old-" + password, "1"))
    until(lambda: api.items(owned) or None, f"{name}'s first ReplicaSet", 20)
    apply(cluster, namespace, deployment(name, password, "2"))
    until(lambda: len(api.items(owned)) == 2 or None, f"{name}'s second ReplicaSet", 20)


@pytest.fixture
def tenant_b(cluster: Cluster) -> Iterator[str]:
    name = f"tenant-b-{uuid.uuid4().hex[:6]}"
    created = cluster.kubectl("create", "namespace", name)
    assert created.returncode == 0, created.stderr
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_a_prompt_source_in_another_tenants_namespace_is_neither_read_nor_quoted(
    cluster: Cluster, release: Release, namespace: str, tenant_b: str, tmp_path: Path
) -> None:
    tenant_a = namespace
    api = KubeApi(load_config(str(cluster.kubeconfig)))  # the test's own writes and waits
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    operator = Recorded(KubeApi(load_config(str(kubeconfig))))
    rolled_out(cluster, api, tenant_b, "billing-api", PASSWORD_B)
    rolled_out(cluster, api, tenant_a, "gateway", PASSWORD_A)
    # The chart's role could read tenant-b: only the operator's own wall stops it.
    assert api.items(f"/apis/apps/v1/namespaces/{tenant_b}/replicasets")
    assert operator.api.items(f"/apis/apps/v1/namespaces/{tenant_b}/replicasets")

    onset = datetime.now(UTC) + timedelta(seconds=5)
    since = onset - timedelta(hours=1)
    declared = [Place(tenant_b, PromptSourceKind.DEPLOYMENT, "app=billing-api")]
    own = [Place(tenant_a, PromptSourceKind.DEPLOYMENT, None)]

    found = scan(
        cast(KubeApi, operator), declared, own, since, onset, frozenset()
    )  # the chart's default
    assert found.walled == [tenant_b]
    assert operator.paths, "the own namespace was read"
    assert not [p for p in operator.paths if tenant_b in p], operator.paths
    message = describe(found, declared, own, onset)
    assert message.endswith(
        f"; not read: namespace {tenant_b} is not allowed for prompt sources "
        "(chart value rbac.changeCorrelation.namespaces)"
    ), message
    assert message.startswith(f"gateway (Deployment, namespace {tenant_a}) rolled out"), message
    assert revision_2(found.changes, "gateway").startswith(
        "rolled out revision 2 (args: --db-url changed (value "
    ), found.changes
    for text in (message, repr(found)):
        for leaked in (PASSWORD_A, PASSWORD_B, "postgres://", "billing-api"):
            assert leaked not in text, (leaked, text)

    operator.paths.clear()
    opened = scan(cast(KubeApi, operator), declared, own, since, onset, frozenset({tenant_b}))
    assert [p for p in operator.paths if tenant_b in p], operator.paths
    assert opened.walled == []
    words = describe(opened, declared, own, onset)
    assert words.startswith(f"billing-api (Deployment, namespace {tenant_b}) rolled out"), words
    assert "--db-url changed (value " in revision_2(opened.changes, "billing-api")
    for text in (words, repr(opened)):
        for leaked in (PASSWORD_A, PASSWORD_B, "postgres://"):
            assert leaked not in text, (leaked, text)


def revision_2(changes: list[Change], name: str) -> str:
    """What the look says of ``name``'s second revision (both revisions fall in the hour,
    possibly in the same second, so which one the message names first is not fixed)."""
    (what,) = [c.what for c in changes if c.name == name and "revision 2" in c.what]
    return what
