"""A KEDA ScaledObject target on a real API server: a collapse holds ``maxReplicaCount``
with a Warning Event, KEDA's generated HPA is never written, and deleting the policy (the
real operator's kopf delete handler) puts the ScaledObject's original values back. With
``advanced.scalingModifiers`` set, the same hold leaves every trigger threshold alone and
the status says the threshold is not what scales.

KEDA's controller cannot run here; its ScaledObject CRD is the real schema
(e2e/keda_crd.yaml, from a maintained package: e2e/third_party_crds.py, checked against
that package here), and the HPA KEDA would generate is created by the test, owned by the
ScaledObject, as KEDA makes it. The Deployment and its pods are real (the
controllers and the node stand-in). CI time is short, so the collapse is driven
in-process: the operator's own evaluation (``controller.evaluation.evaluate``, the code the
kopf daemon runs) on the real API server, with a clock stepped 10 s per round and the
engines' numbers from the scripted Prometheus of the kmock tests (tests/controller/
engine_fake.py); the incident with the emulator and a real Prometheus is
e2e/test_operator_incident.py's. The delete goes through the real ``cachescale run``.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cachescale.api.policy import MANAGED_BY, ORIGINAL_ENVELOPE
from cachescale.api.reasons import ConditionReason, Diagnosis, Hold
from cachescale.controller.kube.client import KubeApi, load_config
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import evaluate
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release, upgraded
from e2e.kube_helpers import apply, events_for, get, until
from e2e.serving import create_serving_deployment
from e2e.third_party_crds import BUNDLES
from tests.controller.cluster import Clock
from tests.controller.cluster import hpa as hpa_body
from tests.controller.cluster import policy as policy_body
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, run_operator
from tests.gather.gather_fakes import FakePrometheus, fake_prometheus
from tests.tools import require_tool

E2E = Path(__file__).resolve().parent
CRDS = E2E.parent / "crds" / "cachescalingpolicies.cachescale.dev.yaml"
APP = "vllm"
PODS = 3
MODEL = "llama"
QUERY = f'sum(vllm:num_requests_waiting{{model_name="{MODEL}"}})'
ROUNDS = 60
"""At most this many evaluations (10 s apart on the test clock) for each phase."""
MODIFIERS = {"formula": "queue", "target": "5", "metricType": "AverageValue"}
"""A scalingModifiers formula over the queue trigger (named ``queue``): KEDA's HPA scales
on it, not on the trigger's threshold."""


def install_crd(cluster: Cluster, path: Path, name: str) -> None:
    """Create a CRD unless it exists (the suite's release may own the policy CRD), and wait
    until it is served."""
    created = cluster.kubectl("create", "-f", str(path))
    assert created.returncode == 0 or "AlreadyExists" in created.stderr, created.stderr
    ready = cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    assert ready.returncode == 0, ready.stderr


def scaled_object(modifiers: bool) -> dict[str, Any]:
    """production-stack's ScaledObject (waiting queue, threshold 5), ignoreNullValues left
    at KEDA's default: the trap cachescale must warn about; with ``modifiers``, its trigger
    named and a scalingModifiers formula over it."""
    body: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": APP},
        "spec": {
            "scaleTargetRef": {"name": APP},
            "minReplicaCount": 2,
            "maxReplicaCount": 40,
            "pollingInterval": 15,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": "http://prometheus.monitoring:9090",
                        "query": QUERY,
                        "threshold": "5",
                    },
                }
            ],
        },
    }
    if modifiers:
        body["spec"]["triggers"][0]["name"] = "queue"
        body["spec"]["advanced"] = {"scalingModifiers": dict(MODIFIERS)}
    return body


def generated_hpa(owner: dict[str, Any]) -> dict[str, Any]:
    """The HPA KEDA would generate: owned by the ScaledObject, min = the running replicas so
    the real HPA controller (no metrics API here) never resizes the Deployment."""
    body = hpa_body(f"keda-hpa-{APP}", target=APP, min_replicas=PODS, max_replicas=40)
    body["metadata"] = {
        "name": f"keda-hpa-{APP}",
        "ownerReferences": [
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "name": APP,
                "uid": owner["metadata"]["uid"],
            }
        ],
    }
    return body


@pytest.fixture
def prometheus() -> Iterator[tuple[FakePrometheus, EngineFake]]:
    engines = EngineFake()
    with fake_prometheus() as fake:
        fake.respond = engines
        yield fake, engines


