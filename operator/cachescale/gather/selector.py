"""Label selectors: which engine series a policy reads, and how results are split back.

Why a module of its own: a policy's label names and values are user input, and this is
where they are checked and escaped before any of them reaches PromQL (``Selector``: exact
``name="value"`` matchers on validated names; ``escape_label_value`` and ``escape_regex``
for every value spliced into query text). It is also where a scope is decided: the
matchers a batch reads under and the group labels every query keeps (``QueryScope``, for
one policy or shared by several), and where a shared batch's results are handed back to
each policy (``split_by_selector``). The queries themselves are ``gather.promql``'s.

Namespaces are walls (``policy_selector``): a policy's selector always matches on the
policy's own namespace, and a ``namespace`` key naming another one is refused before
anything is fetched, so whatever the author writes, the operator's Prometheus answers a
policy only with series of its own namespace. Every query of a scope carries that
matcher, the series joined in from kube-state-metrics and info gauges included
(``QueryScope.namespaces``).

Pure: validates, escapes and matches label sets; no query text beyond the matchers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from cachescale.api.spec import PROMETHEUS_LABEL_NAME

MODEL_LABEL = "model_name"
"""Every vLLM and SGLang series carries the served model name."""
NAMESPACE_LABEL = "namespace"
POD_LABEL = "pod"
"""Target labels a PodMonitor/ServiceMonitor adds; kube-state-metrics uses the same names."""

_LABEL_NAME_RE = re.compile(PROMETHEUS_LABEL_NAME)
QUERY_TAG_LABEL = "cachescale_query"
"""The label ``promql.combine`` tags each query's series with (one request carries a batch)."""
_RESERVED_LABELS = frozenset({"le", QUERY_TAG_LABEL})
"""Label names the queries set themselves (histogram bucket bounds, the batch's tags)."""
_VALUE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_RE2_METACHARACTERS = frozenset("\\.+*?()|[]{}^$")


class SelectorError(ValueError):
    """A selector that is not a set of ``name="value"`` label matchers."""


class OutsideNamespace(ValueError):  # noqa: N818 (a refusal, not a failure)
    """A policy's selector names a namespace other than the policy's: refused, nothing read."""


MAX_NAMED_CHARS = 63
"""An author's namespace value is echoed back at most this long (a namespace name's limit)."""


def policy_selector(matchers: Mapping[str, str], namespace: str) -> Selector:
    """The selector a policy in ``namespace`` reads with: its ``metrics.selector`` with
    ``namespace="<namespace>"`` always added. Invariant: every selector a policy reads with
    matches exactly its own namespace; a ``namespace`` key naming another one raises
    ``OutsideNamespace`` (refused, not narrowed, so the author sees why nothing matches)."""
    named = matchers.get(NAMESPACE_LABEL)
    if named is not None and named != namespace:
        shown = named if len(named) <= MAX_NAMED_CHARS else named[:MAX_NAMED_CHARS] + "…"
        raise OutsideNamespace(
            f"metrics.selector names namespace {shown!r}: a policy reads only its own "
            f"namespace's series ({namespace}), so nothing was fetched; remove the "
            "namespace key or set it to the policy's namespace"
        )
    return Selector.of({**matchers, NAMESPACE_LABEL: namespace})


def escape_label_value(value: str) -> str:
    """``value`` as the body of a double-quoted PromQL string (no quote can end it early)."""
    return "".join(_VALUE_ESCAPES.get(char, char) for char in value)


def escape_regex(value: str) -> str:
    """``value`` as an RE2 pattern matching exactly itself."""
    return "".join("\\" + char if char in _RE2_METACHARACTERS else char for char in value)


def check_label_name(name: str) -> str:
    """Return ``name`` if a selector may match on it, else raise ``SelectorError``."""
    if not _LABEL_NAME_RE.fullmatch(name):
        raise SelectorError(
            f"{name!r} is not a Prometheus label name "
            "(letters, digits and underscores, not starting with a digit)"
        )
    if name.startswith("__") or name in _RESERVED_LABELS:
        raise SelectorError(f"label {name!r} is reserved; select on a target or engine label")
    return name


_PAIR_RE = re.compile(r'\s*([^\s=!~,{}"]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)', re.DOTALL)
_UNESCAPES = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}


def _unescape(body: str) -> str:
    out: list[str] = []
    chars = iter(body)
    for char in chars:
        if char == "\\":
            escaped = next(chars)
            if escaped not in _UNESCAPES:
                raise SelectorError(f"unsupported escape \\{escaped} in {body!r}")
            out.append(_UNESCAPES[escaped])
        else:
            out.append(char)
    return "".join(out)


