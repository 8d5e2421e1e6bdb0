"""Point 1: the chart installs, upgrades and uninstalls on a real API server.

Every object the chart renders must be accepted by the API server itself (admission,
RBAC escalation checks, CRD validation), not only by a schema checker. The default-values
cycle (install → upgrade → uninstall → install) runs once per session in the ``release``
fixture (e2e/harness/release.py); the namespaced variant runs here as its own release.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.cluster import Cluster
from e2e.harness.release import CHART, CRD, Release, wait_flags
from e2e.kube_helpers import apply, get, until
from e2e.operators import chart_flags, evaluated_again, operator_process
from e2e.serving import APP
from tests.chart.chart_helpers import promtool_binary
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS
from tests.prometheus_fixture import free_port


def _objects(manifest: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def _exists(cluster: Cluster, obj: dict[str, Any], namespace: str) -> bool:
    meta = obj["metadata"]
    where = ("-n", meta.get("namespace", namespace))
    kind = (
        f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}"
        if "/" in obj["apiVersion"]
        else obj["kind"]
    )
    return cluster.kubectl("get", kind, meta["name"], *where, "-o", "name").returncode == 0


def test_default_values_install_upgrade_uninstall_keep_the_crd(
    cluster: Cluster, release: Release
) -> None:
    steps = release.steps
    for key in ("install", "manifest", "notes", "upgrade", "uninstall", "reinstall"):
        assert steps[key].returncode == 0, f"helm {steps[key].command}:\n{steps[key].stderr}"
    print({key: round(step.seconds, 1) for key, step in steps.items()})
    # NOTES.txt rendered, with the release's own facts.
    notes = steps["notes"].stdout
    assert f'is installed as release "{release.name}" in namespace "{release.namespace}"' in notes
    assert "One operator pod runs standalone." in notes
    assert "every namespace" in notes
    # Least privilege by default: Enforce nowhere, and the notes say how to allow it.
    assert "rbac.enforceNamespaces is empty" in notes
    assert "--set-json 'rbac.enforceNamespaces=[\"llm\"]'" in notes
    # Uninstall kept the CRD (helm.sh/resource-policy: keep), and reinstalling adopted it.
    kept = steps["crd-after-uninstall"]
    assert kept.returncode == 0, kept.stderr
    assert "cachescalingpolicies.cachescale.dev" in kept.stdout
    # Every object the chart rendered exists on the server now.
    objects = _objects(steps["manifest"].stdout)
    kinds = {obj["kind"] for obj in objects}
    assert {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"} <= kinds
    assert {"Deployment", "ServiceAccount"} <= kinds
    missing = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objects
        if not _exists(cluster, o, release.namespace)
    ]
    assert not missing, f"rendered but not on the server: {missing}"
    # The operator's Deployment rolled out (its pod made Ready by the node stand-in, or a
    # kubelet on a real cluster): `--wait` already required it.
    if cluster.envtest:
        deployment = get(cluster, "deployment", release.name, "-n", release.namespace)
        assert deployment["status"].get("availableReplicas") == 1


def test_namespaced_rbac_install_upgrade_uninstall(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    """crds.install=false: the CRD is the session release's (one owner per CRD)."""
    name, home = "cs-ns", f"{namespace}-op"
    full = f"{name}-cachescale"  # the chart's <release>-<chart> resource names
    where = ("-n", home)
    values = (
        "--set", "crds.install=false",
        "--set", "rbac.namespaced=true",
        "--set", f"watchNamespaces={{{namespace}}}",
        "--set", f"rbac.enforceNamespaces={{{namespace}}}",
    )  # fmt: skip
    try:
        installed = cluster.helm(
            "install", name, str(CHART), *where, "--create-namespace", *values, *wait_flags(cluster)
        )
        assert installed.returncode == 0, installed.stderr
        assert f"the namespaces {namespace}" in installed.stdout, "NOTES name the namespace"
        role = get(cluster, "role", full, "-n", namespace)
        assert role is not None, "a Role in the watched namespace"
        assert get(cluster, "clusterrole", full) is None, "no cluster-wide access"
        assert get(cluster, "rolebinding", full, "-n", namespace) is not None
        check_the_namespaced_operator(cluster, namespace, home, full, tmp_path)
        # Upgrade to two replicas: the KopfPeering the pods elect through is created.
        upgraded = cluster.helm(
            "upgrade",
            name,
            str(CHART),
            *where,
            *values,
            "--set",
            "replicaCount=2",
            *wait_flags(cluster),
        )
        assert upgraded.returncode == 0, upgraded.stderr
        assert get(cluster, "kopfpeering", full, "-n", namespace) is not None
        if cluster.envtest:
            deployment = get(cluster, "deployment", full, "-n", home)
            assert deployment["status"].get("availableReplicas") == 2
        removed = cluster.helm("uninstall", name, *where, "--wait", "--timeout", "2m")
        assert removed.returncode == 0, removed.stderr
        until(
            lambda: True if get(cluster, "role", full, "-n", namespace) is None else None,
            "the Role to go with the release",
            30,
        )
        assert cluster.kubectl("get", CRD, "-o", "name").returncode == 0
    finally:
        cluster.helm("uninstall", name, *where, "--timeout", "1m")
        cluster.kubectl("delete", "namespace", home, f"{namespace}-other", "--wait=false")


