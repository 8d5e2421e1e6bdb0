"""RBAC: exactly the permissions the operator uses, in each mode, and nothing else.

The contract (docs/install.md#permissions): every write is a patch, only Events are
created, nothing is deleted or updated, no Secret is readable unless listed by name in
``rbac.prometheusSecrets`` (then in its namespace only) or its namespace is in
``rbac.changeCorrelation.secretNamespaces`` (then ``list`` there only), and the cluster-wide
extras (namespaces, CRD discovery) and the peering objects appear only where kopf needs them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.chart_helpers import CHART, Manifest, by_kind, one, render

Permissions = dict[tuple[str, str], frozenset[str]]

READ_PATCH = frozenset({"get", "list", "watch", "patch"})

NAMESPACED_RULES: Permissions = {
    ("cachescale.dev", "cachescalingpolicies"): READ_PATCH,
    ("cachescale.dev", "cachescalingpolicies/status"): frozenset({"get", "patch"}),
    ("apps", "deployments"): READ_PATCH,
    ("autoscaling", "horizontalpodautoscalers"): READ_PATCH,
    ("", "pods"): frozenset({"get", "list", "watch"}),
    ("apps", "replicasets"): frozenset({"list"}),
    ("", "configmaps"): frozenset({"list"}),
    ("", "events"): frozenset({"create", "patch"}),
    ("events.k8s.io", "events"): frozenset({"create", "patch"}),
}
CLUSTER_ONLY_RULES: Permissions = {
    ("", "namespaces"): frozenset({"list", "watch"}),
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"}),
}
CLUSTER_PEERING: Permissions = {("kopf.dev", "clusterkopfpeerings"): READ_PATCH}
KEDA: Permissions = {("keda.sh", "scaledobjects"): READ_PATCH}
NAMESPACED_PEERING: Permissions = {("kopf.dev", "kopfpeerings"): READ_PATCH}


def permissions(role: Manifest) -> Permissions:
    """A role's rules as ``(apiGroup, resource) -> verbs`` (rules may not overlap)."""
    found: Permissions = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        assert "secrets" not in rule["resources"], "Secrets only through their own Roles"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in found, f"{key} granted by two rules"
                found[key] = frozenset(rule["verbs"])
    return found


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, NAMESPACED_RULES | CLUSTER_ONLY_RULES),
        ({"replicaCount": 2}, NAMESPACED_RULES | CLUSTER_ONLY_RULES | CLUSTER_PEERING),
        # Restricted to namespaces but with a ClusterRole: kopf peers per namespace.
        (
            {"watchNamespaces": ["llm"], "replicaCount": 3},
            NAMESPACED_RULES | CLUSTER_ONLY_RULES | NAMESPACED_PEERING,
        ),
        ({"watchNamespaces": ["llm"]}, NAMESPACED_RULES | CLUSTER_ONLY_RULES),
        ({"keda": {"enabled": True}}, NAMESPACED_RULES | CLUSTER_ONLY_RULES | KEDA),
    ],
    ids=["standalone", "peered", "namespaces-peered", "namespaces-standalone", "keda"],
)
def test_cluster_role_is_exactly_the_contract(
    values: dict[str, Any], expected: Permissions
) -> None:
    manifests = render(values)
    assert permissions(one(manifests, "ClusterRole")) == expected
    assert not by_kind(manifests, "Role"), "no Secret access unless rbac.prometheusSecrets"
    assert not by_kind(manifests, "RoleBinding")
    binding = one(manifests, "ClusterRoleBinding")
    role = one(manifests, "ClusterRole")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(manifests, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


@pytest.mark.parametrize(
    ("replicas", "keda", "expected"),
    [
        (1, False, NAMESPACED_RULES),
        (2, False, NAMESPACED_RULES | NAMESPACED_PEERING),
        (1, True, NAMESPACED_RULES | KEDA),
    ],
    ids=["standalone", "peered", "keda"],
)
def test_namespaced_roles_are_exactly_the_contract(
    replicas: int, keda: bool, expected: Permissions
) -> None:
    values = {
        "watchNamespaces": ["llm", "llm-staging"],
        "rbac": {"namespaced": True},
        "replicaCount": replicas,
        "keda": {"enabled": keda},
    }
    manifests = render(values, namespace="cachescale-system")
    # No cluster-wide access at all: no namespaces, no CRD discovery, no cluster peering.
    assert not by_kind(manifests, "ClusterRole")
    assert not by_kind(manifests, "ClusterRoleBinding")
    roles = by_kind(manifests, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["llm", "llm-staging"]
    for role in roles:
        assert permissions(role) == expected, role["metadata"]["namespace"]
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(manifests, "RoleBinding")}
    assert sorted(bindings) == ["llm", "llm-staging"]
    for binding in bindings.values():
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "cachescale", "namespace": "cachescale-system"}
        ]


