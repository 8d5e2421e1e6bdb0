"""Change correlation's reads on a real API server (``controller/target/changes.py``).

The kmock tests (tests/controller/target/test_changes.py) drive a whole collapse; what
they cannot show is how a real API server answers: ReplicaSets numbered by the real
Deployment controller, ``managedFields`` kept by the server with the manager's name, label
selectors applied by the server, and a ``PartialObjectMetadataList`` that leaves a
Secret's data out. So this test makes a real rollout, a ConfigMap edit and a Secret write,
then runs the operator's own look (``scan`` and ``describe``) against them, with the
chart's ServiceAccount and RBAC. No pod needs to start and nothing is waited for but the
Deployment controller's new ReplicaSet.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cachescale.api.spec import PromptSourceKind
from cachescale.controller.kube.client import METADATA_ONLY, KubeApi, load_config
from cachescale.controller.target.change_scan import Place, scan
from cachescale.controller.target.changes import describe
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release, upgraded
from e2e.kube_helpers import apply, until

SECRET_VALUE = "hunter2-do-not-leak"


def rag_api(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "rag-api", "labels": {"app": "rag-api"}},
        "spec": {
            "replicas": 0,  # no pod needed: the ReplicaSets are what is read
            "selector": {"matchLabels": {"app": "rag-api"}},
            "template": {
                "metadata": {"labels": {"app": "rag-api"}},
                "spec": {"containers": [{"name": "api", "image": image, "args": ["--chunk=512"]}]},
            },
        },
    }


def test_a_rollout_a_configmap_edit_and_a_secret_write_are_read_from_a_real_api_server(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    """The look runs as the chart's ServiceAccount: Secrets are listed only where
    ``rbac.changeCorrelation.secretNamespaces`` opts in, ConfigMaps only with
    ``rbac.changeCorrelation.configMaps``, and each is said unread otherwise."""
    api = KubeApi(load_config(str(cluster.kubeconfig)))  # the test's own writes and waits
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    operator = KubeApi(load_config(str(kubeconfig)))
    apply(cluster, namespace, rag_api("rag-api:1.8.2"))
    owned = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    until(lambda: api.items(owned) or None, "the first ReplicaSet", 20)
    apply(cluster, namespace, rag_api("rag-api:1.8.3"))
    until(lambda: len(api.items(owned)) == 2 or None, "the second ReplicaSet", 20)
    # A Deployment the selector leaves out, rolled out too: never named.
    other = rag_api("other:1")
    other["metadata"] = {"name": "other", "labels": {"app": "other"}}
    other["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    other["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    apply(cluster, namespace, other)
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "prompt-templates", "labels": {"app": "rag-api"}},
        "data": {"template.txt": "You are a helpful assistant."},
    }
    apply(cluster, namespace, cm)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "rag-token", "labels": {"app": "rag-api"}},
        "data": {"token": base64.b64encode(SECRET_VALUE.encode()).decode()},
    }
    apply(cluster, namespace, secret)

    onset = datetime.now(UTC) + timedelta(seconds=5)
    declared = [
        Place(namespace, PromptSourceKind.DEPLOYMENT, "app=rag-api"),
        Place(namespace, PromptSourceKind.CONFIG_MAP, "app=rag-api"),
        Place(namespace, PromptSourceKind.SECRET, "app=rag-api"),
    ]
    since = onset - timedelta(hours=1)
    refused = scan(operator, declared, [], since, onset)  # the chart's default values
    # By default no ConfigMap and no Secret is listable: both said unread, with the 403.
    assert list(refused.failures) == [declared[1], declared[2]], refused.failures
    for place in declared[1:]:
        assert "403" in refused.failures[place], refused.failures
    assert {c.name for c in refused.changes} == {"rag-api"}
    with upgraded(
        cluster,
        release,
        f"rbac.changeCorrelation.secretNamespaces={{{namespace}}}",
        "rbac.changeCorrelation.configMaps=true",
    ):
        found = scan(operator, declared, [], since, onset)
        # The server honours the metadata-only Accept header: the data is not even sent
        # (metadata_items would drop it anyway; the raw answer shows the server's part).
        path = f"/api/v1/namespaces/{namespace}/secrets"
        query = [("labelSelector", "app=rag-api")]
        answer = operator._call("GET", path, query=query, accept=METADATA_ONLY)
    assert not found.failures, found.failures
    by_name = {c.name: c for c in found.changes}
    rollout = by_name["rag-api"].what
    assert rollout == "rolled out revision 2 (image rag-api:1.8.2 → 1.8.3)", found.changes
    assert by_name["prompt-templates"].what == "created by kubectl-client-side-apply"
    assert by_name["rag-token"].what == "created by kubectl-client-side-apply"
    assert "other" not in by_name
    message = describe(found, declared, [], onset)
    # The latest write first (all are declared; the server keeps whole seconds, so the
    # ConfigMap and the Secret may tie, and then the name decides), the others after it.
    first = message.split(" (", 1)[0]
    assert by_name[first].at == max(c.at for c in found.changes), (message, found.changes)
    assert message.startswith(f"{first} ({by_name[first].kind}, namespace {namespace}) created by")
    for name in {"rag-api", "prompt-templates", "rag-token"} - {first}:
        assert f"{name} ({by_name[name].kind}, namespace {namespace})" in message, message

    assert answer["kind"] == "PartialObjectMetadataList", answer.get("kind")
    (item,) = answer["items"]
    assert set(item) == {"apiVersion", "kind", "metadata"}, set(item)  # no data
    # ...but kubectl apply copied the data into an annotation: what the operator keeps of
    # the metadata (names and times) must not carry it.
    assert SECRET_VALUE in base64.b64decode(secret["data"]["token"]).decode()
    assert secret["data"]["token"] in json.dumps(item["metadata"])
    for text in (message, repr(found)):
        assert SECRET_VALUE not in text
        assert secret["data"]["token"] not in text
