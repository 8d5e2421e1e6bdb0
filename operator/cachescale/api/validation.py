"""Validate policy YAML against the models and explain each problem in plain words.

``cachescale validate`` (``commands/validate.py``), the simulator's scenario files and the
tests use this. Pydantic's errors carry the wire path (camelCase, as the user wrote it) and
a message; this module turns them into one line per problem — which document, which
field, what is wrong — so a user can fix a file without reading a stack trace or a
JSON-schema keyword.

It reads YAML the way ``kubectl`` does where PyYAML would differ, so that a file passes
here only if the API server can take it: ``1e3`` is a number (YAML 1.2, as in Go), a
whole float such as ``4.0`` is the integer 4 (kubectl's YAML-to-JSON step writes it as
``4``), and the bytes must be UTF-8. A key written twice in one mapping is an error here,
though kubectl keeps the last value without a word: one of the author's two values would
be lost (e2e/test_validate_agrees.py lists where validate is stricter than the server).
Documents that are not CacheScalingPolicies (a Deployment beside the policy in a GitOps
folder) are skipped with a note; a policy that uses YAML anchors or aliases is refused
with one line, since an alias can expand a small file into a huge object before any field
is checked.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from cachescale.api.policy import API_VERSION, GROUP, KIND, CacheScalingPolicy


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one document (or, as a note, why a document was skipped)."""

    document: int
    """1-based index of the YAML document in its file; 0 for the file as a whole."""
    name: str | None
    """metadata.name of the document, when it has one."""
    path: str
    """Dotted wire path of the offending field (``spec.budget.minReplicas``), or ``-``."""
    message: str
    """What is wrong, in words."""

    def render(self, source: str) -> str:
        """``FILE: document N (name): path: message``, or ``FILE: message``."""
        if self.document == 0:
            return f"{source}: {self.message}"
        label = f"document {self.document}" + (f" ({self.name})" if self.name else "")
        return f"{source}: {label}: {self.path}: {self.message}"


@dataclass(frozen=True)
class Skipped:
    """A document that is not a policy, left alone."""

    document: int
    """1-based index of the YAML document in its file."""
    found: str
    """What it is instead: ``apps/v1/Deployment``, or a description."""

    def render(self, source: str) -> str:
        """``FILE: document N: skipped, not a CacheScalingPolicy: apps/v1/Deployment``."""
        return f"{source}: document {self.document}: skipped, not a {KIND}: {self.found}"


@dataclass
class Checked:
    """What one file holds: its problems, the documents skipped, the policies found."""

    problems: list[Problem] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    """Documents that are not CacheScalingPolicies."""
    policies: int = 0
    """Documents that are (or are meant to be) CacheScalingPolicies, valid or not."""
    documents: int = 0
    """Non-empty YAML documents in the file."""


