"""RBAC: exactly the permissions the operator uses, in each mode, and nothing else.

The contract (docs/security.md, "Permissions"): every write is a patch, only Events are
created, nothing is deleted or updated; what a feature needs only when it is on is granted
only then. With the default values nothing is patchable anywhere (Enforce is granted per
namespace by ``rbac.enforceNamespaces``, ``["*"]`` for all), no ConfigMap is listable
(``rbac.changeCorrelation.configMaps``), and no Secret is readable unless listed by name in
``rbac.prometheusSecrets`` (then in its namespace only) or its namespace is in
``rbac.changeCorrelation.secretNamespaces`` (then ``list`` there only). Every rendered
(resource, verb) appears in the docs' Permissions table, and every row there is rendered
by some values: the table and the chart cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chart.chart_helpers import (
    CHART,
    REPO,
    Manifest,
    by_kind,
    helm,
    one,
    render,
    render_error,
)

Permissions = dict[tuple[str, str], frozenset[str]]

READ = frozenset({"get", "list", "watch"})
READ_PATCH = READ | {"patch"}
PATCH = frozenset({"patch"})
LIST = frozenset({"list"})
TARGETS = (("apps", "deployments"), ("autoscaling", "horizontalpodautoscalers"))

BASE: Permissions = {
    ("cachescale.dev", "cachescalingpolicies"): READ_PATCH,
    ("cachescale.dev", "cachescalingpolicies/status"): frozenset({"get", "patch"}),
    ("apps", "deployments"): READ,
    ("autoscaling", "horizontalpodautoscalers"): READ,
    ("", "pods"): READ,
    ("", "events"): frozenset({"create", "patch"}),
    ("events.k8s.io", "events"): frozenset({"create", "patch"}),
}
CORRELATION: Permissions = {("apps", "replicasets"): LIST}
CONFIG_MAPS: Permissions = {("", "configmaps"): LIST}
TARGET_PATCH: Permissions = dict.fromkeys(TARGETS, READ_PATCH)
CLUSTER_ONLY_RULES: Permissions = {
    ("", "namespaces"): frozenset({"list", "watch"}),
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"}),
}
CLUSTER_PEERING: Permissions = {("kopf.dev", "clusterkopfpeerings"): READ_PATCH}
KEDA: Permissions = {("keda.sh", "scaledobjects"): READ}
KEDA_PATCH: Permissions = {("keda.sh", "scaledobjects"): READ_PATCH}
NAMESPACED_PEERING: Permissions = {("kopf.dev", "kopfpeerings"): READ_PATCH}
ENFORCE: Permissions = dict.fromkeys(TARGETS, PATCH)


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


def grants(manifests: list[Manifest]) -> Iterator[tuple[str | None, str, str, str]]:
    """Every (namespace or None for cluster-wide, group, resource, verb) the chart's
    bindings actually grant: a role counts only through a binding of the chart's account."""
    roles = {
        (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]): r
        for r in [*by_kind(manifests, "ClusterRole"), *by_kind(manifests, "Role")]
    }
    bindings = [*by_kind(manifests, "ClusterRoleBinding"), *by_kind(manifests, "RoleBinding")]
    for binding in bindings:
        where = binding["metadata"].get("namespace")  # None: a ClusterRoleBinding
        ref = binding["roleRef"]
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        yield where, group, resource, verb


