"""A small stand-in for the API server's CRD validation, for tests only.

It does what the API server does with a structural schema, in the same order: prune the
nulls of fields not marked nullable, apply defaults, check the OpenAPI v3.0 schema (types,
bounds, patterns, enums, required), then evaluate every ``x-kubernetes-validations`` CEL
rule where its object is present. It lets the tests check that the generated CRD rejects
the same policies pydantic rejects, without a cluster (e2e/ does the real thing when one
is available).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema

Schema = dict[str, Any]


def _go_pattern(
    validator: Any, pattern: str, instance: Any, schema: Schema
) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` as the API server reads it (Go's regexp): ``$`` is the end of the text.
    Python's ``$`` also matches before a final newline, so a name ending in a newline
    would pass here and be refused by the server."""
    if validator.is_type(instance, "string"):
        go = re.sub(r"(?<!\\)\$", r"\\Z", pattern)
        if not re.search(go, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _go_pattern})


def _prune_nulls(value: Any, schema: Schema) -> Any:
    """Drop nulls the schema does not allow, in fields and in map values alike (the real
    server stores ``selector: {namespace: null}`` as ``selector: {}``)."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name in value and value[name] is None and not prop.get("nullable"):
                del value[name]
            elif name in value:
                value[name] = _prune_nulls(value[name], prop)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        items = schema["additionalProperties"]
        for name in [key for key, item in value.items() if item is None]:
            if not items.get("nullable"):
                del value[name]
    return value


def _apply_defaults(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = _apply_defaults(value[name], prop)
    return value


def _typed(value: Any, schema: Schema) -> Any:
    """Integers in ``type: number`` fields become doubles, as the API server's CEL sees
    them (``weightsGiB: 16`` is 16.0, so it compares with ``memoryGiB * 0.9``)."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        return {key: _typed(item, properties.get(key, {})) for key, item in value.items()}
    return value


def _cel_errors(value: Any, schema: Schema, path: str) -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", ()):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        try:
            holds = program.evaluate({"self": celpy.json_to_cel(_typed(value, schema))})
        except celpy.CELEvalError as error:  # e.g. a duration past Go's range: rejected
            errors.append(f"{path}: {rule['message']} ({error.args[0]})")
            continue
        if not holds:
            errors.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                errors.extend(_cel_errors(value[name], prop, f"{path}.{name}"))
    return errors


def crd_errors(crd: Schema, document: Schema) -> list[str]:
    """Messages the API server would give for ``document``; empty when it is accepted."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    document = _apply_defaults(_prune_nulls(copy.deepcopy(document), schema), schema)
    validator = _Validator(schema)
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(document)
    ]
    return errors or _cel_errors(document, schema, "")
