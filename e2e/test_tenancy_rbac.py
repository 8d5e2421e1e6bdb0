"""Finding 9 of issue 53 on a real API server: least privilege by default, and a tenant's
policy that reaches into another tenant's namespace gets nothing from it.

The chart's ServiceAccount is the session release's (default values); every "may it?" is
the API server's own answer to a SelfSubjectAccessReview (``kubectl auth can-i``), and the
tenant is an impersonated user with namespace-scoped rights only (e2e/tenancy.py).
Before this change the default ClusterRole answered "yes" to patching every Deployment
and HPA and listing every ConfigMap, kube-system's included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, events_for, get, until
from e2e.operators import evaluated_again
from e2e.tenancy import (
    Tenancy,
    account_can_i,
    grant_enforce,
    operator_kubeconfig,
    tenancy,  # noqa: F401 (a fixture)
    tenant_operator,
)
from tests.controller.cluster import hpa as hpa_body
from tests.controller.cluster import policy as policy_body
from tests.gather.gather_fakes import fake_prometheus

KUBE_SYSTEM = "kube-system"
TARGETS = ("deployments", "horizontalpodautoscalers")
VICTIM = "payments"
SECRET_ARG = "--db-url=postgres://admin:tenant-b-s3cret@db.payments:5432/ledger"
PRIVATE_IMAGE = "registry.tenant-b.example/payments:7.7.7-private"


def test_the_charts_account_patches_nothing_and_reads_no_configmap_or_secret_by_default(
    cluster: Cluster,
    release: Release,
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    kubeconfig = operator_kubeconfig(cluster, release, tmp_path)

    def can(verb: str, resource: str, namespace: str) -> bool:
        return account_can_i(cluster, kubeconfig, verb, resource, namespace)

    # Still allowed (the account is real and reads what every policy needs): targets are
    # seen wherever a policy may name them, and its own rollouts are listed.
    for verb, resource in [("get", "deployments"), ("watch", "horizontalpodautoscalers")]:
        assert can(verb, resource, KUBE_SYSTEM), (verb, resource)
    assert can("list", "replicasets", tenancy.a)
    # Refused by default: no patch anywhere, no ConfigMap or Secret anywhere.
    for namespace in (KUBE_SYSTEM, tenancy.a, tenancy.b):
        for resource in TARGETS:
            assert not can("patch", resource, namespace), (resource, namespace)
        for resource in ("configmaps", "secrets"):
            for verb in ("get", "list", "watch"):
                assert not can(verb, resource, namespace), (verb, resource, namespace)
    for verb in ("update", "delete", "create"):
        assert not can(verb, "deployments", KUBE_SYSTEM), verb

    # The cluster owner allows Enforce in tenant-a (the chart's Role for
    # rbac.enforceNamespaces=[tenant-a]): patch there, and still nowhere else.
    grant_enforce(cluster, release, tenancy.a)
    for resource in TARGETS:

        def granted(resource: str = resource) -> bool | None:
            return can("patch", resource, tenancy.a) or None  # the authorizer's cache

        assert until(granted, f"patch {resource} in {tenancy.a} once granted", 10)
        assert not can("patch", resource, tenancy.b), resource
        assert not can("patch", resource, KUBE_SYSTEM), resource


def test_a_tenant_writes_policies_in_her_namespace_and_reads_nothing_else(
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
) -> None:
    a, b = tenancy.a, tenancy.b
    for verb in ("create", "get", "list", "delete"):
        assert tenancy.tenant_can_i(verb, "cachescalingpolicies", a), verb
        assert not tenancy.tenant_can_i(verb, "cachescalingpolicies", b), verb
    for resource in ("deployments", "horizontalpodautoscalers", "replicasets", "secrets"):
        for namespace in (a, b):
            assert not tenancy.tenant_can_i("list", resource, namespace), (resource, namespace)
    denied = tenancy.as_tenant("get", "deployments", "-n", b)
    assert denied.returncode != 0, denied.stdout
    assert "Forbidden" in denied.stderr, denied.stderr
    body = policy_body("mine", prometheus_url="http://127.0.0.1:9")
    body["metadata"] = {"name": "mine"}
    created = tenancy.apply_as_tenant(a, body)
    assert created.returncode == 0, created.stderr
    refused = tenancy.apply_as_tenant(b, body)
    assert refused.returncode != 0, refused.stdout
    assert "Forbidden" in refused.stderr, refused.stderr


def victim(namespace: str) -> list[dict[str, Any]]:
    """tenant-b's Deployment (a credential in its args, a private image; no pod needed)
    and the HPA that scales it."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": VICTIM, "namespace": namespace, "labels": {"app": VICTIM}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": VICTIM}},
            "template": {
                "metadata": {"labels": {"app": VICTIM}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": PRIVATE_IMAGE,
                            "args": ["--max-num-seqs", "48", SECRET_ARG],
                        }
                    ]
                },
            },
        },
    }
    autoscaler = hpa_body(VICTIM, min_replicas=3, max_replicas=17, average_value="24")
    autoscaler["metadata"] = {"name": VICTIM, "namespace": namespace}
    autoscaler.pop("status", None)
    return [deployment, autoscaler]