@dataclass(frozen=True)
class Selector:
    """Exact-match label matchers choosing one deployment's engine series."""

    labels: tuple[tuple[str, str], ...]
    """``(name, value)`` pairs, sorted by name, names unique and validated."""

    @classmethod
    def of(cls, matchers: Mapping[str, str]) -> Selector:
        """From a policy's ``metrics.selector`` mapping; raises ``SelectorError``.

        It must match on at least one label, each with a value: no matcher would read every
        engine in Prometheus, and ``name=""`` also matches every series without ``name``.
        """
        if not matchers:
            raise SelectorError(
                'select at least one label, e.g. namespace="llm": an empty selector would '
                "read every engine in Prometheus"
            )
        for name, value in matchers.items():
            if not value:
                raise SelectorError(
                    f'{name}="" is empty: in PromQL it also matches every series without '
                    f"{name!r}; give its value"
                )
        return cls(tuple(sorted((check_label_name(k), v) for k, v in matchers.items())))

    @classmethod
    def parse(cls, text: str) -> Selector:
        """From ``name="value",...`` (braces optional); only ``=`` with quoted values."""
        body = text.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1]
        pairs: dict[str, str] = {}
        position = 0
        while position < len(body) and body[position:].strip():
            match = _PAIR_RE.match(body, position)
            if match is None:
                raise SelectorError(
                    f'cannot read {body[position:]!r}: write name="value" pairs separated '
                    'by commas, e.g. namespace="llm",model_name="llama-3-8b"'
                )
            name, value = match.group(1), _unescape(match.group(2))
            if name in pairs:
                raise SelectorError(f"label {name!r} is given twice")
            pairs[name] = value
            position = match.end()
            if match.group(3) == "" and position < len(body):
                raise SelectorError(f"expected a comma before {body[position:]!r}")
        return cls.of(pairs)

    @property
    def names(self) -> tuple[str, ...]:
        """The label names matched on."""
        return tuple(name for name, _ in self.labels)

    def matchers(self) -> str:
        """The matchers as PromQL, without braces: ``a="x",b="y"``."""
        return ",".join(f'{name}="{escape_label_value(value)}"' for name, value in self.labels)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a result's label set belongs to this selector (absent equals "")."""
        return all(labels.get(name, "") == value for name, value in self.labels)

    def __str__(self) -> str:
        return "{" + self.matchers() + "}"


@dataclass(frozen=True)
class QueryScope:
    """Which series a batch of queries reads and how results are grouped."""

    matchers: str
    """PromQL label matchers without braces (may be empty)."""
    group_by: tuple[str, ...]
    """Labels every fleet-level query keeps; per-pod queries add ``pod``."""
    namespaces: str = ""
    """The ``namespace`` matcher of ``matchers`` alone (empty when the scope does not
    match on it): what the series no selector scopes (kube-state-metrics, info gauges,
    joined to the selected pods) are read under, so they never leave those namespaces."""

    @classmethod
    def for_selector(cls, selector: Selector) -> QueryScope:
        """One policy: exact matchers."""
        namespace = dict(selector.labels).get(NAMESPACE_LABEL)
        namespaces = (
            "" if namespace is None else f'{NAMESPACE_LABEL}="{escape_label_value(namespace)}"'
        )
        return cls(selector.matchers(), _group_labels(selector.names), namespaces)

    @classmethod
    def shared(cls, selectors: Sequence[Selector]) -> QueryScope:
        """Several policies: one regex per label name that every selector matches on,
        matching every policy's value, and results grouped by every name any of them
        matches on. The union over-selects (a per-label cross product, and nothing
        narrows on the names only some selectors use), so results must be split per
        selector (``split_by_selector``); for selectors on different label sets, a
        policy's share is its own answer only if its series carry none of the names
        only the others match on (``label_query`` tells, ``gather.grouped`` checks)."""
        common = set.intersection(*(set(selector.names) for selector in selectors))
        if not common:
            raise SelectorError("selectors that match on no common label cannot share a query")
        matchers = {}
        for name in (name for name in selectors[0].names if name in common):
            values = sorted({dict(selector.labels)[name] for selector in selectors})
            pattern = "|".join(escape_regex(value) for value in values)
            matchers[name] = f'{name}=~"{escape_label_value(pattern)}"'
        every_name = {name for selector in selectors for name in selector.names}
        namespaces = matchers.get(NAMESPACE_LABEL, "")
        return cls(",".join(matchers.values()), _group_labels(every_name), namespaces)


def _group_labels(selector_names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({*selector_names, MODEL_LABEL, NAMESPACE_LABEL} - {POD_LABEL}))


class HasLabels(Protocol):
    """Anything with a result label set (a query result series)."""

    @property
    def labels(self) -> Mapping[str, str]:
        """The series' labels."""
        ...


class ResultSeries(HasLabels, Protocol):
    """A query result element: a label set and its value."""

    @property
    def value(self) -> float:
        """The sample value (a series count for detection queries)."""
        ...


_S = TypeVar("_S", bound=HasLabels)
_K = TypeVar("_K")


def split_by_selector(results: Mapping[_K, Sequence[_S]], selector: Selector) -> dict[_K, list[_S]]:
    """The part of a (shared) batch's results that belongs to one policy."""
    return {
        key: [s for s in series if selector.matches(s.labels)] for key, series in results.items()
    }
