"""Change correlation on the fake API: what changed in the hour before a collapse is named
in the alert, its Event and ``status.suspectedChange`` (``controller/target/changes.py``).

Each test settles a healthy policy, puts the changed objects in the fake cluster with
timestamps relative to the drop, then drops the hit rate: the first evaluation suspects
the collapse (one look), the third raises ``PrefixCollapse`` (a second look). kmock does
not filter by label selector, so every object a test puts in a declared namespace is one
the selector would pick; the selector itself is exercised on the real API server
(``e2e/test_change_correlation.py``). The operator here opens namespace ``rag`` to prompt
sources (``--prompt-source-namespace rag``); any other namespace but the policy's is a
wall: not read, and said so. It lists ConfigMaps too (``--correlate-configmaps``) but for
the tests of the default, which list none.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import kmock
import pytest
from kmock._internal.rendering import Response

from cachescale.api.reasons import ConditionReason, Diagnosis
from cachescale.api.spec import PromptSourceKind
from cachescale.controller.kube.client import METADATA_ONLY
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.target.change_scan import Change, Place, Scan
from cachescale.controller.target.changes import describe
from cachescale.controller.target.template_diff import argument_changes, template_diff, value_hash
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.reconcile.test_evaluation import POLICIES, SETTLE, run, stack
from tests.gather.gather_fakes import FakePrometheus

REPLICA_SETS = "apps/v1/replicasets"
CONFIG_MAPS = "v1/configmaps"
DEPLOYMENTS = "apps/v1/deployments"
SECRETS = "v1/secrets"
SECRET_VALUE = "hunter2-do-not-leak"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
RAG_SOURCE = {"namespace": "rag", "kind": "Deployment", "labelSelector": "app=rag-api"}
PASSWORD = "s3cret-pw"
DB_URL = f"--db-url=postgres://admin:{PASSWORD}@db"


@pytest.fixture
def operator(cluster: FakeCluster, clock: Clock) -> Operator:
    """An operator that reads prompt sources in ``rag`` besides a policy's own namespace,
    and lists ConfigMaps."""
    return Operator(
        cluster.api,
        clock=clock,
        prompt_source_namespaces=frozenset({"rag"}),
        correlate_configmaps=True,
    )


@pytest.fixture(autouse=True)
def _served(cluster: FakeCluster) -> None:
    """The kinds change correlation lists, besides those the operator always reads."""
    cluster.serve_resource(REPLICA_SETS, {"namespaced": True, "kind": "ReplicaSet"})
    cluster.serve_resource(CONFIG_MAPS, {"namespaced": True, "kind": "ConfigMap"})


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def rag_api(
    cluster: FakeCluster,
    namespace: str,
    rolled_out: datetime,
    args: tuple[list[str], list[str]] = (["--chunk=512"], ["--chunk=512"]),
) -> None:
    """A prompt-building Deployment rolled out from image 1.8.2 (revision 41, a day
    old) to 1.8.3 (revision 42) at ``rolled_out``, each with its ``args``."""
    uid = f"uid-rag-api-{namespace}"
    cluster.put(
        DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "rag-api",
                "namespace": namespace,
                "uid": uid,
                "labels": {"app": "rag-api"},
            },
            "spec": {"selector": {"matchLabels": {"app": "rag-api"}}},
        },
    )
    for revision, image, created, arguments in (
        (41, "rag-api:1.8.2", rolled_out - timedelta(days=1), args[0]),
        (42, "rag-api:1.8.3", rolled_out, args[1]),
    ):
        cluster.put(
            REPLICA_SETS,
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"rag-api-{revision}",
                    "namespace": namespace,
                    "creationTimestamp": _stamp(created),
                    "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                    "ownerReferences": [{"kind": "Deployment", "name": "rag-api", "uid": uid}],
                },
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": "api", "image": image, "args": arguments}]}
                    }
                },
            },
        )


def written(resource: str, kind: str, name: str, namespace: str, at: datetime) -> dict[str, Any]:
    """A ConfigMap or Secret created a day before ``at`` and last written at ``at``."""
    created = at - timedelta(days=1)
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "rag-api"},
            "creationTimestamp": _stamp(created),
            "managedFields": [
                {"manager": "helm", "operation": "Update", "time": _stamp(created)},
                {"manager": "kubectl-edit", "operation": "Update", "time": _stamp(at)},
            ],
        },
    }
    if kind == "Secret":
        obj["data"] = {"token": base64.b64encode(SECRET_VALUE.encode()).decode()}
        # kubectl apply keeps the whole object, data included, in an annotation.
        applied = json.dumps({"kind": "Secret", "data": obj["data"]})
        obj["metadata"]["annotations"] = {LAST_APPLIED: applied, "note": SECRET_VALUE}
    else:
        obj["data"] = {"template.txt": "You are a helpful assistant. {context}"}
    return obj


def collapse(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    sources: list[dict[str, str]],
    changes: Any,
) -> dict[str, Any]:
    """Settle, put the changes (``changes(onset)``), drop the hit rate until the alert is
    raised, and return the status; asserts the suspected-collapse condition named it too."""
    numbers: EngineNumbers = stack(
        cluster, engines, prometheus, clock, extra={"cache": {"promptSources": sources}}
    )
    run(operator, cluster, clock, rounds=SETTLE)
    onset = clock.now
    changes(onset)
    numbers.hit_rate = 0.04
    run(operator, cluster, clock)
    status = cluster.get(POLICIES, "vllm")["status"]
    (healthy,) = [c for c in status["conditions"] if c["type"] == "CacheHealthy"]
    assert healthy["reason"] == ConditionReason.COLLAPSE_SUSPECTED
    assert status["suspectedChange"]["message"] in healthy["message"]
    run(operator, cluster, clock, rounds=2)
    status = cluster.get(POLICIES, "vllm")["status"]
    assert status["state"] == Diagnosis.PREFIX_COLLAPSE
    return dict(status)


def collapse_events(cluster: FakeCluster) -> list[str]:
    return [
        e["message"]
        for e in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        if e["reason"] == Diagnosis.PREFIX_COLLAPSE
    ]


def lists_of(cluster: FakeCluster, resource: str) -> list[Any]:
    return [r for r in cluster.requests("get") if str(r.url.path).endswith(f"/{resource}")]


def test_a_prompt_source_rollout_4_minutes_before_the_drop_is_named_in_alert_event_and_status(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    status = collapse(
        cluster,
        engines,
        prometheus,
        clock,
        operator,
        [RAG_SOURCE],
        lambda onset: rag_api(cluster, "rag", onset - timedelta(minutes=4)),
    )
    named = (
        "rag-api (Deployment, namespace rag) rolled out revision 42 "
        "(image rag-api:1.8.2 → 1.8.3) 4 minutes before the hit rate fell"
    )
    assert status["suspectedChange"]["message"].startswith(named)
    (alert,) = status["alerts"]
    assert f"what changed: {named}" in alert["message"]
    (event,) = collapse_events(cluster)
    assert f"what changed: {named}" in event
    # Two looks (suspected, raised), then none while the alert lasts.
    run(operator, cluster, clock, rounds=3)
    assert len(lists_of(cluster, "replicasets")) == 2 * 2  # the rag and the own namespace
    status = cluster.get(POLICIES, "vllm")["status"]
    assert named in status["alerts"][0]["message"]


def test_a_configmap_change_is_named_with_its_manager(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    def edit(onset: datetime) -> None:
        at = onset - timedelta(minutes=12)
        cluster.put(CONFIG_MAPS, written(CONFIG_MAPS, "ConfigMap", "prompt-templates", "llm", at))

    status = collapse(cluster, engines, prometheus, clock, operator, [], edit)
    assert status["suspectedChange"]["message"] == (
        "prompt-templates (ConfigMap, namespace llm) updated by kubectl-edit "
        "12 minutes before the hit rate fell"
    )
    assert "You are a helpful assistant" not in json.dumps(status)


def test_with_nothing_changed_it_says_so_and_older_changes_do_not_count(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    def long_ago(onset: datetime) -> None:
        rag_api(cluster, "rag", onset - timedelta(hours=2))

    status = collapse(cluster, engines, prometheus, clock, operator, [RAG_SOURCE], long_ago)
    nothing = (
        "no change found in Deployments app=rag-api in namespace rag, Deployments in namespace "
        "llm, ConfigMaps in namespace llm within the hour before the hit rate fell"
    )
    assert status["suspectedChange"]["message"].startswith(nothing)
    (event,) = collapse_events(cluster)
    assert nothing in event


def test_changes_in_an_undeclared_namespace_are_neither_read_nor_reported(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    def elsewhere(onset: datetime) -> None:
        rag_api(cluster, "other", onset - timedelta(minutes=2))
        at = onset - timedelta(minutes=1)
        cluster.put(CONFIG_MAPS, written(CONFIG_MAPS, "ConfigMap", "templates", "other", at))

    status = collapse(cluster, engines, prometheus, clock, operator, [], elsewhere)
    assert "other" not in json.dumps(status)
    assert status["suspectedChange"]["message"].startswith("no change found in")
    assert not [r for r in cluster.requests("get") if "/namespaces/other/" in str(r.url.path)]


def test_secret_contents_never_appear_in_status_events_or_logs(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    encoded = base64.b64encode(SECRET_VALUE.encode()).decode()
    source = {"namespace": "rag", "kind": "Secret", "labelSelector": "app=rag-api"}

    def rotate(onset: datetime) -> None:
        at = onset - timedelta(minutes=3)
        cluster.put(SECRETS, written(SECRETS, "Secret", "rag-token", "rag", at))

    with caplog.at_level(logging.DEBUG):
        status = collapse(cluster, engines, prometheus, clock, operator, [source], rotate)
    assert status["suspectedChange"]["message"].startswith(
        "rag-token (Secret, namespace rag) updated by kubectl-edit 3 minutes before"
    )
    events = json.dumps(cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events"))
    for text in (json.dumps(status), events, caplog.text):
        assert SECRET_VALUE not in text
        assert encoded not in text
    # Asked for as metadata only: the API server never even sends the contents.
    (first, *_) = lists_of(cluster, "secrets")
    assert first.headers["Accept"] == METADATA_ONLY


def test_a_failed_read_is_reported_and_the_decision_goes_on(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    forbidden = {"kind": "Status", "code": 403, "message": "configmaps is forbidden"}
    cluster.react(
        cluster.emulator["get", kmock.resource(CONFIG_MAPS), kmock.namespace("llm")],
        Response(status=403, payload=forbidden),
    )

    def rollout(onset: datetime) -> None:
        rag_api(cluster, "rag", onset - timedelta(minutes=9))

    status = collapse(cluster, engines, prometheus, clock, operator, [RAG_SOURCE], rollout)
    message = status["suspectedChange"]["message"]
    assert message.startswith("rag-api (Deployment, namespace rag) rolled out revision 42")
    assert "not read: ConfigMaps in namespace llm: HTTP 403" in message


# --- the words, without an API ------------------------------------------------------------


def replica_set(revision: int, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {"deployment.kubernetes.io/revision": str(revision)}},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


@pytest.mark.parametrize(
    ("before", "after", "words"),
    [
        (
            [{"name": "api", "image": "ghcr.io/acme/rag-api:1.8.2"}],
            [{"name": "api", "image": "ghcr.io/acme/rag-api:1.8.3"}],
            "image ghcr.io/acme/rag-api:1.8.2 → 1.8.3",
        ),
        (
            [{"name": "api", "image": "rag-api:1"}],
            [{"name": "api", "image": "other-api:1"}],
            "image rag-api:1 → other-api:1",
        ),
        (
            [{"name": "api", "image": "a", "args": ["--chunk=512", "--k=4"]}],
            [{"name": "api", "image": "a", "args": ["--chunk=1024", "--k=4"]}],
            f"args: --chunk changed (value {value_hash('512')} → {value_hash('1024')})",
        ),
        (
            [{"name": "api", "image": "a", "env": [{"name": "TOKEN", "value": SECRET_VALUE}]}],
            [{"name": "api", "image": "a", "env": [{"name": "TOKEN", "value": "other"}]}],
            "env changed",
        ),
        (
            [{"name": "api", "image": "a"}, {"name": "proxy", "image": "envoy:1"}],
            [{"name": "api", "image": "a"}, {"name": "proxy", "image": "envoy:2"}],
            "image of container proxy envoy:1 → 2",
        ),
        (
            [{"name": "api", "image": "a", "resources": {"limits": {"cpu": "1"}}}],
            [{"name": "api", "image": "a", "resources": {"limits": {"cpu": "2"}}}],
            "pod template changed",
        ),
    ],
    ids=["tag", "repository", "args", "env-value-not-said", "sidecar", "other"],
)
def test_a_revision_is_described_by_its_template_difference(
    before: list[dict[str, Any]], after: list[dict[str, Any]], words: str
) -> None:
    assert template_diff(replica_set(1, before), replica_set(2, after)) == words


def test_declared_sources_rank_before_the_own_namespace_then_the_closest_first() -> None:
    onset = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    own = Place("llm", PromptSourceKind.CONFIG_MAP, None)
    declared = Place("rag", PromptSourceKind.DEPLOYMENT, "app=rag-api")
    found = Scan(
        changes=[
            Change(PromptSourceKind.CONFIG_MAP, "llm", "late", onset, "updated by x", False),
            Change(
                PromptSourceKind.DEPLOYMENT,
                "rag",
                "rag-api",
                onset - timedelta(minutes=30),
                "rolled out revision 3",
                True,
            ),
            Change(
                PromptSourceKind.DEPLOYMENT,
                "rag",
                "gateway",
                onset - timedelta(seconds=90),
                "rolled out revision 7",
                True,
            ),
        ]
    )
    assert describe(found, [declared], [own], onset) == (
        "gateway (Deployment, namespace rag) rolled out revision 7 90 seconds before the hit "
        "rate fell; also changed: rag-api (Deployment, namespace rag) 30 minutes before, "
        "late (ConfigMap, namespace llm) 0 seconds before"
    )
    failed = Scan(failures={declared: "HTTP 403: forbidden", own: "HTTP 403: forbidden"})
    assert describe(failed, [declared], [own], onset).startswith(
        "could not look for changes before the drop; not read: Deployments app=rag-api in "
        "namespace rag: HTTP 403: forbidden"
    )


# --- namespaces are walls, and values are never quoted -----------------------------------


def test_a_prompt_source_in_a_namespace_not_allowed_is_not_read_and_the_chart_value_named(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    """A policy in ``llm`` naming a Deployment in ``tenant-b`` (not opened to prompt
    sources): no request names tenant-b, nothing of it is in status or Events, and the
    message says why and which chart value would open it."""
    # No namespace opened (the default); ConfigMaps listed, so the own namespace's show.
    walled = Operator(cluster.api, clock=clock, correlate_configmaps=True)
    source = {"namespace": "tenant-b", "kind": "Deployment", "labelSelector": "app=rag-api"}

    def foreign(onset: datetime) -> None:
        rag_api(cluster, "tenant-b", onset - timedelta(minutes=4), (["--k=1"], [DB_URL]))

    status = collapse(cluster, engines, prometheus, clock, walled, [source], foreign)
    message = status["suspectedChange"]["message"]
    assert message.endswith(
        "; not read: namespace tenant-b is not allowed for prompt sources "
        "(chart value rbac.changeCorrelation.namespaces)"
    ), message
    assert message.startswith("no change found in Deployments in namespace llm, ConfigMaps")
    events = json.dumps(cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events"))
    for text in (json.dumps(status), events):
        assert "rag-api" not in text
        assert "db-url" not in text
        assert PASSWORD not in text
    assert [str(r.url.path) for r in cluster.requests("get") if "/tenant-b/" in str(r.url)] == []


def test_by_default_no_configmap_is_listed_and_a_declared_one_is_said_unread(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    """Without ``--correlate-configmaps`` (the chart grants no ``list`` on ConfigMaps): no
    request lists ConfigMaps, a ConfigMap written before the drop is not named, and a
    declared ConfigMap prompt source is said unread, naming the chart value, not a 403."""
    default = Operator(cluster.api, clock=clock, prompt_source_namespaces=frozenset({"rag"}))
    source = {"namespace": "rag", "kind": "ConfigMap", "labelSelector": "app=rag-api"}

    def edits(onset: datetime) -> None:
        at = onset - timedelta(minutes=5)
        cluster.put(CONFIG_MAPS, written(CONFIG_MAPS, "ConfigMap", "prompt-templates", "llm", at))
        cluster.put(CONFIG_MAPS, written(CONFIG_MAPS, "ConfigMap", "rag-templates", "rag", at))
        rag_api(cluster, "llm", onset - timedelta(minutes=7))

    status = collapse(cluster, engines, prometheus, clock, default, [source], edits)
    message = status["suspectedChange"]["message"]
    assert message == (
        "rag-api (Deployment, namespace llm) rolled out revision 42 (image rag-api:1.8.2 → "
        "1.8.3) 7 minutes before the hit rate fell; not read: ConfigMaps app=rag-api in "
        "namespace rag: ConfigMaps are not listed (chart value "
        "rbac.changeCorrelation.configMaps)"
    )
    assert "templates" not in json.dumps(status)
    assert lists_of(cluster, "configmaps") == []
    assert len(lists_of(cluster, "replicasets")) == 2  # two looks, the own namespace only


def test_with_configmaps_listed_a_declared_and_an_own_configmap_are_read(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    """With ``--correlate-configmaps``: the declared ConfigMap source and the own namespace
    are listed (metadata only) on each look, and the declared write is named first."""
    source = {"namespace": "rag", "kind": "ConfigMap", "labelSelector": "app=rag-api"}

    def edits(onset: datetime) -> None:
        at = onset - timedelta(minutes=5)
        cluster.put(CONFIG_MAPS, written(CONFIG_MAPS, "ConfigMap", "prompt-templates", "llm", at))
        cluster.put(CONFIG_MAPS, written(CONFIG_MAPS, "ConfigMap", "rag-templates", "rag", at))

    status = collapse(cluster, engines, prometheus, clock, operator, [source], edits)
    assert status["suspectedChange"]["message"] == (
        "rag-templates (ConfigMap, namespace rag) updated by kubectl-edit 5 minutes before "
        "the hit rate fell; also changed: prompt-templates (ConfigMap, namespace llm) "
        "5 minutes before"
    )
    listed = lists_of(cluster, "configmaps")
    assert sorted(str(r.url.path) for r in listed) == sorted(
        2 * ["/api/v1/namespaces/rag/configmaps", f"/api/v1/namespaces/{NAMESPACE}/configmaps"]
    )
    assert {r.headers["Accept"] for r in listed} == {METADATA_ONLY}


def test_a_credential_in_a_changed_flag_appears_in_no_status_event_or_log(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The rollout changed ``--db-url=postgres://admin:<password>@db``: the flag is named,
    its values hashed, the password is nowhere."""
    other = DB_URL.replace(PASSWORD, "another-pw")
    args = (["--chunk=512", DB_URL, "serve"], ["--chunk=512", other, "serve-fast"])

    def rollout(onset: datetime) -> None:
        rag_api(cluster, "rag", onset - timedelta(minutes=4), args)

    with caplog.at_level(logging.DEBUG):
        status = collapse(cluster, engines, prometheus, clock, operator, [RAG_SOURCE], rollout)
    before, after = DB_URL.partition("=")[2], other.partition("=")[2]
    said = (
        f"rag-api (Deployment, namespace rag) rolled out revision 42 (image rag-api:1.8.2 → "
        f"1.8.3; args: --db-url changed (value {value_hash(before)} → {value_hash(after)}), "
        f"argument 3 changed (value {value_hash('serve')} → {value_hash('serve-fast')}))"
    )
    assert status["suspectedChange"]["message"].startswith(said)
    (event,) = collapse_events(cluster)
    assert said in event
    events = json.dumps(cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events"))
    for text in (json.dumps(status), events, caplog.text):
        for secret in (PASSWORD, "another-pw", "postgres://", "serve-fast"):
            assert secret not in text


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (["--a=1"], ["--a=2"], ["--a changed (value {h1} → {h2})"]),
        (["--a", "1"], ["--a", "2"], ["--a changed (value {h1} → {h2})"]),
        (["-v"], [], ["-v removed"]),
        ([], ["--token=x"], ["--token added"]),
        (["1", "2"], ["1", "x"], ["argument 2 changed (value {h2} → {hx})"]),
        (["--a=1", "--b=2"], ["--b=2", "--a=1"], ["reordered"]),
        (
            ["-----BEGIN KEY-----"],
            ["-----BEGIN KEY2-----"],
            ["argument 1 changed (value {k} → {l})"],
        ),
    ],
    ids=["flag=value", "flag value", "removed", "added", "positional", "reordered", "not-a-flag"],
)
def test_arguments_are_named_by_flag_or_position_and_their_values_only_hashed(
    old: list[str], new: list[str], said: list[str]
) -> None:
    hashes = {
        "h1": value_hash("1"),
        "h2": value_hash("2"),
        "hx": value_hash("x"),
        "k": value_hash("-----BEGIN KEY-----"),
        "l": value_hash("-----BEGIN KEY2-----"),
    }
    words = argument_changes(old, new)
    assert words == [s.format_map(hashes) for s in said]
    for value in ("BEGIN", "token=x"):
        assert all(value not in w for w in words)


def test_a_value_hash_is_short_stable_and_keyed() -> None:
    assert value_hash("a") == value_hash("a") != value_hash("b")
    assert len(value_hash("a")) == 8
    assert int(value_hash("a"), 16) >= 0
    # Keyed: not the plain sha256 a table of common passwords would hold.
    assert value_hash(PASSWORD) != hashlib.sha256(PASSWORD.encode()).hexdigest()[:8]
