"""A real Prometheus scraping ``cachescale emulate``: the series are queryable per pod.

The emulator runs a short fixed-fleet scenario to its end and keeps serving the final
state; once Prometheus has scraped that state, every pod's cache counters read through
PromQL must equal the simulator's ground truth exactly, under the ``pod``/``namespace``
labels that only the scrape config supplies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import prometheus_fixture
from tests.polling import wait_for
from tests.prometheus_fixture import (
    JOB,
    PrometheusServer,
    fixed_fleet_scenario,
    prometheus_binary,
    run_emulator,
    run_prometheus,
)

PODS = 3


def assert_converges(prometheus: PrometheusServer, expected: dict[str, dict[str, float]]) -> None:
    """Poll each query until Prometheus returns ``expected`` per pod, else show the diff."""
    last: dict[str, dict[str, float]] = {}

    def matches() -> bool | None:
        last.update({promql: prometheus.by_pod(promql) for promql in expected})
        return last == expected or None

    try:
        wait_for(matches, timeout_s=15, what="Prometheus to scrape the final state")
    except AssertionError:
        assert last == expected


def engine_queries(engine: str, truth: dict[str, Any]) -> dict[str, dict[str, float]]:
    """PromQL for each engine's cache counters, with the values the truth says they hold."""
    pods = {name: pod for name, pod in truth["pods"].items() if pod["gone_s"] is None}

    def per_pod(field: str) -> dict[str, float]:
        return {name: float(pod[field]) for name, pod in pods.items()}

    if engine == "vllm":
        return {
            "vllm:prefix_cache_hits_total": per_pod("prefix_cache_hits_tokens"),
            "vllm:prefix_cache_queries_total": per_pod("prefix_cache_queries_tokens"),
            'sum by (pod) (vllm:request_success_total{finished_reason!="abort"})': per_pod(
                "finished_requests"
            ),
        }
    effective = "sglang:prefill_effective_tokens_total"
    return {
        f'{effective}{{mode="device_hit"}}': per_pod("prefix_cache_hits_tokens"),
        f'sum by (pod) ({effective}{{mode=~"input|device_hit"}})': per_pod(
            "prefix_cache_queries_tokens"
        ),
        "sglang:num_requests_total": per_pod("finished_requests"),
    }


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_prometheus_scrapes_every_pod_with_pod_and_namespace_labels(
    tmp_path: Path, engine: str
) -> None:
    prometheus_binary()
    scenario = fixed_fleet_scenario(replicas=PODS, duration_s=40)
    with (
        run_emulator(tmp_path, scenario, "--engine", engine, "--linger", "60", speed=10) as emu,
        run_prometheus(tmp_path, emu.file_sd) as prometheus,
    ):
        emu.wait_for_targets()
        pods = {f"{engine}-engine-{index}" for index in range(PODS)}
        targets = prometheus.wait_for_targets_up(pods)
        assert {target["labels"]["namespace"] for target in targets} == {"llm"}
        truth = emu.wait_until_done()
        expected = engine_queries(engine, truth)
        assert all(value > 0 for values in expected.values() for value in values.values())
        assert_converges(prometheus, expected)
        labels = prometheus.query(next(iter(expected)))[0]["metric"]
        assert labels["job"] == JOB
        assert labels["namespace"] == "llm"
        assert labels["model_name"] == "Llama-3-8B"
        assert labels["instance"].startswith("127.0.0.1:")


def test_a_missing_prometheus_skips_locally_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(prometheus_fixture, "PROMETHEUS", tmp_path / "no-prometheus")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y prometheus"):
        prometheus_binary()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        prometheus_binary()
