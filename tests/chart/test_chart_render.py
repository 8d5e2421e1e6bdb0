"""The Helm chart: lint, render, validate every manifest, and the operator's Deployment."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from cachescale.controller.target.claims import DEPLOYMENT_ENV, NAMESPACE_ENV
from tests.chart.chart_helpers import (
    CHART,
    CHART_CRD_COPY,
    CRD_SOURCE,
    Manifest,
    by_kind,
    helm,
    one,
    render,
    render_error,
    validation_errors,
)

ALL_ON: dict[str, Any] = {
    "replicaCount": 2,
    "metrics": {
        "service": {"enabled": True, "annotations": {"prometheus.io/scrape": "true"}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    },
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "LLM serving"}},
    "commonLabels": {"team": "inference"},
    "podAnnotations": {"example.com/owner": "inference"},
    "podLabels": {"tier": "control"},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"annotations": {"example.com/role": "cachescale"}},
    "operator": {
        "logFormat": "text",
        "extraArgs": ["--verbose"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    ],
    "priorityClassName": "system-cluster-critical",
}
NAMESPACED: dict[str, Any] = ALL_ON | {
    "watchNamespaces": ["llm", "llm-staging"],
    "rbac": {"namespaced": True},
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "all-toggles-on": ALL_ON,
    "all-toggles-on-namespaced": NAMESPACED,
    "namespaces-with-cluster-rbac": {"watchNamespaces": ["llm"], "replicaCount": 3},
    "shard-by-label": {"policySelector": "shard in (blue,green),!canary", "replicaCount": 2},
    "no-crds-no-rbac-no-sa": {
        "crds": {"install": False},
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "existing"},
    },
}


def deployment(values: dict[str, Any] | None = None) -> Manifest:
    return one(render(values), "Deployment")


def container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment(values)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def chart_meta() -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    return meta


# -- lint and validity ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint(scenario: str) -> None:
    output = helm("lint", "--strict", str(CHART), values=SCENARIOS[scenario])
    assert "0 chart(s) failed" in output


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_manifest_is_valid(scenario: str) -> None:
    manifests = render(SCENARIOS[scenario])
    assert manifests
    problems = {
        f"{m['kind']}/{m['metadata'].get('namespace', '')}/{m['metadata']['name']}": errors
        for m in manifests
        if (errors := validation_errors(m))
    }
    assert not problems, json.dumps(problems, indent=2)


def test_validation_catches_mistakes() -> None:
    """The validators used above are not blind: typos and wrong types fail."""
    monitor = one(render(ALL_ON), "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    assert validation_errors(monitor)
    rule = one(render(ALL_ON), "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "two minutes"
    assert validation_errors(rule)
    peering = one(render(ALL_ON), "ClusterKopfPeering")
    peering["status"] = "not an object"
    assert validation_errors(peering)
    broken = deployment()
    broken["spec"]["replicas"] = "two"
    assert validation_errors(broken)


def test_default_install_is_minimal() -> None:
    kinds = sorted(m["kind"] for m in render())
    assert kinds == sorted(
        [
            "CustomResourceDefinition",  # cachescalingpolicies (templates/crd.yaml)
            "CustomResourceDefinition",  # clusterkopfpeerings (crds/, always shipped)
            "CustomResourceDefinition",  # kopfpeerings (crds/, always shipped)
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
        ]
    )


def test_toggles_add_their_resources() -> None:
    kinds = {m["kind"] for m in render(ALL_ON)}
    assert {"Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "ClusterKopfPeering"} <= (
        kinds
    )
    only_service = {m["kind"] for m in render({"metrics": {"service": {"enabled": True}}})}
    assert "Service" in only_service
    assert "ServiceMonitor" not in only_service


def test_service_monitor_scrapes_the_metrics_service_as_job_cachescale() -> None:
    manifests = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    service, monitor = one(manifests, "Service"), one(manifests, "ServiceMonitor")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment()["spec"]["selector"]["matchLabels"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    # The job label comes from the Service's part-of label: job="cachescale" (the rules'
    # CachescaleOperatorDown selects it), whatever the release is called.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "cachescale"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keep the policy's `namespace` label


# -- the Deployment ---------------------------------------------------------------------------


def test_operator_runs_locked_down() -> None:
    pod = deployment()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security
    mounts = {m["mountPath"] for m in container()["volumeMounts"]}
    assert mounts == {"/tmp"}, "the only writable path is the /tmp emptyDir"


def test_operator_has_resources_and_probes() -> None:
    operator = container()
    assert set(operator["resources"]["requests"]) == {"cpu", "memory"}
    assert set(operator["resources"]["limits"]) == {"cpu", "memory"}
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert operator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_image_defaults_to_app_version() -> None:
    meta = chart_meta()
    assert container()["image"] == f"ghcr.io/cachescale/cachescale:{meta['appVersion']}"
    assert container({"image": {"tag": "0.2.0-rc1"}})["image"].endswith(":0.2.0-rc1")
    digest = "sha256:" + "ab" * 32
    assert container({"image": {"digest": digest}})["image"] == (
        f"ghcr.io/cachescale/cachescale@{digest}"
    )


def test_standalone_by_default() -> None:
    assert container()["args"] == [
        "run",
        "--metrics-port=9090",
        "--health-port=8080",
        "--log-format=json",
        "--max-concurrent-per-namespace=4",
        "--status-refresh=10m",
        "--prometheus-max-response-bytes=16777216",
        "--standalone",
    ]
    # Never two standalone operators at once, not even during a rollout.
    assert deployment()["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment()["spec"]["replicas"] == 1
    assert not by_kind(render(), "ClusterKopfPeering")


def test_replicas_elect_a_leader_through_kopf_peering() -> None:
    manifests = render({"replicaCount": 2})
    args = container({"replicaCount": 2})["args"]
    assert "--peering=cachescale" in args
    assert "--standalone" not in args
    assert one(manifests, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    assert one(manifests, "ClusterKopfPeering")["metadata"]["name"] == "cachescale"
    crds = {c["metadata"]["name"] for c in by_kind(manifests, "CustomResourceDefinition")}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= crds
    env = {e["name"]: e for e in container({"replicaCount": 2})["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    affinity = one(manifests, "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert "podAntiAffinity" in affinity


def test_the_operator_is_told_which_deployment_is_its_own() -> None:
    """No policy may target the operator (cachescale/controller/target/claims.py): it learns its
    namespace from the downward API and its Deployment's name from the chart."""
    env = {e["name"]: e for e in container()["env"]}
    assert env[NAMESPACE_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env[DEPLOYMENT_ENV]["value"] == one(render(), "Deployment")["metadata"]["name"]


def test_namespaced_operator_peers_in_each_namespace() -> None:
    manifests = render(NAMESPACED)
    args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=llm",
        "--namespace=llm-staging",
    ]
    assert "--log-format=text" in args
    assert args[-1] == "--verbose"
    peerings = by_kind(manifests, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["llm", "llm-staging"]
    assert {p["metadata"]["name"] for p in peerings} == {"cachescale"}
    assert not by_kind(manifests, "ClusterKopfPeering")
    custom = render(NAMESPACED | {"peering": {"name": "cs-leader"}})
    assert {p["metadata"]["name"] for p in by_kind(custom, "KopfPeering")} == {"cs-leader"}


def test_a_shard_passes_its_policy_selector_and_peers_under_its_own_name() -> None:
    """Two releases splitting the fleet by policy labels: each operator gets its selector,
    and each release its own peering object, so each shard keeps exactly one active pod."""
    shards = {
        release: render({"policySelector": f"shard={release}", "replicaCount": 2}, release=release)
        for release in ("blue", "green")
    }
    for release, manifests in shards.items():
        args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [a for a in args if a.startswith("--policy-selector")] == [
            f"--policy-selector=shard={release}"
        ]
        assert f"--peering={release}-cachescale" in args
        assert one(manifests, "ClusterKopfPeering")["metadata"]["name"] == f"{release}-cachescale"
        # A selector narrows what is watched, not what may be done: the same RBAC.
        unsharded = render({"replicaCount": 2}, release=release)
        assert one(manifests, "ClusterRole")["rules"] == one(unsharded, "ClusterRole")["rules"]
    # Set-based selectors reach the operator as one argument, spaces and all.
    spaced = container({"policySelector": "tier in (a, b),!canary"})["args"]
    assert "--policy-selector=tier in (a, b),!canary" in spaced
    # Unset: every policy, no flag.
    assert not [a for a in container()["args"] if a.startswith("--policy-selector")]


def test_a_shard_by_namespace_peers_in_its_own_namespaces() -> None:
    manifests = render({"watchNamespaces": ["team-a"], "replicaCount": 2}, release="team-a")
    peering = one(manifests, "KopfPeering")
    assert (peering["metadata"]["namespace"], peering["metadata"]["name"]) == (
        "team-a",
        "team-a-cachescale",
    )


def test_names_follow_the_release() -> None:
    manifests = render(release="prod", namespace="ops")
    assert one(manifests, "Deployment")["metadata"]["name"] == "prod-cachescale"
    assert one(manifests, "Deployment")["metadata"]["namespace"] == "ops"
    binding = one(manifests, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prod-cachescale", "namespace": "ops"}
    ]
    existing = render({"serviceAccount": {"create": False, "name": "existing"}})
    assert not by_kind(existing, "ServiceAccount")
    assert one(existing, "ClusterRoleBinding")["subjects"][0]["name"] == "existing"


# -- the CRD ------------------------------------------------------------------------------------


def test_chart_crd_copy_is_byte_identical_to_crds_folder() -> None:
    assert CHART_CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        f"{CHART_CRD_COPY.relative_to(CHART.parents[1])} drifted from "
        f"{CRD_SOURCE.relative_to(CHART.parents[1])}: copy it after `make generate`"
    )


