"""Alert rules: promtool-valid, unit-tested, the same in the chart and the plain file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart_helpers import (
    CHART_RULES_COPY,
    METRICS_DOC,
    RULE_TESTS,
    RULES,
    RUNBOOK,
    one,
    promtool_binary,
    render,
    run,
)

REQUIRED_ALERTS = {
    "CachescalePrefixCacheCollapse",
    "CachescaleCacheDegraded",
    "CachescaleOverBudget",
    "CachescaleSLOAtRisk",
    "CachescaleMetricsUnavailable",
    "CachescaleOperatorDown",
    "CachescaleEvaluationsFailing",
}
RUNBOOK_BASE = "https://github.com/cachescale/cachescale/blob/main/docs/runbook.md"


def rules_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return loaded


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rules_file()["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_promtool_check_rules() -> None:
    result = run([promtool_binary(), "check", "rules", str(RULES)])
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    fixtures = sorted(RULE_TESTS.glob("*.yaml"))
    assert fixtures
    result = run([promtool_binary(), "test", "rules", *map(str, fixtures)])
    assert result.stdout.count("SUCCESS") == len(fixtures), result.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A fixture expecting silence where the rule fires makes promtool fail (no blind pass)."""
    fixture = yaml.safe_load((RULE_TESTS / "policies-test.yaml").read_text(encoding="utf-8"))
    first = fixture["tests"][0]
    firing = next(case for case in first["alert_rule_test"] if case["exp_alerts"])
    firing["exp_alerts"] = []
    fixture["rule_files"] = [str(RULES)]
    fixture["tests"] = [first]
    path = tmp_path / "inverted-test.yaml"
    path.write_text(yaml.safe_dump(fixture), encoding="utf-8")
    result = run([promtool_binary(), "test", "rules", str(path)], check=False)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_every_alert_has_fixtures_that_fire_and_stay_quiet() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS.glob("*.yaml"):
        fixture = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in fixture["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {alert["alert"] for alert in alerts()}
    assert names - fires == set(), "alerts no fixture makes fire"
    assert names - quiet == set(), "alerts no fixture checks for silence"


def test_the_issue_alerts_exist() -> None:
    assert {alert["alert"] for alert in alerts()} >= REQUIRED_ALERTS


def test_every_alert_is_annotated_and_linked_to_its_runbook_section() -> None:
    headings = {
        github_anchor(line.lstrip("#"))
        for line in RUNBOOK.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }
    for alert in alerts():
        name, annotations = alert["alert"], alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert alert["labels"]["severity"] in ("warning", "critical"), name
        assert re.search(r"\{\{.*(\$value|\$labels|query).*\}\}", annotations["description"]), (
            f"{name}: the description carries no numbers"
        )
        base, _, anchor = annotations["runbook_url"].partition("#")
        assert base == RUNBOOK_BASE, name
        assert anchor == name.lower(), name
        assert anchor in headings, f"docs/runbook.md has no section for {name}"


def test_runbook_sections_say_what_to_check_and_do() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    by_name = {section.split("\n", 1)[0].strip(): section for section in sections}
    for alert in alerts():
        section = by_name[alert["alert"]]
        assert "**What it means.**" in section, alert["alert"]
        assert "check" in section.lower(), alert["alert"]
        assert "**What to do.**" in section or "do, by" in section, alert["alert"]
    acknowledging = by_name["Acknowledging and rebaselining"]
    assert "cachescale.dev/acknowledge" in acknowledging
    assert "cachescale.dev/rebaseline" in acknowledging


def test_rules_read_only_contract_metrics() -> None:
    documented = set(re.findall(r"`(cachescale_[a-z0-9_]+)`", METRICS_DOC.read_text("utf-8")))
    used = set(re.findall(r"\bcachescale_[a-z0-9_]+", RULES.read_text(encoding="utf-8")))
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    assert used - documented == set(), "rules use metrics docs/metrics.md does not describe"


def test_chart_copy_is_byte_identical() -> None:
    assert CHART_RULES_COPY.read_bytes() == RULES.read_bytes(), (
        "charts/cachescale/files/prometheus/cachescale-rules.yaml drifted from "
        "deploy/prometheus/cachescale-rules.yaml: copy it"
    )


def test_prometheus_rule_holds_the_same_rules() -> None:
    rule = one(render({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert rule["spec"]["groups"] == rules_file()["groups"]


def test_prometheus_rule_placement_and_runbook_base() -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "namespace": "monitoring",
            "labels": {"release": "kube-prometheus-stack"},
            "runbookBaseUrl": "https://wiki.example.com/cachescale/runbook",
        }
    }
    rule = one(render(values), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls
    assert all(u.startswith("https://wiki.example.com/cachescale/runbook#") for u in urls)


@pytest.mark.parametrize("alert", sorted(REQUIRED_ALERTS))
def test_rendered_rule_passes_promtool(alert: str, tmp_path: Path) -> None:
    """The PrometheusRule's groups, written back out as a rules file, still check."""
    rule = one(render({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    groups = [
        {"name": g["name"], "rules": [r for r in g["rules"] if r.get("alert") == alert]}
        for g in rule["spec"]["groups"]
    ]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump({"groups": [g for g in groups if g["rules"]]}), "utf-8")
    run([promtool_binary(), "check", "rules", str(path)])


CONTRACT_METRICS = {
    "cachescale_token_hit_rate",
    "cachescale_request_hit_share",
    "cachescale_prefill_tokens_per_request",
    "cachescale_ttft_p95_seconds",
    "cachescale_slo_ttft_p95_seconds",
    "cachescale_gpu_seconds_per_1k_requests",
    "cachescale_budget_gpu_seconds_per_1k_requests",
    "cachescale_requests_per_second",
    "cachescale_arrivals_per_second",
    "cachescale_preemptions_per_second",
    "cachescale_baseline_token_hit_rate",
    "cachescale_baseline_prefill_tokens_per_request",
    "cachescale_baseline_gpu_seconds_per_1k_requests",
    "cachescale_replicas",
    "cachescale_replicas_desired_max",
    "cachescale_hpa_wanted_replicas",
    "cachescale_max_num_seqs",
    "cachescale_alert_active",
    "cachescale_decisions_total",
    "cachescale_evaluation_duration_seconds",
    "cachescale_evaluation_errors_total",
    "cachescale_last_evaluation_timestamp_seconds",
    "cachescale_kube_requests_total",
    "cachescale_evaluation_lateness_seconds",
    "cachescale_evaluation_missed_intervals_total",
    "cachescale_evaluation_jobs_waiting",
}


def test_metrics_doc_is_the_operator_contract() -> None:
    text = METRICS_DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(cachescale_[a-z0-9_]+)` \|", text, re.MULTILINE))
    assert documented == CONTRACT_METRICS
    for reason in ("PrefixCollapse", "EvictionPressure", "OverBudget", "SLOAtRisk"):
        assert reason in text
    assert "MetricsUnavailable" in text
    assert "never 0" in text
