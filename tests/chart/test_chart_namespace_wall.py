"""The chart's namespace walls (docs/security.md, section 5): the prompt-source namespaces
the cluster owner opened and ``policies.allowDemandQuery`` become ``cachescale run`` flags
its own parser accepts; by default neither is rendered, so no policy reads beyond its own
namespace."""

from __future__ import annotations

from cachescale.commands.main import build_parser
from tests.chart.chart_helpers import operator_args as args
from tests.chart.chart_helpers import render_error


def test_by_default_no_prompt_source_namespace_is_open_and_no_demand_query_is_sent() -> None:
    rendered = args({})
    assert not [a for a in rendered if a.startswith("--prompt-source-namespace")]
    assert "--allow-demand-query" not in rendered
    parsed = build_parser().parse_args(rendered)
    assert parsed.prompt_source_namespace == []
    assert parsed.allow_demand_query is False


def test_opened_namespaces_and_the_demand_query_opt_in_reach_the_operator() -> None:
    values = {
        "rbac": {"changeCorrelation": {"namespaces": ["rag", "gw"], "secretNamespaces": ["rag"]}},
        "policies": {"allowDemandQuery": True},
    }
    parsed = build_parser().parse_args(args(values))
    assert parsed.prompt_source_namespace == ["rag", "gw"]  # each once
    assert parsed.allow_demand_query is True


def test_allow_demand_query_must_be_a_boolean() -> None:
    assert "allowDemandQuery" in render_error({"policies": {"allowDemandQuery": "yes"}})
