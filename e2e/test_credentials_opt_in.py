"""No confused deputy on a real API server: the operator, as the chart's ServiceAccount and
granted ``get`` on a Secret exactly as ``rbac.prometheusSecrets`` grants it, sends that
Secret's value nowhere until the Secret carries the opt-in label (docs/security.md).

The "Prometheus" is the scripted fake on loopback (tests/gather/gather_fakes.py), which
records every request and its headers: what reaches it is what the operator sent.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from cachescale.api.policy import PROMETHEUS_CREDENTIALS
from e2e.harness.cluster import Cluster
from e2e.harness.release import CHART, Release
from e2e.kube_helpers import apply, events_for, get, until
from e2e.operators import evaluated_again
from e2e.serving import APP, create_stack
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, run_operator
from tests.gather.gather_fakes import fake_prometheus

TOKEN = "database-password-not-for-prometheus"


def grant_secret(cluster: Cluster, release: Release, namespace: str, name: str) -> None:
    """Apply the Role and RoleBinding the chart renders for ``rbac.prometheusSecrets``."""
    rendered = cluster.helm(
        "template", release.name, str(CHART), "-n", release.namespace,
        "--show-only", "templates/rbac.yaml",
        "--set-json", f'rbac.prometheusSecrets=[{{"namespace":"{namespace}","names":["{name}"]}}]',
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    for doc in yaml.safe_load_all(rendered.stdout):
        if doc and doc["kind"] in ("Role", "RoleBinding"):
            apply(cluster, namespace, doc)


def condition(cluster: Cluster, namespace: str, kind: str) -> dict[str, Any] | None:
    found = get(cluster, "csp", APP, "-n", namespace) or {}
    for entry in found.get("status", {}).get("conditions", []):
        if entry["type"] == kind:
            return dict(entry)
    return None


def test_an_unlabelled_secret_is_not_sent_until_it_is_labelled(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    create_stack(cluster, namespace, "m", 1)
    grant_secret(cluster, release, namespace, "prom")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "prom"},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    apply(cluster, namespace, secret)
    with (
        fake_prometheus() as prometheus,
        run_operator(tmp_path, kubeconfig, namespace, LOOPBACK_PROMETHEUS) as operator,
    ):
        body = policy_body(
            APP,
            prometheus_url=prometheus.url,
            extra={
                "metrics": {
                    "selector": {"namespace": namespace, "model_name": "m"},
                    "auth": {"bearerTokenSecretRef": {"name": "prom", "key": "token"}},
                }
            },
        )
        body["metadata"] = {"name": APP}
        apply(cluster, namespace, body)

        def refused() -> dict[str, Any] | None:
            found = condition(cluster, namespace, "MetricsAvailable")
            return found if found and found["reason"] == "CredentialsNotAllowed" else None

        metrics = until(refused, "MetricsAvailable=False CredentialsNotAllowed", 90)
        assert metrics["status"] == "False"
        assert f"kubectl label secret prom -n {namespace}" in metrics["message"]
        warnings = events_for(cluster, namespace, "CacheScalingPolicy", APP)
        assert [e["reason"] for e in warnings if e["type"] == "Warning"] == [
            "CredentialsNotAllowed"
        ]
        evaluated_again(operator, namespace, APP)  # refused again: still nothing sent
        assert prometheus.queries == []

        labelled = cluster.kubectl(
            "label", "secret", "prom", "-n", namespace, f"{PROMETHEUS_CREDENTIALS}=true"
        )
        assert labelled.returncode == 0, labelled.stderr
        until(lambda: prometheus.headers or None, "a query once the Secret is labelled", 60)
        assert {h.get("Authorization") for h in prometheus.headers} == {f"Bearer {TOKEN}"}