def can_i(cluster: Cluster, kubeconfig: Path, verb: str, resource: str, namespace: str) -> str:
    """``kubectl auth can-i`` as whoever ``kubeconfig`` authenticates."""
    asked = cluster.kubectl(
        "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, resource, "-n", namespace
    )
    return asked.stdout.strip()


@pytest.mark.parametrize("modifiers", [False, True], ids=["triggers", "scaling-modifiers"])
def test_a_collapse_holds_the_scaled_object_and_delete_restores_it(
    modifiers: bool,
    cluster: Cluster,
    release: Release,
    namespace: str,
    prometheus: tuple[FakePrometheus, EngineFake],
    tmp_path: Path,
    keda_crds: Path,
) -> None:
    """All of it as the chart's ServiceAccount, with the RBAC of ``keda.enabled=true``."""
    started = time.monotonic()
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    assert can_i(cluster, kubeconfig, "patch", "scaledobjects.keda.sh", namespace) == "no"
    enforce = f"rbac.enforceNamespaces={{{namespace}}}"  # Enforce is granted per namespace
    with upgraded(cluster, release, "keda.enabled=true", enforce):
        assert can_i(cluster, kubeconfig, "patch", "scaledobjects.keda.sh", namespace) == "yes"
        for verb in ("create", "delete", "update"):  # patch only, as for HPAs
            assert can_i(cluster, kubeconfig, verb, "scaledobjects.keda.sh", namespace) == "no"
        hold_and_restore(cluster, namespace, prometheus, kubeconfig, tmp_path, modifiers)
    print(f"test_keda: {time.monotonic() - started:.1f} s")


def hold_and_restore(
    cluster: Cluster,
    namespace: str,
    prometheus: tuple[FakePrometheus, EngineFake],
    kubeconfig: Path,
    tmp_path: Path,
    modifiers: bool,
) -> None:
    """The collapse held on the ScaledObject, then the restore on delete, with the
    operator's credentials from ``kubeconfig``."""
    fake, engines = prometheus
    install_crd(cluster, CRDS, "cachescalingpolicies.cachescale.dev")
    pods = create_serving_deployment(cluster, namespace, MODEL, PODS)
    apply(cluster, namespace, scaled_object(modifiers))
    owner = get(cluster, "scaledobject", APP, "-n", namespace)
    apply(cluster, namespace, generated_hpa(owner))
    original = get(cluster, "scaledobject", APP, "-n", namespace)["spec"]
    assert original == scaled_object(modifiers)["spec"], "stored as written, nothing pruned"
    hpa_before = get(cluster, "hpa", f"keda-hpa-{APP}", "-n", namespace)

    numbers = EngineNumbers(pods=tuple(pods))
    engines.set({"namespace": namespace, "model_name": MODEL}, numbers)
    body = policy_body(APP, prometheus_url=fake.url)
    body["metadata"] = {"name": APP, "namespace": namespace}
    body["spec"]["target"] = {"deploymentName": APP, "scaledObjectName": APP}
    body["spec"]["metrics"]["selector"] = {"namespace": namespace, "model_name": MODEL}
    apply(cluster, namespace, body)

    # The test clock ends near the real now, so the real operator started below reads a
    # memory from its past, as after a restart.
    clock = Clock(datetime.now(UTC) - timedelta(seconds=10 * 2 * ROUNDS))
    operator = Operator(KubeApi(load_config(str(kubeconfig))), clock=clock)

    def evaluate_until(condition: tuple[str, str, str]) -> None:
        for _ in range(ROUNDS):
            policy = PolicyObject.of(get(cluster, "csp", APP, "-n", namespace))
            outcome = evaluate(operator, policy)
            clock.advance(10)
            found = outcome.decision and {
                (c.type.value, c.status.value, str(c.reason)) for c in outcome.decision.conditions
            }
            if found and condition in found:
                return
        raise AssertionError(f"no {condition} in {ROUNDS} evaluations: {outcome}")

    evaluate_until(("CacheHealthy", "True", ConditionReason.HIT_RATE_AT_BASELINE))
    numbers.hit_rate, numbers.waiting = 0.04, 9.0
    evaluate_until(("CacheHealthy", "False", Diagnosis.PREFIX_COLLAPSE))

    held = get(cluster, "scaledobject", APP, "-n", namespace)
    assert held["spec"]["maxReplicaCount"] == PODS, held["spec"]  # held at the pre-collapse 3
    record = json.loads(held["metadata"]["annotations"][ORIGINAL_ENVELOPE])
    assert record["maxReplicaCount"] == 40
    status = get(cluster, "csp", APP, "-n", namespace)["status"]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["ScalingHeld"] == ("True", Hold.COLLAPSE)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "ignoreNullValues is unset (KEDA's default: true)" in ready["message"]
    threshold = "no trigger threshold is what scales"
    if modifiers:  # the formula scales: only the counts are managed, and the status says so
        assert "threshold" not in record, record
        assert held["spec"]["triggers"] == original["triggers"]
        assert held["spec"]["advanced"] == original["advanced"]
        assert threshold in ready["message"], ready["message"]
    else:
        assert record["threshold"] == "5"
        assert threshold not in ready["message"], ready["message"]
    warnings = {
        e["reason"]
        for e in events_for(cluster, namespace, "CacheScalingPolicy", APP)
        if e["type"] == "Warning"
    }
    assert {Diagnosis.PREFIX_COLLAPSE, ConditionReason.KEDA_IGNORES_NULL_VALUES} <= warnings

    # Delete through the real operator: kopf's finalizer, then the restore on delete.
    with run_operator(tmp_path, kubeconfig, namespace, LOOPBACK_PROMETHEUS):

        def finalized() -> bool | None:
            found = get(cluster, "csp", APP, "-n", namespace)
            return True if found["metadata"].get("finalizers") else None

        until(finalized, "kopf's finalizer on the policy", 20)
        deleted = cluster.kubectl("delete", "csp", APP, "-n", namespace, "--timeout=20s")
        assert deleted.returncode == 0, deleted.stderr
    restored = get(cluster, "scaledobject", APP, "-n", namespace)
    assert restored["spec"] == original, (restored["spec"], original)
    annotations = restored["metadata"].get("annotations") or {}
    assert ORIGINAL_ENVELOPE not in annotations
    assert MANAGED_BY not in annotations

    # KEDA's HPA: read, never written (the API server's audit log, where there is one).
    hpa_after = get(cluster, "hpa", f"keda-hpa-{APP}", "-n", namespace)
    assert hpa_after["spec"] == hpa_before["spec"]
    assert hpa_after["metadata"].get("annotations") == hpa_before["metadata"].get("annotations")
    if cluster.plane is not None:
        whoami = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json")
        user = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
        assert user.startswith("system:serviceaccount:"), user
        assert cluster.plane.writes(user, "horizontalpodautoscalers", namespace) == []
        assert cluster.plane.writes(user, "scaledobjects", namespace), "the hold was its patch"