def written(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What a patch by the operator would change: generation, annotations, spec (status
    and resourceVersion move with the cluster's own controllers)."""
    meta = obj["metadata"]
    return meta.get("generation"), meta.get("annotations"), obj["spec"]


def test_a_policy_naming_another_tenants_target_gets_nothing_from_it(
    cluster: Cluster,
    release: Release,
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Alice's Enforce policy in tenant-a names tenant-b's Deployment and HPA; tenant-b's
    owner allowed Enforce there. The operator (which may read tenant-b: checked) resolves
    a target in the policy's own namespace only, so her status, Events and the operator's
    log hold nothing of tenant-b, and tenant-b's objects are unchanged."""
    a, b = tenancy.a, tenancy.b
    for obj in victim(b):
        apply(cluster, b, obj)
    grant_enforce(cluster, release, b)
    kubeconfig = operator_kubeconfig(cluster, release, tmp_path / "probe")
    assert account_can_i(cluster, kubeconfig, "get", "deployments", b), "it could read b"
    before = {kind: written(get(cluster, kind, VICTIM, "-n", b)) for kind in TARGETS}
    with (
        fake_prometheus() as prometheus,
        tenant_operator(
            cluster, release, tmp_path, tenancy, flags=("--allowed-prometheus-url", prometheus.url)
        ) as operator,
    ):
        body = policy_body(
            "reach",
            prometheus_url=prometheus.url,
            mode="Enforce",
            deployment_name=VICTIM,
            hpa_name=VICTIM,
            extra={"metrics": {"selector": {"namespace": a, "model_name": "m"}}},
        )
        body["metadata"] = {"name": "reach"}
        created = tenancy.apply_as_tenant(a, body)
        assert created.returncode == 0, created.stderr

        def reported() -> dict[str, Any] | None:
            found = get(cluster, "csp", "reach", "-n", a) or {}
            conditions = found.get("status", {}).get("conditions", [])
            return found if any(c.get("reason") == "TargetNotFound" for c in conditions) else None

        policy = until(reported, "her policy's status: TargetNotFound in her namespace", 60)
        evaluated_again(operator, a, "reach")  # still nothing from tenant-b
        policy = get(cluster, "csp", "reach", "-n", a)
        seen_by_her = json.dumps(
            [policy["status"], events_for(cluster, a, "CacheScalingPolicy", "reach")]
        )
        log = operator.output()
    for foreign in (b, SECRET_ARG, "tenant-b-s3cret", PRIVATE_IMAGE):
        assert foreign not in seen_by_her, f"{foreign!r} reached tenant-a: {seen_by_her}"
    for foreign in (SECRET_ARG, "tenant-b-s3cret", PRIVATE_IMAGE):
        assert foreign not in log, f"{foreign!r} in the operator's log"
    after = {kind: written(get(cluster, kind, VICTIM, "-n", b)) for kind in TARGETS}
    assert after == before, "tenant-b's Deployment or HPA was written"
    assert prometheus.queries == [], "no target: nothing to ask Prometheus"
