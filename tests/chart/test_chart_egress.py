"""The chart's egress and credentials limits (docs/security.md): ``allowedPrometheusUrls``
becomes ``--allowed-prometheus-url`` flags the operator's own parser accepts, NOTES warn
when it is empty, and no rendered role can read a Secret it was not given by name."""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.cli import build_parser
from tests.chart.chart_helpers import CHART, by_kind, helm, one, render, render_error

ALLOWED = ["http://prometheus-operated.monitoring:9090", r"re:https://thanos-[a-z]+\.obs:10902"]


def args(values: dict[str, Any]) -> list[str]:
    deployment = one(render(values), "Deployment")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_allowed_urls_become_flags_the_operator_parses() -> None:
    rendered = args({"allowedPrometheusUrls": ALLOWED})
    assert [a for a in rendered if a.startswith("--allowed-prometheus-url")] == [
        f"--allowed-prometheus-url={url}" for url in ALLOWED
    ]
    assert build_parser().parse_args(rendered).allowed_prometheus_url == ALLOWED


def test_no_flag_by_default() -> None:
    assert build_parser().parse_args(args({})).allowed_prometheus_url == []


def test_an_entry_that_is_not_a_url_prefix_or_regex_is_rejected() -> None:
    assert "allowedPrometheusUrls" in render_error({"allowedPrometheusUrls": ["prom:9090"]})


def notes(values: dict[str, Any]) -> str:
    out = helm("install", "cachescale", str(CHART), "--dry-run=client", values=values)
    return out.split("NOTES:", 1)[1]


def test_notes_recommend_the_allow_list_and_the_secret_label() -> None:
    default = notes({})
    assert "WARNING: allowedPrometheusUrls is empty" in default
    assert "cachescale.dev/prometheus-credentials=true" in default
    limited = notes({"allowedPrometheusUrls": ALLOWED[:1]})
    assert "WARNING" not in limited
    assert f"Prometheus only at: {ALLOWED[0]}" in limited


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"allowedPrometheusUrls": ALLOWED},
        {"watchNamespaces": ["llm"], "rbac": {"namespaced": True}},
        {"rbac": {"prometheusSecrets": [{"namespace": "llm", "names": ["prom-token"]}]}},
    ],
    ids=["default", "allow-list", "namespaced", "named-secrets"],
)
def test_secrets_are_readable_only_by_name_and_never_cluster_wide(values: dict[str, Any]) -> None:
    manifests = render(values)
    for role in by_kind(manifests, "ClusterRole"):
        assert not [r for r in role["rules"] if "secrets" in r["resources"]], role["metadata"]
    for role in by_kind(manifests, "Role"):
        for rule in role["rules"]:
            if "secrets" in rule["resources"]:
                assert rule["verbs"] == ["get"]
                assert rule["resourceNames"], "a Secret rule without resourceNames"


def test_prometheus_url_becomes_the_operators_default() -> None:
    url = "http://prometheus-operated.monitoring:9090"
    rendered = args({"prometheus": {"url": url}})
    assert f"--default-prometheus-url={url}" in rendered
    assert build_parser().parse_args(rendered).default_prometheus_url == url
    assert build_parser().parse_args(args({})).default_prometheus_url is None
    assert "prometheus" in render_error({"prometheus": {"url": "prometheus:9090"}})