def test_rendered_crd_is_the_generated_one_and_kept() -> None:
    source = yaml.safe_load(CRD_SOURCE.read_text(encoding="utf-8"))
    crds = {c["metadata"]["name"]: c for c in by_kind(render(), "CustomResourceDefinition")}
    rendered = crds["cachescalingpolicies.cachescale.dev"]
    assert rendered["spec"] == source["spec"]
    assert rendered["apiVersion"] == source["apiVersion"]
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert source["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()


def test_crds_install_false_leaves_the_policy_crd_out() -> None:
    names = {
        c["metadata"]["name"]
        for c in by_kind(render({"crds": {"install": False}}), "CustomResourceDefinition")
    }
    assert "cachescalingpolicies.cachescale.dev" not in names


# -- values, schema, notes ------------------------------------------------------------------------


def _comment_coverage(text: str) -> list[str]:
    """Keys in values.yaml with no comment on themselves or any enclosing key."""
    uncovered: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, covered)
    previous_comment = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            previous_comment = False
            continue
        if stripped.startswith("#"):
            previous_comment = True
            continue
        match = re.match(r"^(\s*)(?:- )?([A-Za-z_][\w.-]*):(.*)$", line)
        if match is None:
            previous_comment = False
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        covered = previous_comment or "#" in rest or any(c for _, _, c in stack)
        is_leaf = rest.split("#")[0].strip() != ""
        if is_leaf and not covered:
            uncovered.append(".".join([k for _, k, _ in stack] + [key]))
        stack.append((indent, key, covered))
        previous_comment = False
    return uncovered