def check_the_namespaced_operator(
    cluster: Cluster, watched: str, home: str, account: str, workdir: Path
) -> None:
    """The operator as the namespaced release's ServiceAccount: it acts in the watched
    namespace, and a policy elsewhere is outside its watch scope (docs/install.md):
    ignored, with no error per round; the server refuses it everything outside."""
    other = f"{watched}-other"
    assert cluster.kubectl("create", "namespace", other).returncode == 0
    kubeconfig = cluster.token_kubeconfig(workdir / "ns.kubeconfig", home, account)
    as_operator = ("--kubeconfig", str(kubeconfig))
    for verb, resource, where, allowed in [
        ("patch", "deployments", watched, "yes"),
        ("patch", "deployments", other, "no"),
        ("get", "secrets", watched, "no"),
        ("list", "namespaces", watched, "no"),
    ]:
        can = cluster.kubectl(*as_operator, "auth", "can-i", verb, resource, "-n", where)
        assert can.stdout.strip() == allowed, (verb, resource, where, can.stdout, can.stderr)
    denied = cluster.kubectl(*as_operator, "get", "deployments", "-n", other)
    assert "Forbidden" in denied.stderr, denied.stderr
    for where in (watched, other):
        body = policy_body(APP, prometheus_url=f"http://127.0.0.1:{free_port()}")
        body["metadata"] = {"name": APP}
        apply(cluster, where, body)
    flags = chart_flags(get(cluster, "deployment", account, "-n", home))
    assert flags == ("--no-scanning",), "the chart's pods scan nothing they may not list"
    started = time.monotonic()
    flags = (*flags, *LOOPBACK_PROMETHEUS)
    with operator_process(workdir / "operator", kubeconfig, (watched,), flags=flags) as operator:
        print(f"namespaced operator ready after {time.monotonic() - started:.1f}s")
        until(
            lambda: (get(cluster, "csp", APP, "-n", watched) or {}).get("status") or None,
            "the watched policy's first status",
            60,
        )
        first_status_s = time.monotonic() - started
        print(f"first status after {first_status_s:.1f}s")
        # Without --no-scanning kopf retries its forbidden namespace/CRD lists for a minute
        # before it serves: a first status well inside that minute shows it did not wait.
        assert first_status_s < 45, operator.tail()
        evaluated_again(operator, watched, APP)  # at least one more round
        assert operator.process.poll() is None, operator.tail()
        ignored = get(cluster, "csp", APP, "-n", other)
        assert "status" not in ignored, "outside the watch scope: never evaluated"
        assert not ignored["metadata"].get("finalizers"), "nor taken over by kopf"
        output = operator.output()
        assert "Traceback" not in output, operator.tail()
        assert "Forbidden" not in output, operator.tail()
        assert "[ERROR" not in output, operator.tail()
        assert other not in output, operator.tail()
        assert f"{watched}/{APP}: " in output


