"""The Grafana dashboard: loads, one signal per panel, and every query is real PromQL."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart_helpers import (
    CHART_DASHBOARD_COPY,
    DASHBOARD,
    METRICS_DOC,
    one,
    promtool_binary,
    render,
    run,
)

# Grafana's template variables, replaced by what they expand to before parsing.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "6h",
    "$namespace": ".*",
    "$policy": ".*",
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs(panel: dict[str, Any]) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def panel_titled(fragment: str) -> dict[str, Any]:
    matches = [p for p in panels() if fragment.lower() in p["title"].lower()]
    assert len(matches) == 1, f"{len(matches)} panels titled like {fragment!r}"
    return matches[0]


def expand(expr: str) -> str:
    for variable, value in sorted(VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def test_dashboard_loads_and_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "cachescale"
    assert board["description"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "namespace", "policy"}
    for panel in panels():
        assert panel["title"], panel["id"]
        assert len(panel["description"]) > 40, f"{panel['title']}: describe what it shows"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_panel_query_parses_with_promtool(tmp_path: Path) -> None:
    """``promtool check`` cannot parse a bare expression: each query becomes a recording
    rule in a temporary rules file, which ``promtool check rules`` parses."""
    rules = [
        {
            "record": f"cachescale:dashboard_panel_{panel['id']}_{target['refId']}",
            "expr": expand(target["expr"]),
        }
        for panel in panels()
        for target in panel["targets"]
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), "utf-8")
    result = run([promtool_binary(), "check", "rules", str(path)])
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_promtool_parse_check_is_not_blind(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    rule = {"record": "x:y", "expr": expand("max by (namespace (cachescale_replicas)")}
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}), "utf-8")
    assert run([promtool_binary(), "check", "rules", str(path)], check=False).returncode != 0


@pytest.mark.parametrize(
    ("title", "metrics"),
    [
        (
            "hit rate",
            [
                "cachescale_token_hit_rate",
                "cachescale_request_hit_share",
                "cachescale_baseline_token_hit_rate",
            ],
        ),
        (
            "Prefill tokens",
            [
                "cachescale_prefill_tokens_per_request",
                "cachescale_baseline_prefill_tokens_per_request",
            ],
        ),
        ("TTFT p95", ["cachescale_ttft_p95_seconds", "cachescale_slo_ttft_p95_seconds"]),
        (
            "GPU-seconds per 1k",
            [
                "cachescale_gpu_seconds_per_1k_requests",
                "cachescale_budget_gpu_seconds_per_1k_requests",
                "cachescale_baseline_gpu_seconds_per_1k_requests",
            ],
        ),
        (
            "Replicas",
            [
                "cachescale_replicas",
                "cachescale_hpa_wanted_replicas",
                "cachescale_replicas_desired_max",
            ],
        ),
        ("Preemptions", ["cachescale_preemptions_per_second"]),
        ("Active cachescale alerts", ["cachescale_alert_active"]),
        ("Firing cachescale alerts", ["ALERTS"]),
    ],
)
def test_required_panels_show_each_signal_separately(title: str, metrics: list[str]) -> None:
    """One target per signal, never one averaged number."""
    queries = exprs(panel_titled(title))
    assert len(queries) == len(metrics)
    for query, metric in zip(queries, metrics, strict=True):
        assert re.search(rf"\b{re.escape(metric)}\b", query), (metric, query)
        assert "avg" not in query, f"{title}: averaging hides the signal"


def test_ttft_panel_says_why_there_is_no_hit_miss_split() -> None:
    description = panel_titled("TTFT p95")["description"]
    assert "cache outcome" in description
    assert "not available" in description


def test_dashboard_reads_only_contract_metrics() -> None:
    documented = set(re.findall(r"`(cachescale_[a-z0-9_]+)`", METRICS_DOC.read_text("utf-8")))
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for panel in panels()
        for query in exprs(panel)
        for name in re.findall(r"\bcachescale_[a-z0-9_]+", query)
    }
    assert used
    assert used - documented == set()


def test_chart_copy_and_config_map() -> None:
    assert CHART_DASHBOARD_COPY.read_bytes() == DASHBOARD.read_bytes(), (
        "charts/cachescale/files/grafana/cachescale-dashboard.json drifted from "
        "deploy/grafana/cachescale-dashboard.json: copy it"
    )
    config_map = one(render({"grafanaDashboard": {"enabled": True}}), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["cachescale-dashboard.json"]) == dashboard()
