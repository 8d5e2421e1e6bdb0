"""The operator's own metrics: the names the chart's rules and dashboard read, unknown
signals as absent series (never 0), and a deleted policy's series gone."""

from __future__ import annotations

import threading
import tracemalloc

from prometheus_client import generate_latest

from cachescale.controller.reconcile.metrics import OperatorMetrics
from cachescale.decide import decide
from cachescale.decide.learned import LearnedState
from tests.decide.decide_builders import learned, signals, snapshot, spec

HIT_RATE = "cachescale_token_hit_rate{"


def exposition(metrics: OperatorMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_a_decision_becomes_the_documented_series() -> None:
    metrics = OperatorMetrics()
    state = snapshot(signals(hit=0.04))
    memory = learned()
    for _ in range(3):
        decision = decide(spec(), state, memory, state.signals.observed_at)
        memory = decision.memory
    metrics.observe("llm", "vllm", spec(), state, decision)
    metrics.evaluated("llm", "vllm", 0.25, 1_700_000_000.0)
    text = exposition(metrics)
    labels = 'namespace="llm",policy="vllm"'
    for line in (
        f"cachescale_token_hit_rate{{{labels}}} 0.04",
        f"cachescale_gpu_seconds_per_1k_requests{{{labels}}} 680.0",
        f"cachescale_budget_gpu_seconds_per_1k_requests{{{labels}}} 780.0",
        f"cachescale_slo_ttft_p95_seconds{{{labels}}} 1.0",
        f"cachescale_replicas{{{labels}}} 11.0",
        f"cachescale_baseline_token_hit_rate{{{labels}}} 0.85",
        f"cachescale_baseline_prefill_tokens_per_request{{{labels}}} 400.0",
        f"cachescale_baseline_gpu_seconds_per_1k_requests{{{labels}}} 680.0",
        f'cachescale_alert_active{{{labels},reason="PrefixCollapse"}} 1.0',
        f'cachescale_alert_active{{{labels},reason="OverBudget"}} 0.0',
        f"cachescale_last_evaluation_timestamp_seconds{{{labels}}} 1.7e+09",
        "cachescale_evaluation_duration_seconds_count 1.0",
    ):
        assert line in text, line
    assert f'cachescale_decisions_total{{{labels},reason="{decision.reason}"}} 1.0' in text


def test_no_baseline_is_absent_not_zero() -> None:
    # A policy that has not learned what healthy looks like exports no baseline series.
    metrics = OperatorMetrics()
    state = snapshot(signals())
    decision = decide(spec(), state, LearnedState(), state.signals.observed_at)
    assert decision.memory.baseline.token_hit_rate is None
    metrics.observe("llm", "vllm", spec(), state, decision)
    text = exposition(metrics)
    assert "cachescale_baseline_token_hit_rate{" not in text
    assert "cachescale_baseline_gpu_seconds_per_1k_requests{" not in text
    assert HIT_RATE in text  # the policy's other series are there


def test_unknown_is_absent_and_deletion_forgets() -> None:
    metrics = OperatorMetrics()
    state = snapshot(signals(ttft_p95_seconds=None))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    metrics.observe("llm", "vllm", spec(), state, decision)
    metrics.failed("llm", "vllm", "PrometheusUnreachable")
    text = exposition(metrics)
    assert 'cachescale_ttft_p95_seconds{namespace="llm"' not in text
    assert 'cachescale_arrivals_per_second{namespace="llm"' not in text  # no estimate made
    labels = 'kind="PrometheusUnreachable",namespace="llm",policy="vllm"'  # sorted
    assert f"cachescale_evaluation_errors_total{{{labels}}} 1.0" in text
    metrics.forget("llm", "vllm")
    assert 'policy="vllm"' not in exposition(metrics)


def test_served_and_offered_load_side_by_side() -> None:
    metrics = OperatorMetrics()
    state = snapshot(signals(arrivals_per_second=41.0))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    metrics.observe("llm", "vllm", spec(), state, decision)
    text = exposition(metrics)
    labels = 'namespace="llm",policy="vllm"'
    assert f"cachescale_requests_per_second{{{labels}}} 32.0" in text
    assert f"cachescale_arrivals_per_second{{{labels}}} 41.0" in text


def test_the_schedulers_punctuality_is_fleet_wide() -> None:
    metrics = OperatorMetrics()
    metrics.started_late(0.3)
    metrics.started_late(12.0)
    metrics.missed_intervals(2)
    text = exposition(metrics)
    assert "cachescale_evaluation_lateness_seconds_count 2.0" in text
    assert 'cachescale_evaluation_lateness_seconds_bucket{le="0.5"} 1.0' in text
    assert "cachescale_evaluation_missed_intervals_total 2.0" in text
    metrics.forget("llm", "vllm")  # a policy's deletion leaves the fleet's series alone
    assert "cachescale_evaluation_missed_intervals_total 2.0" in exposition(metrics)


def observed_fleet(metrics: OperatorMetrics, policies: int) -> None:
    """Each of ``policies`` policies observed and evaluated twice, as in a steady state."""
    state = snapshot(signals(hit=0.04))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    for index in range(policies):
        for _ in range(2):
            metrics.observe("llm", f"policy-{index}", spec(), state, decision)
            metrics.evaluated("llm", f"policy-{index}", 0.1, 1_700_000_000.0)


def test_a_policys_series_cost_a_few_kib_not_a_child_each() -> None:
    """About twenty series per policy: a record per policy, not a ``prometheus_client``
    child per series (the bound below)."""
    tracemalloc.start()
    try:
        metrics = OperatorMetrics()
        observed_fleet(metrics, 1_000)
        traced, _ = tracemalloc.get_traced_memory()  # while ``metrics`` holds its series
    finally:
        tracemalloc.stop()
    assert traced / 1_000 < 4 * 1024


def test_a_scrape_during_evaluations_sees_whole_records() -> None:
    """The exposition thread reads while evaluations add and forget policies."""
    metrics = OperatorMetrics()
    observed_fleet(metrics, 50)
    done = threading.Event()

    def churn() -> None:
        while not done.is_set():
            observed_fleet(metrics, 60)
            for index in range(50, 60):
                metrics.forget("llm", f"policy-{index}")

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(20):
            text = exposition(metrics)
            hit_rates = [line for line in text.splitlines() if line.startswith(HIT_RATE)]
            assert len(hit_rates) >= 50
            assert all(line.endswith(" 0.04") for line in hit_rates)
    finally:
        done.set()
        worker.join()