def test_rbac_create_false_renders_no_rbac() -> None:
    manifests = render({"rbac": {"create": False}})
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert not by_kind(manifests, kind)


def test_no_wildcards_and_no_destructive_verbs() -> None:
    namespaced = {
        "watchNamespaces": ["a"],
        "rbac": {"namespaced": True},
        "replicaCount": 2,
        "keda": {"enabled": True},
    }
    roles = [
        one(render({"replicaCount": 2, "keda": {"enabled": True}}), "ClusterRole"),
        *by_kind(render(namespaced), "Role"),
    ]
    for role in roles:
        for (group, resource), verbs in permissions(role).items():
            assert "*" not in (group, resource, *verbs)
            assert not verbs & {"delete", "deletecollection", "update", "escalate", "bind"}
            if "create" in verbs:
                assert resource == "events", (group, resource)


def test_every_rule_is_commented_by_why() -> None:
    """Each rule in the template sits under a comment explaining why it is needed."""
    lines = (CHART / "templates" / "rbac.yaml").read_text(encoding="utf-8").splitlines()
    rule_starts = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert len(rule_starts) == 17
    for index in rule_starts:
        above = lines[index - 1].strip()
        below_a_sibling = lines[index - 1].strip().startswith("verbs:")
        # Two rules for the two Event APIs share one comment.
        assert above.startswith(("#", "{{")) or (
            below_a_sibling and "events" in lines[index + 1]
        ), f"rbac.yaml line {index + 1} has no comment"


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster", "namespaced"])
def test_prometheus_secrets_are_readable_by_name_in_their_namespace_only(
    namespaced: bool,
) -> None:
    values = {
        "watchNamespaces": ["llm"],
        "rbac": {
            "namespaced": namespaced,
            "prometheusSecrets": [{"namespace": "llm", "names": ["prom-token", "prom-ca"]}],
        },
    }
    manifests = render(values, namespace="cachescale-system")
    secret_roles = [r for r in by_kind(manifests, "Role") if "secrets" in str(r["rules"])]
    assert len(secret_roles) == 1
    role = secret_roles[0]
    assert role["metadata"]["namespace"] == "llm"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["prom-token", "prom-ca"],
            "verbs": ["get"],
        }
    ]
    binding = next(
        b
        for b in by_kind(manifests, "RoleBinding")
        if b["roleRef"]["name"] == role["metadata"]["name"]
    )
    assert binding["metadata"]["namespace"] == "llm"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "cachescale", "namespace": "cachescale-system"}
    ]


def test_prompt_source_namespaces_get_list_only_in_namespaced_mode() -> None:
    values = {
        "watchNamespaces": ["llm"],
        "rbac": {"namespaced": True, "changeCorrelation": {"namespaces": ["rag"]}},
    }
    manifests = render(values, namespace="cachescale-system")
    (role,) = [r for r in by_kind(manifests, "Role") if r["metadata"]["namespace"] == "rag"]
    assert permissions(role) == {
        ("apps", "deployments"): frozenset({"list"}),
        ("apps", "replicasets"): frozenset({"list"}),
        ("", "configmaps"): frozenset({"list"}),
    }
    bindings = by_kind(manifests, "RoleBinding")
    (binding,) = [b for b in bindings if b["metadata"]["namespace"] == "rag"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # Cluster-wide, the ClusterRole already reaches every namespace: no extra Role.
    cluster_wide = render({"rbac": {"changeCorrelation": {"namespaces": ["rag"]}}})
    assert not by_kind(cluster_wide, "Role")


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster", "namespaced"])
def test_secret_metadata_is_listable_only_where_opted_in(namespaced: bool) -> None:
    values = {
        "watchNamespaces": ["llm"],
        "rbac": {"namespaced": namespaced, "changeCorrelation": {"secretNamespaces": ["rag"]}},
    }
    manifests = render(values, namespace="cachescale-system")
    secret_roles = [r for r in by_kind(manifests, "Role") if "secrets" in str(r["rules"])]
    assert [r["metadata"]["namespace"] for r in secret_roles] == ["rag"]
    assert secret_roles[0]["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}
    ]
    binding = next(
        b
        for b in by_kind(manifests, "RoleBinding")
        if b["roleRef"]["name"] == secret_roles[0]["metadata"]["name"]
    )
    assert binding["metadata"]["namespace"] == "rag"
