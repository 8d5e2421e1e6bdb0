"""A hostile tenant's oversized policy on a real API server (issue 53, finding 7): refused at
admission, and whatever is admitted is deleted within seconds.

Before the CRD bounded its fields, a 960 KB policy (16 selector values of 60 KB) was
stored; its status writes failed with ``ResourceExhausted``, and on delete kopf's
last-handled-configuration annotation passed the API server's 256 KiB limit, so the PATCH
that removes the finalizer failed every time and the policy stayed Terminating. kopf now
keeps no diff base (``controller/runtime/kopf_storage.py``).

Alice (a policy author in tenant-a only, impersonated) writes the policies; the operator
runs as the chart's ServiceAccount with the chart's flags:

- the 960 KB policy, a 60 KB demandQuery and 17 prompt sources are refused by the API
  server with a message naming the field, and by ``cachescale validate``;
- the largest policy the CRD admits (``tests/api/test_size_limits.maximal_spec``) gets its
  finalizer and a status, no diff base (nor kopf's ``kopf-managed`` marker), and is gone
  within ``GONE_WITHIN_S`` of its deletion;
- a small policy whose author filled its annotations (150 KB: the API server allows
  256 KiB), so that kopf's own diff base, which holds them, is refused beside them: it
  too gets no diff base and is gone within ``GONE_WITHIN_S`` (with kopf's own storage its
  finalizer stayed, as with the 960 KB policy).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, cast

import kopf
import yaml

from cachescale.api.policy import ANNOTATION_PREFIX
from cachescale.api.validation import check_text
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import get, until
from e2e.tenancy import Tenancy, tenancy, tenant_operator  # noqa: F401 (a fixture)
from tests.api.test_size_limits import go_json_bytes, maximal_spec
from tests.controller.cluster import policy as policy_body

GONE_WITHIN_S = 30.0
"""From ``kubectl delete`` to the policy being gone (the restore has nothing to do): a
policy kopf cannot patch keeps its finalizer for minutes, a healthy one goes in seconds."""
HELD_WITHIN_S = 300.0
"""From creation to the finalizer and a status: the largest spec's interval (4m, the status
comes with the first evaluation at its group's slot) and a minute to write it."""
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
DIFF_BASE = f"{ANNOTATION_PREFIX}/last-handled-configuration"
MARKER = f"{ANNOTATION_PREFIX}/kopf-managed"


def named(name: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": name, **metadata},
        "spec": spec,
    }


def small_spec() -> dict[str, Any]:
    return dict(policy_body("small", prometheus_url="http://prom.monitoring:9090")["spec"])


def test_oversized_policies_are_refused_naming_the_field(
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    release: Release,  # the chart's CRD
) -> None:
    world = tenancy
    base = small_spec()
    huge_selector = copy.deepcopy(base)
    huge_selector["metrics"]["selector"] = {f"l{i}": "v" * 60_000 for i in range(16)}
    huge_query = copy.deepcopy(base)
    huge_query["metrics"]["demandQuery"] = "sum(x)" + " " * 60_000
    many_sources = copy.deepcopy(base)
    source = {"namespace": world.a, "kind": "Deployment", "labelSelector": "app=rag"}
    many_sources["cache"] = {"promptSources": [dict(source) for _ in range(17)]}
    cases = {
        "spec.metrics.selector": huge_selector,
        "spec.metrics.demandQuery": huge_query,
        "spec.cache.promptSources": many_sources,
    }
    for field, spec in cases.items():
        body = named("oversized", spec)
        print(f"\n  {field}: {len(json.dumps(body)):,} bytes")
        refused = world.apply_as_tenant(world.a, body)
        assert refused.returncode != 0, f"{field}: stored by the API server"
        assert field in refused.stderr, refused.stderr[:600]
        assert "Too long" in refused.stderr or "Too many" in refused.stderr, refused.stderr[:600]
        print(f"  server: {refused.stderr.strip()[:240]}")
        problems = check_text(yaml.safe_dump(named("oversized", spec, namespace=world.a))).problems
        assert any(p.path.startswith(field) for p in problems), problems
    assert get(world.cluster, "csp", "-n", world.a)["items"] == []