def test_default_values_patch_nothing_and_read_no_configmap_or_secret() -> None:
    """Finding 9: cluster-wide mode granted patch on every Deployment and HPA (kube-system
    included) and list on every ConfigMap. By default now: no patch on a target anywhere,
    no ConfigMap or Secret anywhere, nothing at all granted in kube-system by a Role."""
    granted = list(grants(render({})))
    assert granted, "the defaults grant the operator its reads"
    patched = [g for g in granted if g[3] == "patch" and (g[1], g[2]) in TARGETS]
    assert patched == [], patched
    assert not [g for g in granted if g[2] in ("configmaps", "secrets")]
    assert not [g for g in granted if g[0] is not None], "no Role at all by default"
    cluster_wide = {(g[1], g[2], g[3]) for g in granted if g[0] is None}
    assert ("apps", "deployments", "watch") in cluster_wide, "targets are still seen"
    assert ("apps", "replicasets", "list") in cluster_wide, "own rollouts, any namespace"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, BASE | CORRELATION | CLUSTER_ONLY_RULES),
        ({"replicaCount": 2}, BASE | CORRELATION | CLUSTER_ONLY_RULES | CLUSTER_PEERING),
        # Restricted to namespaces but with a ClusterRole: kopf peers per namespace, and
        # change correlation moves to Roles in the watched namespaces.
        (
            {"watchNamespaces": ["llm"], "replicaCount": 3},
            BASE | CLUSTER_ONLY_RULES | NAMESPACED_PEERING,
        ),
        ({"watchNamespaces": ["llm"]}, BASE | CLUSTER_ONLY_RULES),
        ({"keda": {"enabled": True}}, BASE | CORRELATION | CLUSTER_ONLY_RULES | KEDA),
        (
            {"rbac": {"changeCorrelation": {"configMaps": True}}},
            BASE | CORRELATION | CONFIG_MAPS | CLUSTER_ONLY_RULES,
        ),
        # ["*"]: the chart's behaviour before rbac.enforceNamespaces, patch cluster-wide.
        (
            {"rbac": {"enforceNamespaces": ["*"]}, "keda": {"enabled": True}},
            BASE | CORRELATION | CLUSTER_ONLY_RULES | TARGET_PATCH | KEDA_PATCH,
        ),
        ({"rbac": {"enforceNamespaces": ["llm"]}}, BASE | CORRELATION | CLUSTER_ONLY_RULES),
    ],
    ids=[
        "standalone",
        "peered",
        "namespaces-peered",
        "namespaces-standalone",
        "keda",
        "configmaps",
        "enforce-everywhere",
        "enforce-in-llm",
    ],
)
def test_cluster_role_is_exactly_the_contract(
    values: dict[str, Any], expected: Permissions
) -> None:
    manifests = render(values)
    assert permissions(one(manifests, "ClusterRole")) == expected
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


def roles_by_namespace(manifests: list[Manifest], suffix: str) -> dict[str, Permissions]:
    """The chart's Roles named ``<fullname><suffix>``, by namespace, each checked bound
    to the chart's ServiceAccount by a RoleBinding of the same name and namespace."""
    account = one(manifests, "ServiceAccount")["metadata"]
    bindings = {
        (b["metadata"]["namespace"], b["metadata"]["name"]): b
        for b in by_kind(manifests, "RoleBinding")
    }
    found: dict[str, Permissions] = {}
    for role in by_kind(manifests, "Role"):
        meta = role["metadata"]
        if meta["name"] != f"{account['name']}{suffix}":
            continue
        binding = bindings[(meta["namespace"], meta["name"])]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": meta["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
        found[meta["namespace"]] = permissions(role)
    return found


def test_default_values_render_no_role() -> None:
    manifests = render({})
    assert not by_kind(manifests, "Role"), "no Secret access unless rbac.prometheusSecrets"
    assert not by_kind(manifests, "RoleBinding")


@pytest.mark.parametrize("keda", [False, True], ids=["hpa", "keda"])
def test_enforce_namespaces_grant_patch_there_and_nowhere_else(keda: bool) -> None:
    values = {"rbac": {"enforceNamespaces": ["llm", "rag"]}, "keda": {"enabled": keda}}
    manifests = render(values, namespace="cachescale-system")
    expected = ENFORCE | ({("keda.sh", "scaledobjects"): PATCH} if keda else {})
    assert roles_by_namespace(manifests, "-enforce") == {"llm": expected, "rag": expected}
    patched = {(g[0], g[2]) for g in grants(manifests) if g[3] == "patch" and g[1] != ""}
    targets = {"deployments", "horizontalpodautoscalers"} | ({"scaledobjects"} if keda else set())
    assert {(ns, r) for ns, r in patched if r in targets} == {
        (ns, r) for ns in ("llm", "rag") for r in targets
    }


