"""A hostile tenant's Prometheus URL on a real API server (issue 53, findings 1 and 6's
port scanner): nothing reaches an address the cluster owner did not list.

Alice may create policies in tenant-a only (impersonated: ``kubectl --as``); the operator
runs as the chart's ServiceAccount with the chart's flags. The "sink" is the scripted fake
Prometheus on loopback (tests/gather/gather_fakes.py), which records every request and its
headers, and a labelled bearer-token Secret is there for the taking: before the fix the
operator connected to the sink and sent that token.

- With ``--allowed-prometheus-url http://prom.monitoring:9090`` (a name that resolves
  nowhere: it is never connected to), the policy URL
  ``http://127.0.0.1:<sink>\\@prom.monitoring:9090`` is refused, at admission by the CRD's
  pattern or by the operator (``InvalidSpec`` by the spec's own pattern, or
  ``MetricsURLNotAllowed`` by the egress check with a CRD that lets it through): any is
  accepted, and in every case the sink receives nothing.
- With the chart's default (no allowed URL), a policy naming the live sink and then one
  naming a closed port both report ``MetricsURLNotAllowed`` with the same words: the status no
  longer tells an open port from a closed one, and the sink receives nothing.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cachescale.api.policy import PROMETHEUS_CREDENTIALS
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, get, until
from e2e.operators import evaluated_again
from e2e.serving import APP, create_stack
from e2e.tenancy import Tenancy, tenancy, tenant_operator  # noqa: F401 (a fixture)
from e2e.test_credentials_opt_in import grant_secret
from tests.controller.cluster import policy as policy_body
from tests.gather.gather_fakes import closed_port_url, fake_prometheus

TOKEN = "tenant-a-prometheus-token-not-for-127-0-0-1"
ALLOWED = "http://prom.monitoring:9090"
"""The cluster owner's one allowed Prometheus: resolves nowhere, so never connected to."""


def labelled_token(cluster: Cluster, release: Release, namespace: str) -> dict[str, Any]:
    """A bearer-token Secret the operator may read and has opted in: what a bypass sends."""
    grant_secret(cluster, release, namespace, "prom")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "prom", "labels": {PROMETHEUS_CREDENTIALS: "true"}},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    apply(cluster, namespace, secret)
    return {"bearerTokenSecretRef": {"name": "prom", "key": "token"}}


def hostile_policy(name: str, url: str, namespace: str, auth: dict[str, Any]) -> dict[str, Any]:
    body = policy_body(
        APP,
        prometheus_url=url,
        extra={"metrics": {"selector": {"namespace": namespace, "model_name": "m"}, "auth": auth}},
    )
    body["metadata"] = {"name": name}
    return body


def condition(cluster: Cluster, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    found = get(cluster, "csp", name, "-n", namespace) or {}
    for entry in found.get("status", {}).get("conditions", []):
        if entry["type"] == kind:
            return dict(entry)
    return None


NOT_ALLOWED = ("MetricsURLNotAllowed",)


def refused_by_operator(
    cluster: Cluster, namespace: str, name: str, reasons: tuple[str, ...] = NOT_ALLOWED
) -> dict[str, Any]:
    """Wait for the policy's ``Ready=False`` with one of ``reasons``; its condition."""

    def refused() -> dict[str, Any] | None:
        found = condition(cluster, namespace, name, "Ready")
        return found if found and found["reason"] in reasons else None

    try:
        ready = until(refused, f"{name}: Ready=False {' or '.join(reasons)}", 90)
    except AssertionError as error:
        status = (get(cluster, "csp", name, "-n", namespace) or {}).get("status")
        raise AssertionError(f"{error}; its status: {json.dumps(status)}") from None
    assert ready["status"] == "False"
    return ready


def test_a_backslash_url_naming_the_allowed_host_reaches_nothing(
    cluster: Cluster,
    release: Release,
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    a = tenancy.a
    create_stack(cluster, a, "m", 1)
    auth = labelled_token(cluster, release, a)
    with (
        fake_prometheus() as sink,
        tenant_operator(
            cluster, release, tmp_path, tenancy, flags=("--allowed-prometheus-url", ALLOWED)
        ) as operator,
    ):
        hostile = f"{sink.url}\\@prom.monitoring:9090"
        created = tenancy.apply_as_tenant(a, hostile_policy("bypass", hostile, a, auth))
        if created.returncode != 0:  # the CRD's pattern refused it at admission
            assert "prometheusUrl" in created.stderr, created.stderr
            assert get(cluster, "csp", "bypass", "-n", a) is None  # nothing to evaluate
        else:  # the operator refuses it: its own spec pattern, or the egress check
            ready = refused_by_operator(
                cluster, a, "bypass", ("MetricsURLNotAllowed", "InvalidSpec")
            )
            if ready["reason"] == "MetricsURLNotAllowed":
                assert "backslash" in ready["message"], ready
                assert "prom.monitoring" not in ready["message"]
            evaluated_again(operator, a, "bypass")
        log = operator.output()
    assert sink.queries == [], "the operator connected to the sink"
    assert sink.headers == [], "the operator sent the sink a request"
    assert TOKEN not in log


def test_without_an_allowed_url_the_status_tells_no_open_port_from_a_closed_one(
    cluster: Cluster,
    release: Release,
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    a = tenancy.a
    create_stack(cluster, a, "m", 1)
    auth = labelled_token(cluster, release, a)
    closed = closed_port_url()
    said = {}
    with (
        fake_prometheus() as sink,
        tenant_operator(cluster, release, tmp_path, tenancy) as operator,
    ):
        # One after the other: two policies on one HPA would be TargetClaimed, not probed.
        for name, url in (("open", sink.url), ("closed", closed)):
            created = tenancy.apply_as_tenant(a, hostile_policy(name, url, a, auth))
            assert created.returncode == 0, created.stderr
            said[name] = refused_by_operator(cluster, a, name)["message"]
            evaluated_again(operator, a, name)
            deleted = tenancy.as_tenant("delete", "csp", name, "-n", a, "--timeout=60s")
            assert deleted.returncode == 0, deleted.stderr
    assert said["open"].replace(sink.url, "URL") == said["closed"].replace(closed, "URL"), said
    assert "allows no policy-chosen Prometheus URL" in said["open"]
    assert "allowedPrometheusUrls" in said["open"]
    assert sink.queries == [], "the operator connected to the sink"
    assert sink.headers == [], "the operator sent the sink a request"
    assert TOKEN not in json.dumps(said)
