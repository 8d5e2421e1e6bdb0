"""A policy's ``metrics.demandQuery``, confined to the policy's namespace before it is sent.

Why a module of its own: the demand query is the one piece of PromQL a policy author
writes, and the operator sends it with its own network and credentials to a Prometheus
that holds every tenant's series. So, as prom-label-proxy does, the text is parsed with a
real PromQL parser (``promql_parser``) and every vector selector in it (inside ranges,
subqueries, function calls, aggregations and both sides of binary operators) is forced to
``namespace="<the policy's namespace>"``. What the operator sends is the tree rendered
again here, never the author's text, so no spelling the parser reads one way and
Prometheus another can carry a selector past the rewrite.

Refused (``DemandQueryRefused``; ``DemandOutsideNamespace`` when a selector names another
namespace): text that does not parse; a selector whose ``namespace`` matcher is anything
but ``="<the policy's namespace>"`` (another name, a regex, a negation); alternatives
inside braces (``{a="x" or b="y"}``); ``info()``, which reads series its text does not
name; names or strings outside the plain spellings (control characters, UTF-8 quoted
names), which the rendering could not state exactly. The invariant is checked on the text
that is sent: it is parsed again, every selector in it must match exactly the policy's
namespace, and rendering that tree must give the same text (``confine``).

Pure: text in, text out (the parser is a compiled library, no I/O). Only the operator
calls it (``controller/reconcile/signal_reads.py``), and only when the cluster owner enabled
demand queries (``--allow-demand-query``).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

import promql_parser as pp

from cachescale.gather.selector import NAMESPACE_LABEL, escape_label_value
from cachescale.gather.signals import DEMAND_QUERY_FIELD

MAX_SHOWN_CHARS = 120
MAX_NESTING = 64
"""Deepest bracket nesting a demand query may have: the parser and the renderer recurse
once per level, so a deeper query is refused before it is parsed, not by a stack limit
that depends on the thread it runs in."""
"""A selector named in a refusal is cut to this length."""
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_UNSCOPED_FUNCTIONS = frozenset({"info"})
"""Functions that read series their arguments do not select (``info`` joins
``target_info``): no matcher in the text could confine them."""
_OPS = ((pp.MatchOp.Equal, "="), (pp.MatchOp.NotEqual, "!="), (pp.MatchOp.Re, "=~"))
"""The matcher operators as written (the parser's enum members are not hashable)."""


def _op(op: pp.MatchOp) -> str:
    return next((text for member, text in _OPS if op == member), "!~")


class DemandQueryRefused(ValueError):  # noqa: N818 (a refusal, not a failure)
    """The demand query cannot be confined to the policy's namespace: it is not sent."""


class DemandOutsideNamespace(DemandQueryRefused):
    """A selector of the demand query matches on a namespace other than the policy's."""


def confine(promql: str, namespace: str) -> str:
    """``promql`` with every vector selector forced to ``namespace="<namespace>"``, as
    the text to send; raises ``DemandQueryRefused`` when it cannot be. Invariant: the text
    returned parses, every selector in it matches exactly ``namespace``, and it is the
    rendering of its own parse (nothing in it was lost or reinterpreted)."""
    if _nesting(promql) > MAX_NESTING:
        raise DemandQueryRefused(
            f"{DEMAND_QUERY_FIELD} is nested too deeply to rewrite (over {MAX_NESTING} "
            "brackets); nothing was sent"
        )
    tree = _parse(promql, "is not PromQL the operator can read")
    text = _Renderer(namespace).render(tree)
    again = _parse(text, "could not be rewritten to the policy's namespace")
    unconfined = selectors_outside(again, namespace)
    if unconfined or _Renderer(namespace).render(again) != text:
        raise DemandQueryRefused(
            f"{DEMAND_QUERY_FIELD} could not be rewritten faithfully to namespace {namespace}; "
            "nothing was sent"
        )
    return text


def _nesting(text: str) -> int:
    """The deepest bracket nesting of ``text``, brackets inside quoted strings included
    (an over-count only refuses a query, never lets one through)."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest


def selectors_outside(tree: pp.Expr, namespace: str) -> list[str]:
    """Every vector selector in ``tree`` that does not match exactly ``namespace``: one
    ``namespace="<namespace>"`` matcher and no other on ``namespace``, no alternatives.
    The walk is the parser's own, not the renderer's (two traversals, one invariant)."""
    outside: list[str] = []

    def visit(node: pp.Expr) -> bool:
        if isinstance(node, pp.VectorSelector):
            matchers = node.matchers
            on_namespace = [m for m in matchers.matchers if m.name == NAMESPACE_LABEL]
            confined = (
                not matchers.or_matchers
                and len(on_namespace) == 1
                and on_namespace[0].op == pp.MatchOp.Equal
                and on_namespace[0].value == namespace
            )
            if not confined:
                outside.append(_shown(node))
        return True

    pp.walk(tree, pre_visit=visit)
    return outside


def _parse(text: str, failing: str) -> pp.Expr:
    try:
        return pp.parse(text)
    except (ValueError, RecursionError) as error:
        reason = str(error).splitlines()[0][:MAX_SHOWN_CHARS] if str(error) else "no reason given"
        raise DemandQueryRefused(f"{DEMAND_QUERY_FIELD} {failing} ({reason})") from error


def _shown(node: pp.VectorSelector) -> str:
    """The selector as the author wrote it (no matcher added), cut for a message."""
    name = node.name or ""
    try:
        matchers = ",".join(
            f"{m.name}{_op(m.op)}{_string(m.value)}" for m in node.matchers.matchers
        )
    except DemandQueryRefused:
        matchers = "…"
    text = f"{name}{{{matchers}}}"
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 1] + "…"


def _string(value: str) -> str:
    """A double-quoted PromQL string stating exactly ``value``."""
    if _CONTROL.search(value):
        raise DemandQueryRefused(
            f"{DEMAND_QUERY_FIELD} holds a string with a control character; nothing was sent"
        )
    return f'"{escape_label_value(value)}"'


def _name(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.fullmatch(value):
        raise DemandQueryRefused(
            f"{DEMAND_QUERY_FIELD} has a {what} the operator does not rewrite ({value[:60]!r}): "
            "use plain names; nothing was sent"
        )
    return value


def _duration(delta: timedelta) -> str:
    if delta < timedelta(0):
        return "-" + str(pp.display_duration(-delta))
    return str(pp.display_duration(delta))


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


class _Renderer:
    """PromQL text of a parsed tree, every vector selector forced to one namespace."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace

    def render(self, node: pp.Expr) -> str:
        try:
            return self._node(node)
        except RecursionError as error:
            raise DemandQueryRefused(
                f"{DEMAND_QUERY_FIELD} is nested too deeply to rewrite; nothing was sent"
            ) from error

    def _node(self, node: pp.Expr) -> str:
        if isinstance(node, pp.VectorSelector):
            return self._selector(node) + self._modifiers(node.at, node.offset)
        if isinstance(node, pp.MatrixSelector):
            inner = node.vector_selector
            ranged = f"{self._selector(inner)}[{_duration(node.range)}]"
            return ranged + self._modifiers(inner.at, inner.offset)
        if isinstance(node, pp.SubqueryExpr):
            step = _duration(node.step) if node.step is not None else ""
            assert node.range is not None
            ranged = f"{self._node(node.expr)}[{_duration(node.range)}:{step}]"
            return ranged + self._modifiers(node.at, node.offset)
        if isinstance(node, pp.ParenExpr):
            return f"({self._node(node.expr)})"
        if isinstance(node, pp.UnaryExpr):
            return f"-{self._node(node.expr)}"
        if isinstance(node, pp.NumberLiteral):
            return _number(node.val)
        if isinstance(node, pp.StringLiteral):
            return _string(node.val)
        if isinstance(node, pp.Call):
            return self._call(node)
        if isinstance(node, pp.AggregateExpr):
            return self._aggregate(node)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node)
        raise DemandQueryRefused(
            f"{DEMAND_QUERY_FIELD} uses {type(node).__name__}, which the operator does not "
            "rewrite; nothing was sent"
        )

    def _selector(self, node: pp.VectorSelector) -> str:
        """``name{matchers,namespace="<ns>"}``: the author's matchers, a ``namespace``
        one only if it already says exactly this namespace (then said once)."""
        if node.matchers.or_matchers:
            raise DemandQueryRefused(
                f"{DEMAND_QUERY_FIELD} selector {_shown(node)} uses 'or' inside braces, which "
                "the operator does not rewrite; nothing was sent"
            )
        parts = []
        for matcher in node.matchers.matchers:
            if matcher.name == NAMESPACE_LABEL:
                if matcher.op != pp.MatchOp.Equal or matcher.value != self._namespace:
                    raise DemandOutsideNamespace(
                        f"{DEMAND_QUERY_FIELD} selector {_shown(node)} reaches beyond the "
                        f'policy\'s namespace: a policy reads only namespace="{self._namespace}" '
                        "(write that matcher or none; it is added); nothing was sent"
                    )
                continue
            label = _name(matcher.name, _LABEL_NAME, "label name")
            parts.append(f"{label}{_op(matcher.op)}{_string(matcher.value)}")
        parts.append(f"{NAMESPACE_LABEL}={_string(self._namespace)}")
        name = "" if node.name is None else _name(node.name, _METRIC_NAME, "metric name")
        return f"{name}{{{','.join(parts)}}}"

    @staticmethod
    def _modifiers(at: pp.AtModifier | None, offset: timedelta | None) -> str:
        text = ""
        if at is not None:
            if at.type == pp.AtModifierType.Start:
                text += " @ start()"
            elif at.type == pp.AtModifierType.End:
                text += " @ end()"
            else:
                assert at.at is not None
                text += f" @ {at.at.timestamp():.3f}"
        if offset is not None:
            text += f" offset {_duration(offset)}"
        return text

    def _call(self, node: pp.Call) -> str:
        name = node.func.name
        if name in _UNSCOPED_FUNCTIONS:
            raise DemandQueryRefused(
                f"{DEMAND_QUERY_FIELD} calls {name}(), which reads series no selector names; "
                "nothing was sent"
            )
        return f"{name}({', '.join(self._node(arg) for arg in node.args)})"

    def _aggregate(self, node: pp.AggregateExpr) -> str:
        grouping = ""
        if node.modifier is not None:
            keyword = "by" if node.modifier.type == pp.AggModifierType.By else "without"
            labels = ", ".join(_name(x, _LABEL_NAME, "label name") for x in node.modifier.labels)
            grouping = f" {keyword} ({labels}) "
        param = f"{self._node(node.param)}, " if node.param is not None else ""
        return f"{node.op}{grouping}({param}{self._node(node.expr)})"

    def _binary(self, node: pp.BinaryExpr) -> str:
        words = ""
        modifier = node.modifier
        if modifier is not None:
            fill = modifier.fill_values
            if fill is not None and (fill.lhs is not None or fill.rhs is not None):
                raise DemandQueryRefused(
                    f"{DEMAND_QUERY_FIELD} uses fill(), which the operator does not rewrite; "
                    "nothing was sent"
                )
            if modifier.return_bool:
                words += " bool"
            if modifier.matching is not None:
                include = modifier.matching.type == pp.LabelModifierType.Include
                labels = ", ".join(
                    _name(x, _LABEL_NAME, "label name") for x in modifier.matching.labels
                )
                words += f" {'on' if include else 'ignoring'} ({labels})"
            side = (
                "group_left"
                if modifier.card == pp.VectorMatchCardinality.ManyToOne
                else "group_right"
                if modifier.card == pp.VectorMatchCardinality.OneToMany
                else None
            )
            if side is not None:
                carried = ", ".join(
                    _name(x, _LABEL_NAME, "label name") for x in modifier.group_labels or []
                )
                words += f" {side} ({carried})"
        return f"{self._node(node.lhs)} {node.op}{words} {self._node(node.rhs)}"