def test_change_correlation_is_in_the_watched_namespaces_when_some_are_watched() -> None:
    values = {
        "watchNamespaces": ["llm", "rag"],
        "rbac": {"changeCorrelation": {"namespaces": ["templates", "rag"]}},
    }
    found = roles_by_namespace(render(values), "-change-correlation")
    assert found == dict.fromkeys(("llm", "rag", "templates"), CORRELATION)
    with_config_maps = {**values, "rbac": {"changeCorrelation": {"configMaps": True}}}
    found = roles_by_namespace(render(with_config_maps), "-change-correlation")
    assert found == dict.fromkeys(("llm", "rag"), CORRELATION | CONFIG_MAPS)


@pytest.mark.parametrize(
    ("replicas", "keda", "enforce", "expected"),
    [
        (1, False, [], {"llm": BASE | CORRELATION, "llm-staging": BASE | CORRELATION}),
        (
            2,
            False,
            [],
            dict.fromkeys(("llm", "llm-staging"), BASE | CORRELATION | NAMESPACED_PEERING),
        ),
        (1, True, [], dict.fromkeys(("llm", "llm-staging"), BASE | CORRELATION | KEDA)),
        (
            1,
            True,
            ["llm"],
            {
                "llm": BASE | CORRELATION | TARGET_PATCH | KEDA_PATCH,
                "llm-staging": BASE | CORRELATION | KEDA,
            },
        ),
        (1, False, ["*"], dict.fromkeys(("llm", "llm-staging"), BASE | CORRELATION | TARGET_PATCH)),
    ],
    ids=["standalone", "peered", "keda", "enforce-in-llm", "enforce-everywhere"],
)
def test_namespaced_roles_are_exactly_the_contract(
    replicas: int, keda: bool, enforce: list[str], expected: dict[str, Permissions]
) -> None:
    values = {
        "watchNamespaces": ["llm", "llm-staging"],
        "rbac": {"namespaced": True, "enforceNamespaces": enforce},
        "replicaCount": replicas,
        "keda": {"enabled": keda},
    }
    manifests = render(values, namespace="cachescale-system")
    # No cluster-wide access at all: no namespaces, no CRD discovery, no cluster peering.
    assert not by_kind(manifests, "ClusterRole")
    assert not by_kind(manifests, "ClusterRoleBinding")
    assert roles_by_namespace(manifests, "") == expected
    assert len(by_kind(manifests, "Role")) == 2, "no Role but the watched namespaces'"


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"rbac": {"enforceNamespaces": ["*", "llm"]}}, '"*" (every namespace) must be the only'),
        (
            {"watchNamespaces": ["llm"], "rbac": {"enforceNamespaces": ["kube-system"]}},
            "lists kube-system, which is not in watchNamespaces",
        ),
        ({"rbac": {"enforceNamespaces": ["Not A Namespace"]}}, "does not match pattern"),
        ({"rbac": {"changeCorrelation": {"configMaps": "yes"}}}, "configMaps"),
    ],
    ids=["star-and-more", "not-watched", "bad-name", "configmaps-not-boolean"],
)
def test_rbac_values_that_would_grant_for_nothing_are_refused(
    values: dict[str, Any], error: str
) -> None:
    assert error in render_error(values)


def test_rbac_create_false_renders_no_rbac() -> None:
    everything = {
        "rbac": {
            "create": False,
            "enforceNamespaces": ["llm"],
            "prometheusSecrets": [{"namespace": "llm", "names": ["t"]}],
            "changeCorrelation": {"configMaps": True, "secretNamespaces": ["llm"]},
        }
    }
    for values in ({"rbac": {"create": False}}, everything):
        manifests = render(values)
        for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            assert not by_kind(manifests, kind)


