"""A policy's demandQuery confined to its namespace (``gather/demand_scope.py``).

Every vector selector, wherever it sits in the tree, is sent with
``namespace="<the policy's namespace>"``; a selector that names another namespace, or
matches on it other than by equality, is refused; what cannot be rendered exactly is
refused. The text sent is the operator's own rendering, checked by parsing it again.
"""

from __future__ import annotations

from typing import Any

import promql_parser as pp
import pytest

from cachescale.gather.demand_scope import (
    DemandOutsideNamespace,
    DemandQueryRefused,
    confine,
    selectors_outside,
)

NS = "tenant-a"
A = f'namespace="{NS}"'


def matchers_of(query: str) -> list[list[str]]:
    """Every vector selector's matchers, as the parser reads ``query``."""
    found: list[list[str]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, pp.VectorSelector):
            found.append([str(m) for m in node.matchers.matchers])
        return True

    pp.walk(pp.parse(query), pre_visit=visit)
    return found


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        (
            "sum(rate(gateway_requests_total[5m]))",
            f"sum(rate(gateway_requests_total{{{A}}}[5m]))",
        ),
        (f'sum(x{{{A},route="llm"}})', f'sum(x{{route="llm",{A}}})'),
        (
            "max_over_time(rate(x[5m])[1h:1m] offset 5m)",
            f"max_over_time(rate(x{{{A}}}[5m])[1h:1m] offset 5m)",
        ),
        ("max_over_time(sum(x)[5m:])", f"max_over_time(sum(x{{{A}}})[5m:])"),
        ("rate(x[5m:])", f"rate(x{{{A}}}[5m:])"),
        ("x @ start() offset -5m", f"x{{{A}}} @ start() offset -5m"),
        ("rate(x[5m] @ 1700000000 offset 1h)", f"rate(x{{{A}}}[5m] @ 1700000000.000 offset 1h)"),
        (
            "a / on(pod) group_left(x) b > bool 1",
            f"a{{{A}}} / on (pod) group_left (x) b{{{A}}} > bool 1.0",
        ),
        ("x unless ignoring(a) y", f"x{{{A}}} unless ignoring (a) y{{{A}}}"),
        (
            'label_replace(up, "dst", "$1", "src", "(.*)")',
            f'label_replace(up{{{A}}}, "dst", "$1", "src", "(.*)")',
        ),
        ('absent(nothing{job="x"})', f'absent(nothing{{job="x",{A}}})'),
        ('{__name__=~".+"}', f'{{__name__=~".+",{A}}}'),
        ('count_values("v", x)', f'count_values("v", x{{{A}}})'),
        ("topk by (a) (3, x)", f"topk by (a) (3.0, x{{{A}}})"),
        ("sum without (a) (x)", f"sum without (a) (x{{{A}}})"),
        ("-(x - y) ^ 2", f"-(x{{{A}}} - y{{{A}}}) ^ 2.0"),
        ("scalar(x) * vector(1)", f"scalar(x{{{A}}}) * vector(1.0)"),
        ('x{a="q\\"uote\\\\back\\nnl"}', f'x{{a="q\\"uote\\\\back\\nnl",{A}}}'),
        ("x{a=`raw\\n`}", f'x{{a="raw\\\\n",{A}}}'),
        ('x{a="é☃"}', f'x{{a="é☃",{A}}}'),
    ],
    ids=[
        "rate",
        "own-namespace-kept-once",
        "subquery-offset",
        "subquery-aggregate",
        "subquery-default-step",
        "at-offset",
        "at-timestamp",
        "binary-group-left-bool",
        "set-op-ignoring",
        "label_replace",
        "absent",
        "any-name",
        "count_values",
        "topk",
        "without",
        "unary-paren",
        "scalar-vector",
        "escapes",
        "raw-string",
        "unicode",
    ],
)
def test_every_selector_is_forced_to_the_policys_namespace(written: str, sent: str) -> None:
    assert confine(written, NS) == sent
    assert selectors_outside(pp.parse(sent), NS) == []
    for matchers in matchers_of(sent):
        assert matchers.count(A) == 1
    assert confine(sent, NS) == sent  # idempotent: the rendering is its own fixed point


def test_a_quote_in_a_value_cannot_close_the_selector_early() -> None:
    """The value is one string in the tree; rendered escaped, it stays one string."""
    hostile = 'x{a="\\"} or SECRET{b=\\"1\\"} or x{c=\\""}'
    sent = confine(hostile, NS)
    tree = pp.parse(sent)
    assert isinstance(tree, pp.VectorSelector)  # one selector, not three joined by "or"
    pairs = [(m.name, m.value) for m in tree.matchers.matchers]
    assert pairs == [("a", '"} or SECRET{b="1"} or x{c="'), ("namespace", NS)]


@pytest.mark.parametrize(
    "written",
    [
        'sum(SECRETMETRIC{namespace="tenant-b"})',
        'x{namespace=~"tenant-a"}',
        'x{namespace=~".+"}',
        'x{namespace!="tenant-b"}',
        'x{namespace!~"kube-system"}',
        f'x{{{A}}} + y{{namespace="tenant-b"}}',
        'rate(x{namespace="tenant-b"}[5m])',
        'max_over_time(y{namespace="other"}[1h:1m])',
    ],
)
def test_a_selector_reaching_another_namespace_is_refused(written: str) -> None:
    with pytest.raises(DemandOutsideNamespace, match="reaches beyond the policy's namespace"):
        confine(written, NS)


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("sum(rate(x[5m]", "is not PromQL"),
        ("no_such_function(x)", "is not PromQL"),
        ('x{a="1" or b="2"}', "'or' inside braces"),
        ("info(x)", "info()"),
        ('x{a="\x01"}', "control character"),
        ("(" * 1200 + "x" + ")" * 1200, "nested too deeply"),
        ("", "is not PromQL"),
    ],
    ids=["unparsable", "unknown-function", "or-matchers", "info", "control", "deep", "empty"],
)
def test_what_cannot_be_confined_exactly_is_refused(written: str, why: str) -> None:
    with pytest.raises(DemandQueryRefused) as refused:
        confine(written, NS)
    assert why in str(refused.value)
    assert not isinstance(refused.value, DemandOutsideNamespace)
    assert "\n" not in str(refused.value)


def test_the_check_reads_every_selector_the_parser_sees() -> None:
    tree = pp.parse(f'x{{{A}}} + rate(y[5m]) + max_over_time(z{{namespace="b"}}[5m:1m])')
    assert selectors_outside(tree, NS) == ["y{}", 'z{namespace="b"}']
