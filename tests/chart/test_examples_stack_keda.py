"""examples/stack-keda/: production-stack's KEDA ScaledObject and a policy naming it, valid
for KEDA's schema (its real CRD, as the e2e test installs it), for cachescale and for the CRD,
and read by the operator as intended: the queue trigger's threshold as the HPA target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cachescale.commands.main import main
from cachescale.controller.target.keda import notes, scaled_object_view
from tests.chart.chart_helpers import REPO, STACK, one, validation_errors

STACK_KEDA = REPO / "examples" / "stack-keda"
KEDA_CRD = REPO / "e2e" / "keda_crd.yaml"


def load(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return found


def scaled_object() -> dict[str, Any]:
    return load(STACK_KEDA / "30-scaledobject.yaml")


def policy() -> dict[str, Any]:
    return load(STACK_KEDA / "50-cachescalingpolicy.yaml")


@pytest.mark.parametrize("name", sorted(p.name for p in STACK_KEDA.glob("*.yaml")))
def test_every_file_is_commented(name: str) -> None:
    assert (STACK_KEDA / name).read_text(encoding="utf-8").startswith("#"), name


def test_the_scaled_object_fits_kedas_schema() -> None:
    crd = load(KEDA_CRD)
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    body = scaled_object()
    assert (body["apiVersion"], body["kind"]) == (
        f"{crd['spec']['group']}/{version['name']}",
        crd["spec"]["names"]["kind"],
    )
    errors = [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(body)]
    assert errors == []


def test_the_policy_is_valid_for_cachescale_and_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(STACK_KEDA / "50-cachescalingpolicy.yaml")]) == 0
    assert "valid" in capsys.readouterr().out
    assert validation_errors(policy()) == []


def test_the_policy_names_the_scaled_object_of_the_stacks_deployment() -> None:
    deployment = one(
        [d for p in STACK.glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d],
        "Deployment",
    )
    target, body = policy()["spec"]["target"], scaled_object()
    assert "hpaName" not in target
    assert target["scaledObjectName"] == body["metadata"]["name"]
    assert target["deploymentName"] == deployment["metadata"]["name"]
    assert body["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert body["metadata"]["namespace"] == policy()["metadata"]["namespace"]
    budget = policy()["spec"]["budget"]
    assert (body["spec"]["minReplicaCount"], body["spec"]["maxReplicaCount"]) == (
        budget["minReplicas"],
        budget["maxReplicas"],
    )


def test_the_operator_reads_the_queue_trigger_as_production_stack_means_it() -> None:
    view = scaled_object_view(scaled_object(), policy()["spec"]["target"]["deploymentName"])
    state = view.hpa_state()
    assert state.metric_name == "vllm:num_requests_waiting"
    assert state.target_average_value == 5.0
    assert (state.min_replicas, state.max_replicas) == (2, 20)
    assert view.warnings() == ()  # ignoreNullValues: "false"
    assert any("falls back to 4 replicas after 3 failed reads" in n for n in notes(view))