def kopf_stock_patch(cluster: Cluster, namespace: str, name: str, workdir: Path) -> str:
    """What the API server says to the PATCH kopf's own annotation storage would send once
    the delete handler is done (its diff base, the finalizer removed): what
    ``controller/runtime/kopf_storage.py`` never sends."""
    found = get(cluster, "csp", name, "-n", namespace)
    body = kopf.Body(cast(kopf.RawBody, found))
    stock = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    patch = kopf.Patch()
    stock.store(body=body, patch=patch, essence=stock.build(body=body))
    payload = {"metadata": {**dict(patch["metadata"]), "finalizers": []}}
    patch_file = workdir / "kopf-stock-patch.json"
    patch_file.write_text(json.dumps(payload), encoding="utf-8")
    sent = cluster.kubectl(
        "patch", "csp", name, "-n", namespace, "--type=merge", "--patch-file", str(patch_file)
    )
    assert sent.returncode != 0, "the API server took kopf's diff base"
    return sent.stderr


def deleted_within(cluster: Cluster, namespace: str, name: str) -> float:
    """Delete the policy once the operator holds it (finalizer on, status written) with no
    diff base written; seconds until it is gone."""

    def held() -> dict[str, Any] | None:
        found = get(cluster, "csp", name, "-n", namespace)
        finalizers = (found or {}).get("metadata", {}).get("finalizers", [])
        return found if FINALIZER in finalizers and found.get("status") else None

    # The status comes with the first evaluation, which may wait for its group's slot: up to
    # the policy's interval (the largest spec has the longest one the CRD admits).
    found = until(held, f"{name}: the operator's finalizer and a status", HELD_WITHIN_S)
    print(f"\n  {name}: {len(json.dumps(found)):,} bytes stored, annotations:", end=" ")
    annotations = found["metadata"].get("annotations", {})
    print(sorted(annotations))
    assert {DIFF_BASE, MARKER}.isdisjoint(annotations), sorted(annotations)
    deleted = cluster.kubectl("delete", "csp", name, "-n", namespace, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    start = time.monotonic()
    until(
        lambda: True if get(cluster, "csp", name, "-n", namespace) is None else None,
        f"{name} gone after its deletion",
        GONE_WITHIN_S,
    )
    took = time.monotonic() - start
    print(f"  {name}: gone {took:.1f}s after the delete")
    return took


def test_the_largest_admissible_policy_and_a_full_annotation_budget_are_deleted(
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    release: Release,
    tmp_path: Path,
) -> None:
    world = tenancy
    cluster = world.cluster
    largest = maximal_spec()
    for source in largest["cache"]["promptSources"]:
        source["namespace"] = world.a
    print(f"\nlargest admissible spec: {go_json_bytes(largest):,} bytes as stored")
    noted = {"note": "n" * 150_000}
    with tenant_operator(cluster, release, tmp_path, world) as operator:
        for name, body in (
            ("largest", named("largest", largest)),
            ("annotated", named("annotated", small_spec(), annotations=noted)),
        ):
            created = world.apply_as_tenant(world.a, body)
            assert created.returncode == 0, created.stderr[:600]
            if name == "annotated":
                refused = kopf_stock_patch(cluster, world.a, name, tmp_path)
                assert "metadata.annotations: Too long" in refused, refused[:600]
                print(f"\n  annotated, kopf's own diff base: {refused.strip()[:200]}")
            assert deleted_within(cluster, world.a, name) < GONE_WITHIN_S
        log = operator.output()
        assert "Traceback" not in log, operator.tail(80)
        assert "ResourceExhausted" not in log, operator.tail(80)