class _KubectlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, closer to what ``kubectl`` reads (see the module docstring)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults`, resolved by PyYAML as kubectl resolves it
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # PyYAML itself refuses an unhashable key, with its line
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is written twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float | int:
        value: float = super().construct_yaml_float(node)
        if math.isfinite(value) and value.is_integer() and abs(value) < _GO_PLAIN_FLOAT_LIMIT:
            return int(value)
        return value


_GO_PLAIN_FLOAT_LIMIT = 1e21
"""Go's JSON encoder writes a whole float below this without an exponent, so the API
server reads it as an integer; from here on it writes ``1e+21``, a float."""
_KubectlLoader.add_constructor("tag:yaml.org,2002:float", _KubectlLoader.construct_yaml_float)


# YAML 1.2 (and Go's YAML) floats with an exponent and no dot or exponent sign: 1e3, 2.5e10.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$")
_KubectlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+.0123456789")
)


def load_documents(text: str) -> list[Any]:
    """Every document of a (multi-document) YAML text, read as ``kubectl`` would;
    raises ``yaml.YAMLError``."""
    try:
        return list(yaml.load_all(text, Loader=_KubectlLoader))
    except RecursionError:  # PyYAML composes nested collections recursively
        raise yaml.YAMLError("nested too deeply to read") from None


def yaml_error_line(error: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what (PyYAML's own text spans several lines)."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return str(error).replace("\n", " ")
    mark = error.problem_mark or error.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    what = error.problem or error.context or "cannot be parsed"
    if "'\\t'" in what:
        what += " (a tab: YAML indents with spaces only)"
    return where + what


def decode(data: bytes) -> str:
    """The text of a policy file; ``ValueError`` with one line when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(
            f"not UTF-8 text: byte 0x{data[error.start]:02x} on line {line}; save the file as UTF-8"
        ) from None


def field_path(location: tuple[int | str, ...]) -> str:
    """Pydantic's error location as a dotted path: ``spec.metrics.selector[0]``."""
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif not item.startswith("function-after"):
            parts.append(item)
    return ".".join(parts) or "-"


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
}


POLICY_FIELDS_HINT = "fields are camelCase; check the spelling against `kubectl explain csp.spec`"
"""What to check when a policy has an unknown field."""


def plain_message(error: ErrorDetails, fields_hint: str = POLICY_FIELDS_HINT) -> str:
    """One pydantic error in a user's words, without JSON-schema keywords or a URL;
    ``fields_hint`` says where the right field names are."""
    kind = error["type"]
    given = error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return f"unknown field ({fields_hint})"
    if kind == "string_pattern_mismatch" and isinstance(given, str) and "://" in given:
        # A URL may carry user info or a token in its query: never echoed into a status,
        # an Event or a log line.
        return (
            "the URL has the wrong form (not shown: it may carry a credential); expected "
            "http(s)://host[:port][/path] without user info, query, fragment, backslash or "
            f"whitespace (to match {error['ctx']['pattern']})"
        )
    if kind == "string_pattern_mismatch":
        return (
            f"{error['input']!r} has the wrong form (expected to match {error['ctx']['pattern']})"
        )
    if kind in _EXPECTED and isinstance(given, str):
        return f"expected {_EXPECTED[kind]}, got the string {given!r}; write it without quotes"
    if kind in _EXPECTED and isinstance(given, (int, float)):
        return f"expected {_EXPECTED[kind]}, got {given!r}"
    if kind == "finite_number":
        return f"must be a finite number, got {given!r}"
    message = error["msg"].removeprefix("Value error, ")
    if kind != "value_error" and isinstance(given, (int, float, str)):
        message += f" (got {given!r})"
    return message


def _is_meant_as_policy(document: dict[Any, Any]) -> bool:
    """A policy, or a document that names the policy kind or API group (a typo in either
    is an error, not a reason to skip the document)."""
    api_version = document.get("apiVersion")
    group = api_version.split("/")[0] if isinstance(api_version, str) else None
    return document.get("kind") == KIND or group == GROUP


def _what_it_is(document: Any) -> str:
    if not isinstance(document, dict):
        return f"a YAML {type(document).__name__}, not a Kubernetes object"
    if "apiVersion" not in document and "kind" not in document:
        return "a mapping without apiVersion and kind"
    return f"{document.get('apiVersion')}/{document.get('kind')}"


def _name_of(document: dict[Any, Any]) -> str | None:
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def problems_in_document(document: Any, index: int) -> list[Problem]:
    """All problems with one parsed YAML document (an empty list when it is valid)."""
    if not isinstance(document, dict):
        return [Problem(index, None, "-", "expected a mapping (a Kubernetes object)")]
    name = _name_of(document)
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        found = _what_it_is(document)
        return [Problem(index, name, "kind", f"expected {API_VERSION} {KIND}, found {found}")]
    try:
        CacheScalingPolicy.model_validate(document)
    except ValidationError as error:
        return [
            Problem(index, name, field_path(detail["loc"]), plain_message(detail))
            for detail in error.errors(include_url=False)
        ]
    return []


def _aliases_by_document(text: str) -> dict[int, str]:
    """``{document index: where its first alias is}`` (the text has already parsed)."""
    found: dict[int, str] = {}
    index = 0
    for event in yaml.parse(text, Loader=_KubectlLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            index += 1
        elif isinstance(event, yaml.AliasEvent) and index not in found:
            line = event.start_mark.line + 1 if event.start_mark else 0
            found[index] = f"line {line}: *{event.anchor}"
    return found


def check_text(text: str) -> Checked:
    """Check every document of a (multi-document) YAML text; skip empty documents and
    note the ones that are not policies."""
    checked = Checked()
    try:
        documents = load_documents(text)
    except yaml.YAMLError as error:
        checked.problems.append(Problem(0, None, "-", f"not valid YAML: {yaml_error_line(error)}"))
        return checked
    aliases = _aliases_by_document(text)
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        checked.documents += 1
        if not isinstance(document, dict) or not _is_meant_as_policy(document):
            checked.skipped.append(Skipped(index, _what_it_is(document)))
            continue
        checked.policies += 1
        if index in aliases:
            checked.problems.append(
                Problem(
                    index,
                    _name_of(document),
                    "-",
                    f"YAML anchors and aliases are not accepted in a policy ({aliases[index]}); "
                    "write the values out",
                )
            )
            continue
        checked.problems.extend(problems_in_document(document, index))
    return checked


def error_lines(
    error: ValidationError,
    source: str,
    prefix: str = "",
    fields_hint: str = POLICY_FIELDS_HINT,
) -> list[str]:
    """``SOURCE: prefix.field.path: message``, one line per problem in ``error``."""
    return [
        f"{source}: {prefix}{field_path(detail['loc'])}: {plain_message(detail, fields_hint)}"
        for detail in error.errors(include_url=False)
    ]


def validate_yaml(text: str) -> list[Problem]:
    """The problems in a (multi-document) YAML text; non-policy documents are skipped."""
    return check_text(text).problems