@pytest.mark.parametrize("name", ["two-autoscalers.yaml", "no-autoscaler.yaml"])
def test_the_api_server_refuses_both_or_neither_autoscaler(
    cluster: Cluster, namespace: str, name: str
) -> None:
    install_crd(cluster, CRDS, "cachescalingpolicies.cachescale.dev")
    path = E2E.parent / "examples" / "invalid" / name
    refused = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert refused.returncode != 0, f"the API server accepted {name}"
    assert "spec.target" in refused.stderr, refused.stderr
    assert "set exactly one of hpaName" in refused.stderr, refused.stderr


def test_the_crd_files_are_what_the_maintained_packages_give() -> None:
    """e2e/keda_crd.yaml and e2e/prometheus_operator_crds.yaml are regenerated from the
    installed packages (the dev extra); a new package version or a hand edit shows here."""
    for bundle in BUNDLES:
        found = importlib.util.find_spec("cloudcoil.models") is not None
        require_tool(found, f"{bundle.package} is not installed (pip install -e '.[dev]')")
        assert bundle.path.read_text(encoding="utf-8") == bundle.text(), (
            f"{bundle.path.name} differs from {bundle.package}: run python -m e2e.third_party_crds"
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [("minReplicaCount", "two"), ("fallback", {"replicas": 4}), ("triggers", None)],
    ids=["count-not-an-integer", "fallback-without-failureThreshold", "no-triggers"],
)
def test_kedas_schema_refuses_what_keda_refuses(
    cluster: Cluster, namespace: str, keda_crds: Path, field: str, value: Any
) -> None:
    """The installed CRD is KEDA's: its types and required fields bite."""
    body = scaled_object(modifiers=False)
    if value is None:
        del body["spec"][field]
    else:
        body["spec"][field] = value
    refused = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(body)
    )
    assert refused.returncode != 0, f"the API server accepted spec.{field}={value!r}"
    assert f"spec.{field}" in refused.stderr, refused.stderr
