"""Validate policy YAML against the models and explain each problem in plain words.

``cachescale validate`` and the tests use this. Pydantic's errors carry the wire path
(camelCase, as the user wrote it) and a message; this module turns them into one line per
problem — which document, which field, what is wrong — so a user can fix a file without
reading a stack trace or a JSON-schema keyword.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from cachescale.api.policy import API_VERSION, KIND, CacheScalingPolicy


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one document."""

    document: int
    """1-based index of the YAML document in its file."""
    name: str | None
    """metadata.name of the document, when it has one."""
    path: str
    """Dotted wire path of the offending field (``spec.budget.minReplicas``), or ``-``."""
    message: str
    """What is wrong, in words."""

    def render(self, source: str) -> str:
        """``FILE: document N (name): path: message``."""
        label = f"document {self.document}" + (f" ({self.name})" if self.name else "")
        return f"{source}: {label}: {self.path}: {self.message}"


def _field_path(location: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif not item.startswith("function-after"):
            parts.append(item)
    return ".".join(parts) or "-"


def _plain_message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return (
            "unknown field (fields are camelCase; check the spelling against "
            "`kubectl explain csp.spec`)"
        )
    if kind == "string_pattern_mismatch":
        return (
            f"{error['input']!r} has the wrong form (expected to match {error['ctx']['pattern']})"
        )
    message = error["msg"].removeprefix("Value error, ")
    given = error.get("input")
    if kind != "value_error" and isinstance(given, (int, float, str)):
        message += f" (got {given!r})"
    return message


def problems_in_document(document: Any, index: int) -> list[Problem]:
    """All problems with one parsed YAML document (an empty list when it is valid)."""
    if not isinstance(document, dict):
        return [Problem(index, None, "-", "expected a mapping (a Kubernetes object)")]
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    name = name if isinstance(name, str) else None
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        found = f"{document.get('apiVersion')}/{document.get('kind')}"
        return [Problem(index, name, "kind", f"expected {API_VERSION} {KIND}, found {found}")]
    try:
        CacheScalingPolicy.model_validate(document)
    except ValidationError as error:
        return [
            Problem(index, name, _field_path(detail["loc"]), _plain_message(detail))
            for detail in error.errors(include_url=False)
        ]
    return []


def validate_yaml(text: str) -> list[Problem]:
    """Validate every document in a (multi-document) YAML text; skip empty documents."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        return [Problem(0, None, "-", f"not valid YAML: {error}")]
    problems: list[Problem] = []
    for index, document in enumerate(documents, start=1):
        if document is not None:
            problems.extend(problems_in_document(document, index))
    return problems