def test_every_value_is_commented() -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    assert _comment_coverage(text) == []
    # The checker itself notices a bare value.
    assert _comment_coverage(text + "\nundocumented: 1\n") == ["undocumented"]


def test_values_match_their_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(values)

    def keys(node: Any, schema_node: dict[str, Any], path: str) -> None:
        if not isinstance(node, dict) or "properties" not in schema_node:
            return
        for key, value in node.items():
            assert key in schema_node["properties"], f"{path}{key} is not in the schema"
            child = schema_node["properties"][key]
            assert child.get("description"), f"{path}{key} has no description in the schema"
            keys(value, child, f"{path}{key}.")

    keys(values, schema, "")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 0}, "replicaCount"),
        ({"operator": {"logFormat": "xml"}}, "logFormat"),
        ({"replicaCoutn": 2}, "replicaCoutn"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"rbac": {"namespaced": True}}, "watchNamespaces"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
        ({"policySelector": "team='search'"}, "policySelector"),
        ({"policySelector": "a=b\nc=d"}, "policySelector"),
    ],
)
def test_bad_values_are_rejected(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_notes_say_what_to_run_next() -> None:
    notes = helm(
        "install", "cachescale", str(CHART), "--namespace", "cachescale", "--dry-run=client"
    )
    notes = notes.split("NOTES:", 1)[1]
    for command in ("kubectl apply -f", "kubectl get csp", "kubectl describe csp"):
        assert command in notes, command
    peered = helm(
        "install",
        "cachescale",
        str(CHART),
        "--dry-run=client",
        values={"replicaCount": 2, "prometheusRule": {"enabled": True}},
    )
    assert "kopf peering" in peered
    assert "PrometheusRule created" in peered


def test_chart_files_are_commented() -> None:
    for path in sorted(CHART.rglob("*")):
        if path.suffix in (".yaml", ".tpl", ".txt") and path.is_file():
            text = path.read_text(encoding="utf-8")
            assert text.lstrip().startswith(("#", "{{")), f"{path} has no leading comment"
            if path.parent.name == "templates" and path.suffix == ".yaml":
                assert re.search(r"^\s*#|\{\{-? ?/\*", text, re.MULTILINE), path


def test_namespaced_rbac_turns_kopf_scanning_off() -> None:
    """Roles grant no namespace or CRD list: kopf must not try (it would retry for ~1 min)."""

    def args(values: dict[str, object]) -> list[str]:
        deployment = one(render(values), "Deployment")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--no-scanning" not in args({})
    assert "--no-scanning" not in args({"watchNamespaces": ["llm"]})
    assert "--no-scanning" in args({"watchNamespaces": ["llm"], "rbac": {"namespaced": True}})


def test_keda_enabled_indexes_scaled_objects_where_rbac_lets_it_watch_them() -> None:
    """``--keda`` (a watch-fed index of ScaledObjects) only with the rule that allows it."""
    for values, indexed in (({}, False), ({"keda": {"enabled": True}}, True)):
        rendered = render(values)
        container = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        rules = one(rendered, "ClusterRole")["rules"]
        watched = any(
            "scaledobjects" in r["resources"] and {"list", "watch"} <= set(r["verbs"])
            for r in rules
        )
        assert ("--keda" in container["args"]) is indexed
        assert watched is indexed
