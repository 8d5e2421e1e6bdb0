"""A small stand-in for the API server's CRD validation, for tests only.

It does what the API server does with a structural schema, in the same order: apply
defaults, check the OpenAPI v3.0 schema (types, bounds, patterns, enums, required), then
evaluate every ``x-kubernetes-validations`` CEL rule where its object is present. It lets
the tests check that the generated CRD rejects the same policies pydantic rejects, without
a cluster (e2e/ does the real thing when one is available).
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema

Schema = dict[str, Any]


def _apply_defaults(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = _apply_defaults(value[name], prop)
    return value


def _cel_errors(value: Any, schema: Schema, path: str) -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", ()):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            errors.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                errors.extend(_cel_errors(value[name], prop, f"{path}.{name}"))
    return errors


def crd_errors(crd: Schema, document: Schema) -> list[str]:
    """Messages the API server would give for ``document``; empty when it is accepted."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    document = _apply_defaults(copy.deepcopy(document), schema)
    validator = jsonschema.Draft4Validator(schema)
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(document)
    ]
    return errors or _cel_errors(document, schema, "")
