"""The chart's fair-scheduling value (docs/security.md, section 7):
``operator.maxConcurrentPerNamespace`` becomes ``--max-concurrent-per-namespace``, which
the operator's own parser accepts, and the schema refuses a value that would stop every
namespace."""

from __future__ import annotations

from cachescale.commands.main import build_parser
from cachescale.controller.reconcile.fairness import DEFAULT_PER_NAMESPACE
from tests.chart.chart_helpers import operator_args as args
from tests.chart.chart_helpers import render_error


def test_the_per_namespace_limit_is_a_flag_the_operator_parses() -> None:
    assert build_parser().parse_args(args({})).max_concurrent_per_namespace == 4
    assert DEFAULT_PER_NAMESPACE == 4  # the chart's default is the operator's
    rendered = args({"operator": {"maxConcurrentPerNamespace": 7}})
    assert "--max-concurrent-per-namespace=7" in rendered
    assert build_parser().parse_args(rendered).max_concurrent_per_namespace == 7


def test_the_schema_refuses_a_limit_below_one() -> None:
    assert "maxConcurrentPerNamespace" in render_error(
        {"operator": {"maxConcurrentPerNamespace": 0}}
    )