RULES = CHART / "files" / "prometheus" / "cachescale-rules.yaml"
DASHBOARD = CHART / "files" / "grafana" / "cachescale-dashboard.json"


def test_monitoring_objects_install_as_the_prometheus_operator_reads_them(
    cluster: Cluster,
    release: Release,
    namespace: str,
    tmp_path: Path,
    prometheus_operator_crds: Path,
) -> None:
    """The ServiceMonitor, PrometheusRule and dashboard ConfigMap a kube-prometheus-stack
    user turns on: admitted under the Prometheus Operator's types, stored as rendered (no
    field pruned), the stored rules accepted by promtool, and the ServiceMonitor selecting
    the chart's metrics Service."""
    name, where = "cs-mon", ("-n", namespace)
    full = f"{name}-cachescale"
    values = (
        "--set", "crds.install=false",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        "--set", "prometheusRule.enabled=true",
        "--set", "prometheusRule.labels.release=kube-prometheus-stack",
        "--set", "grafanaDashboard.enabled=true",
    )  # fmt: skip
    try:
        installed = cluster.helm("install", name, str(CHART), *where, *values, *wait_flags(cluster))
        assert installed.returncode == 0, installed.stderr
        rule = get(cluster, "prometheusrule.monitoring.coreos.com", full, *where)
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        shipped = yaml.safe_load(RULES.read_text(encoding="utf-8"))
        assert rule["spec"] == {"groups": shipped["groups"]}, "stored as rendered, unpruned"
        stored = tmp_path / "stored-rules.yaml"
        stored.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
        checked = subprocess.run(
            [promtool_binary(), "check", "rules", str(stored)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        monitor = get(cluster, "servicemonitor.monitoring.coreos.com", full, *where)
        selector = monitor["spec"]["selector"]["matchLabels"]
        services = get(
            cluster, "services", *where, "-l", ",".join(f"{k}={v}" for k, v in selector.items())
        )
        assert [s["metadata"]["name"] for s in services["items"]] == [f"{full}-metrics"]
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
        [endpoint] = monitor["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == (
            "metrics",
            "/metrics",
            True,
        )
        if cluster.envtest:  # the endpoints controller runs: the port reaches a ready pod
            port = until(
                lambda: _serving_port(cluster, f"{full}-metrics", namespace),
                "a ready endpoint behind the metrics Service",
                60,
            )
            assert port == "metrics"
        board = get(cluster, "configmap", f"{full}-dashboard", *where)
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(board["data"]["cachescale-dashboard.json"]) == json.loads(
            DASHBOARD.read_text(encoding="utf-8")
        )
        # The stand-in's types bite: a rule duration Prometheus cannot parse is refused.
        broken = copy.deepcopy(rule)
        broken["spec"]["groups"][0]["rules"][0]["for"] = "15 minutes"
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            broken["metadata"].pop(key, None)
        refused = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(broken))
        assert refused.returncode != 0, "the API server took `for: 15 minutes`"
        assert "should match" in refused.stderr, refused.stderr
        removed = cluster.helm("uninstall", name, *where, "--wait", "--timeout", "2m")
        assert removed.returncode == 0, removed.stderr
        for kind in (
            "prometheusrule.monitoring.coreos.com",
            "servicemonitor.monitoring.coreos.com",
        ):
            assert get(cluster, kind, full, *where) is None, f"{kind} left behind"
    finally:
        cluster.helm("uninstall", name, *where, "--timeout", "1m")


def _serving_port(cluster: Cluster, service: str, namespace: str) -> str | None:
    """The name of the port a ready endpoint of ``service`` serves, once there is one."""
    slices = get(
        cluster, "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}"
    )
    for piece in slices["items"]:
        ready = [e for e in piece.get("endpoints") or [] if e["conditions"].get("ready")]
        if ready and piece.get("ports"):
            return str(piece["ports"][0]["name"])
    return None
