"""The generated CRD: committed copy in sync, structural, valid for Kubernetes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from cachescale.api.crd import build_crd, render_crd_yaml
from cachescale.api.spec import CacheScalingPolicySpec

REPO = Path(__file__).resolve().parents[2]
COMMITTED_CRD = REPO / "crds" / "cachescalingpolicies.cachescale.dev.yaml"


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.get("properties", {}).items():
            yield from walk(value, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from walk(node[key], f"{path}[{key}]")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_generator() -> None:
    assert COMMITTED_CRD.read_text(encoding="utf-8") == render_crd_yaml(), (
        "crds/ is stale: run `make generate`"
    )


def test_crd_is_valid_kubernetes_object() -> None:
    document = yaml.safe_load(COMMITTED_CRD.read_text(encoding="utf-8"))
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    text = yaml.safe_dump(schema)
    for forbidden in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title:"):
        assert forbidden not in text
    for path, node in walk(schema):
        assert "type" in node, f"{path or '<root>'} has no type"
        if node["type"] == "object" and path.startswith(".spec"):
            assert node.get("additionalProperties") is not False, path


def test_every_spec_and_status_field_is_described(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        if path.startswith((".spec", ".status")) and "[" not in path.rsplit(".", 1)[-1]:
            assert node.get("description"), f"{path} has no description"


def test_identity_subresource_and_columns() -> None:
    crd = build_crd()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "cachescalingpolicies.cachescale.dev"
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "CacheScalingPolicy",
        "cachescalingpolicies",
        ["csp"],
    )
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Mode",
        "Ready",
        "Hit-Rate",
        "TTFT-P95",
        "GPU-s/1k",
        "Replicas",
        "State",
        "Age",
    ]


def test_printer_columns_point_at_real_fields(schema: dict[str, Any]) -> None:
    """Each column names a field of the schema (a filter, ``[?(@.type=="Ready")]``, picks
    items of a list), and a column's type is its field's: ``kubectl get`` prints a number
    field in full, so the figures are strings or integers."""
    nodes = dict(walk(schema))
    for column in build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]:
        if column["jsonPath"].startswith((".spec", ".status")):
            path = re.sub(r"\[\?\(.*?\)\]", "[items]", column["jsonPath"])
            assert path in nodes, column
            assert nodes[path]["type"] == column["type"], column
            assert column["type"] != "number", column


def test_the_ready_column_reads_the_ready_condition(schema: dict[str, Any]) -> None:
    (ready,) = [
        c
        for c in build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
        if c["name"] == "Ready"
    ]
    assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    condition = schema["properties"]["status"]["properties"]["conditions"]["items"]
    assert "Ready" in condition["properties"]["type"]["enum"]


def test_units_in_field_names(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert "ttftP95Seconds" in spec["slo"]["properties"]
    assert "gpuSecondsPer1kRequests" in spec["budget"]["properties"]
    assert "memoryGiB" in spec["batching"]["properties"]["gpu"]["properties"]


def test_exclusive_bounds_use_openapi_v3_form(schema: dict[str, Any]) -> None:
    budget = schema["properties"]["spec"]["properties"]["budget"]["properties"]
    assert budget["gpuSecondsPer1kRequests"]["minimum"] == 0
    assert budget["gpuSecondsPer1kRequests"]["exclusiveMinimum"] is True


def test_the_only_stored_default_is_the_mode(schema: dict[str, Any]) -> None:
    """The API server stores a schema default in the object, so ``kubectl describe``
    would show every field a policy left out: only ``mode`` has one (it decides whether
    anything is changed, and ``kubectl get`` prints it), the model's own."""
    defaults = {path: node["default"] for path, node in walk(schema) if "default" in node}
    assert defaults == {".spec.mode": CacheScalingPolicySpec.model_fields["mode"].default}


def test_every_rule_holds_on_an_object_that_leaves_out_what_it_may(
    schema: dict[str, Any],
) -> None:
    """A rule reads a field the policy may leave out through its default
    (``cel_or_default``): on each object with rules and only its required fields, every
    rule holds, as pydantic accepts it. Reading such a field bare fails there ("no such
    key")."""
    minimal = {
        ".spec.metrics": {},
        ".spec.budget": {"gpuSecondsPer1kRequests": 1.0, "maxReplicas": 1},
        ".spec.batching": {},
        ".spec.slo": {"ttftP95Seconds": 1.0},
        ".spec.target": {"deploymentName": "d", "hpaName": "h"},
    }
    checked = []
    for path, node in walk(schema):
        if not node.get("x-kubernetes-validations"):
            continue
        assert path in minimal, f"{path}: add its minimal object here"
        for rule in node["x-kubernetes-validations"]:
            env = celpy.Environment()
            program = env.program(env.compile(rule["rule"]))
            value = program.evaluate({"self": celpy.json_to_cel(minimal[path])})
            assert value == celpy.celtypes.BoolType(True), (path, rule["rule"], value)
            checked.append(rule["rule"])
    assert len(checked) >= 10, checked