def test_no_wildcards_and_no_destructive_verbs() -> None:
    namespaced = {
        "watchNamespaces": ["a"],
        "rbac": {"namespaced": True, "enforceNamespaces": ["*"]},
        "replicaCount": 2,
        "keda": {"enabled": True},
    }
    cluster = {"replicaCount": 2, "keda": {"enabled": True}, "rbac": {"enforceNamespaces": ["*"]}}
    roles = [
        one(render(cluster), "ClusterRole"),
        *by_kind(render(namespaced), "Role"),
        *by_kind(render({"rbac": {"enforceNamespaces": ["a"]}, "keda": {"enabled": True}}), "Role"),
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
    assert len(rule_starts) == 19
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


@pytest.mark.parametrize("config_maps", [False, True], ids=["default", "configmaps"])
def test_prompt_source_namespaces_get_list_only_in_namespaced_mode(config_maps: bool) -> None:
    values = {
        "watchNamespaces": ["llm"],
        "rbac": {
            "namespaced": True,
            "changeCorrelation": {"namespaces": ["rag"], "configMaps": config_maps},
        },
    }
    manifests = render(values, namespace="cachescale-system")
    assert roles_by_namespace(manifests, "-prompt-sources") == {
        "rag": {("apps", "deployments"): LIST, ("apps", "replicasets"): LIST}
        | (CONFIG_MAPS if config_maps else {})
    }
    # Cluster-wide, serving every namespace, the ClusterRole already reaches it: no Role.
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


def notes(values: dict[str, Any]) -> str:
    """NOTES.txt as ``helm install`` prints it."""
    printed = helm(
        "install", "cs", str(CHART), "-n", "cachescale", "--dry-run=client", values=values
    )
    return printed.split("NOTES:", 1)[1]


def test_notes_say_where_enforce_may_act_and_how_to_allow_it() -> None:
    default = notes({})
    assert "Enforce is allowed in no namespace (rbac.enforceNamespaces is empty)" in default
    enable = "helm upgrade cs charts/cachescale -n cachescale --reuse-values"
    assert f"{enable} --set-json 'rbac.enforceNamespaces=[\"llm\"]'" in default
    listed = notes({"rbac": {"enforceNamespaces": ["team-a", "team-b"]}})
    assert "may patch their Deployment and HPA only in: team-a, team-b." in listed
    assert f"""{enable} --set-json 'rbac.enforceNamespaces=["team-a","team-b","llm"]'""" in listed
    everywhere = notes({"rbac": {"enforceNamespaces": ["*"]}})
    assert "Deployment and HPA in every namespace served" in everywhere
    assert "rbac.enforceNamespaces is empty" not in everywhere


# -- the docs' Permissions table ---------------------------------------------------------

SECURITY = REPO / "docs" / "security.md"
EVERY_FEATURE: list[dict[str, Any]] = [
    {},
    {
        "replicaCount": 2,
        "keda": {"enabled": True},
        "rbac": {
            "enforceNamespaces": ["*"],
            "prometheusSecrets": [{"namespace": "llm", "names": ["t"]}],
            "changeCorrelation": {"configMaps": True, "secretNamespaces": ["rag"]},
        },
    },
    {
        "watchNamespaces": ["llm"],
        "replicaCount": 2,
        "keda": {"enabled": True},
        "rbac": {
            "namespaced": True,
            "enforceNamespaces": ["llm"],
            "changeCorrelation": {"configMaps": True, "namespaces": ["rag"]},
        },
    },
    {
        "watchNamespaces": ["llm"],
        "keda": {"enabled": True},
        "rbac": {"enforceNamespaces": ["llm"], "changeCorrelation": {"namespaces": ["rag"]}},
    },
]
"""Values that together turn on every rule the chart can render."""


def documented() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every row of docs/security.md's Permissions table."""
    text = SECURITY.read_text(encoding="utf-8")
    section = re.search(r"^## [^\n]*Permissions[^\n]*\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "docs/security.md has a Permissions section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("| `")]
    assert rows, "the Permissions section has a table"
    found: set[tuple[str, str, str]] = set()
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 5, f"resource, verbs, scope, feature, chart value: {row}"
        assert all(cells), f"an empty cell: {row}"
        group, resource = cells[0].strip("`").split("/", 1)
        for verb in cells[1].split(","):
            found.add(("" if group == "core" else group, resource, verb.strip()))
    return found


def rendered() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule of every role ``EVERY_FEATURE`` renders."""
    found: set[tuple[str, str, str]] = set()
    for values in EVERY_FEATURE:
        manifests = render(values, namespace="cachescale-system")
        for role in [*by_kind(manifests, "ClusterRole"), *by_kind(manifests, "Role")]:
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        found |= {(group, resource, verb) for verb in rule["verbs"]}
    return found


def test_every_rendered_permission_is_in_the_docs_table_and_every_row_is_rendered() -> None:
    table, chart = documented(), rendered()
    assert chart - table == set(), "granted by the chart, missing from docs/security.md"
    assert table - chart == set(), "in docs/security.md, granted by no values"
