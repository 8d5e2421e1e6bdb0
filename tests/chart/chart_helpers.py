"""Shared helpers for the chart, alerting, dashboard, image and example-stack tests.

Real tools, no stand-ins: ``helm`` (``scripts/install-helm.sh`` puts it in ``.tools/bin``)
renders the chart, ``promtool`` (Debian's ``prometheus`` package) checks the rules and the
dashboard's PromQL, ``kubernetes-validate`` checks built-in kinds against the Kubernetes
OpenAPI schemas. A missing tool skips the tests that need it locally, with the command that
installs it, and fails them under ``CI``.

Kinds ``kubernetes-validate`` has no schema for are checked as follows:

* ``kopf.dev`` and ``cachescale.dev`` objects against the CRDs the chart itself ships
  (the API server's own source of truth for them);
* ``monitoring.coreos.com`` objects (ServiceMonitor, PodMonitor, PrometheusRule) against
  :data:`MONITORING_SCHEMAS`: minimal schemas written from the Prometheus Operator's v1
  CRDs. They pin the required fields, the types and duration patterns of every field this
  repository writes, and forbid unknown keys at those levels, so a typo (``honourLabels``,
  ``podMetricEndpoints``) or a wrong type fails; fields this repository never writes are
  not described. Vendoring the upstream CRDs (~1 MB of generated YAML) would add a second
  copy to keep in sync for no extra check on what is actually written here.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml

from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "cachescale"
CRD_SOURCE = REPO / "crds" / "cachescalingpolicies.cachescale.dev.yaml"
CHART_CRD_COPY = CHART / "files" / "crds" / "cachescalingpolicies.cachescale.dev.yaml"
RULES = REPO / "deploy" / "prometheus" / "cachescale-rules.yaml"
CHART_RULES_COPY = CHART / "files" / "prometheus" / "cachescale-rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tests"
DASHBOARD = REPO / "deploy" / "grafana" / "cachescale-dashboard.json"
CHART_DASHBOARD_COPY = CHART / "files" / "grafana" / "cachescale-dashboard.json"
RUNBOOK = REPO / "docs" / "runbook.md"
METRICS_DOC = REPO / "docs" / "metrics.md"
STACK = REPO / "examples" / "stack"

Manifest = dict[str, Any]


def helm_binary() -> str:
    """``.tools/bin/helm``, else ``helm`` on PATH; skip (locally) or fail (CI) without."""
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    require_tool(
        found is not None,
        "helm not found; run scripts/install-helm.sh (installs it into .tools/bin)",
    )
    assert found is not None
    return found


def promtool_binary() -> str:
    """``promtool`` on PATH; skip (locally) or fail (CI) without."""
    found = shutil.which("promtool")
    require_tool(
        found is not None,
        "promtool not found; install Debian's prometheus package (make system-deps)",
    )
    assert found is not None
    return found


def run(command: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; with ``check`` fail with its output."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def helm(*args: str, values: dict[str, Any] | None = None, check: bool = True) -> str:
    """Run helm with ``args`` and ``values`` (as a values file); return stdout."""
    binary = helm_binary()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as handle:
        yaml.safe_dump(values or {}, handle)
        handle.flush()
        result = run([binary, *args, "--values", handle.name], check=check)
    if not check and result.returncode != 0:
        return result.stderr
    return result.stdout


@functools.cache
def _render_cached(values_json: str, release: str, namespace: str) -> str:
    return helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--include-crds",
        values=json.loads(values_json),
    )


def render(
    values: dict[str, Any] | None = None,
    release: str = "cachescale",
    namespace: str = "cachescale",
) -> list[Manifest]:
    """``helm template --include-crds`` of the chart: every rendered object, in order."""
    text = _render_cached(json.dumps(values or {}, sort_keys=True), release, namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_error(values: dict[str, Any]) -> str:
    """The error helm prints for values it must reject (fails when it renders)."""
    binary = helm_binary()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as handle:
        yaml.safe_dump(values, handle)
        handle.flush()
        result = run(
            [binary, "template", "cachescale", str(CHART), "--values", handle.name], check=False
        )
    assert result.returncode != 0, f"helm accepted {values}:\n{result.stdout[:2000]}"
    return result.stderr


def by_kind(manifests: Iterable[Manifest], kind: str) -> list[Manifest]:
    """The manifests of one kind."""
    return [m for m in manifests if m.get("kind") == kind]


def one(manifests: Iterable[Manifest], kind: str) -> Manifest:
    """The single manifest of ``kind`` (fails when there are none or several)."""
    found = by_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def operator_args(values: dict[str, Any]) -> list[str]:
    """The operator container's arguments as the chart renders them with ``values``."""
    deployment = one(render(values), "Deployment")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


# -- validation ---------------------------------------------------------------------------

_DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
_ENDPOINT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "interval": {"type": "string", "pattern": _DURATION},
        "scrapeTimeout": {"type": "string", "pattern": _DURATION},
        "honorLabels": {"type": "boolean"},
    },
    "additionalProperties": False,
}


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


def _monitor(kind: str, endpoints: str) -> dict[str, Any]:
    """A ServiceMonitor or PodMonitor: the same selector fields, its own endpoints list."""
    return _object(
        kind,
        {
            "type": "object",
            "required": ["selector", endpoints],
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                    "additionalProperties": False,
                },
                endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
            "additionalProperties": False,
        },
    )


MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _monitor("ServiceMonitor", "endpoints"),
    "PodMonitor": _monitor("PodMonitor", "podMetricsEndpoints"),
    "PrometheusRule": _object(
        "PrometheusRule",
        {
            "type": "object",
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                    "additionalProperties": False,
                                },
                            },
                        },
                        "additionalProperties": False,
                    },
                }
            },
            "additionalProperties": False,
        },
    ),
}


def crd_schemas(manifests: Iterable[Manifest]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) -> openAPIV3Schema`` of every CRD among ``manifests``."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for crd in by_kind(manifests, "CustomResourceDefinition"):
        group = crd["spec"]["group"]
        for version in crd["spec"]["versions"]:
            key = (f"{group}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def shipped_crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """The CRDs this repository ships: the policy CRD and the chart's kopf peering CRDs."""
    documents = [yaml.safe_load(CRD_SOURCE.read_text(encoding="utf-8"))]
    for path in sorted((CHART / "crds").glob("*.yaml")):
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")))
    return crd_schemas(doc for doc in documents if doc)


def validation_errors(manifest: Manifest) -> list[str]:
    """Why ``manifest`` would be rejected (empty when valid), by the rules in the module
    docstring: kubernetes-validate (strict), the shipped CRDs, or the monitoring schemas."""
    api_version, kind = manifest.get("apiVersion", ""), manifest.get("kind", "")
    if kind in MONITORING_SCHEMAS and api_version == "monitoring.coreos.com/v1":
        validator = jsonschema.Draft7Validator(MONITORING_SCHEMAS[kind])
        return [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(manifest)
        ]
    schema = shipped_crd_schemas().get((api_version, kind))
    if schema is not None:
        # OpenAPI v3.0 schemas: draft 4 semantics (boolean exclusiveMinimum and the like).
        validator = jsonschema.Draft4Validator(schema)
        errors = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(manifest)
        ]
        errors += [
            f"metadata: {e.message}"
            for e in jsonschema.Draft7Validator(_METADATA).iter_errors(manifest.get("metadata"))
        ]
        return errors
    try:
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        return [str(error.message)]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema known for {api_version} {kind}"]
    return []
