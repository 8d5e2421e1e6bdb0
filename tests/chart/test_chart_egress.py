"""The chart's egress and credentials limits (docs/security.md): ``allowedPrometheusUrls``
becomes ``--allowed-prometheus-url`` flags the operator's own parser accepts, NOTES say
what policies may reach, and no rendered role can read a Secret it was not given by name."""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.commands.main import build_parser
from tests.chart.chart_helpers import CHART, by_kind, helm, render, render_error
from tests.chart.chart_helpers import operator_args as args

ALLOWED = ["http://prometheus-operated.monitoring:9090", r"re:https://thanos-[a-z]+\.obs:10902"]


def test_allowed_urls_become_flags_the_operator_parses() -> None:
    rendered = args({"allowedPrometheusUrls": ALLOWED})
    assert [a for a in rendered if a.startswith("--allowed-prometheus-url")] == [
        f"--allowed-prometheus-url={url}" for url in ALLOWED
    ]
    assert build_parser().parse_args(rendered).allowed_prometheus_url == ALLOWED


def test_no_flag_by_default() -> None:
    assert build_parser().parse_args(args({})).allowed_prometheus_url == []


def notes(values: dict[str, Any]) -> str:
    out = helm("install", "cachescale", str(CHART), "--dry-run=client", values=values)
    return out.split("NOTES:", 1)[1]


def test_notes_say_what_policies_may_reach_and_the_secret_label() -> None:
    default = notes({})
    assert "Policies may not name their own Prometheus (allowedPrometheusUrls is empty)" in default
    assert "nothing until you set prometheus.url" in default
    assert "cachescale.dev/prometheus-credentials=true" in default
    assert "WARNING: allowedPrometheus" not in default
    assert "http://prom.monitoring:9090" in notes(
        {"prometheus": {"url": "http://prom.monitoring:9090"}}
    )
    limited = notes({"allowedPrometheusUrls": ALLOWED[:1]})
    assert "WARNING: allowedPrometheus" not in limited
    assert f"Prometheus only at: {ALLOWED[0]}" in limited
    anything = notes({"allowedPrometheusUrls": ["re:.*"]})
    assert "WARNING: allowedPrometheusUrls has re:.*" in anything


def test_insecure_tls_is_a_flag_only_when_allowed() -> None:
    assert "--allow-insecure-tls" not in args({})
    assert not build_parser().parse_args(args({})).allow_insecure_tls
    rendered = args({"prometheus": {"allowInsecureSkipVerify": True}})
    assert "--allow-insecure-tls" in rendered
    assert build_parser().parse_args(rendered).allow_insecure_tls
    assert "WARNING: prometheus.allowInsecureSkipVerify" in notes(
        {"prometheus": {"allowInsecureSkipVerify": True}}
    )
    assert "allowInsecureSkipVerify" in render_error(
        {"prometheus": {"allowInsecureSkipVerify": "yes"}}
    )


@pytest.mark.parametrize(
    "entry",
    ["prom:9090", "http://127.0.0.1:18080\\@prom:9090", "http://u@prom:9090", "http://p:1/ x"],
)
def test_an_allowed_url_an_http_client_could_read_otherwise_is_rejected(entry: str) -> None:
    assert "allowedPrometheusUrls" in render_error({"allowedPrometheusUrls": [entry]})


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
    assert "prometheus" in render_error({"prometheus": {"url": "http://a\\@prom:9090"}})
