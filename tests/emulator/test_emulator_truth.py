"""The ground-truth ledger: summaries, the trailing window, fleet totals."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cachescale.emulator.truth import COMPUTED_TOKEN_BOUNDS, PodTruth, ttft_summary
from prometheus_fixture import make_emulator, small_scenario


def test_ttft_summary_of_no_samples_is_unknown_not_zero() -> None:
    summary = ttft_summary([])
    assert summary == {
        "count": 0,
        "sum": 0.0,
        "mean": None,
        "p50": None,
        "p95": None,
        "p99": None,
        "max": None,
    }


def test_ttft_summary_quantiles() -> None:
    summary = ttft_summary([float(v) for v in range(1, 101)])
    assert summary["count"] == 100
    assert summary["p50"] == pytest.approx(50.5)
    assert summary["p95"] == pytest.approx(95.05)
    assert summary["max"] == 100.0


def finished(finished_s: float, ttft_s: float, prompt: int, cached: int) -> SimpleNamespace:
    return SimpleNamespace(
        arrival_s=finished_s - ttft_s - 1,
        finished_s=finished_s,
        ttft_s=ttft_s,
        prompt_tokens=prompt,
        cached_tokens=cached,
    )


def test_pod_ledger_counts_full_hits_and_forgets_old_ttfts() -> None:
    truth = PodTruth(SimpleNamespace())  # the pod is only read by snapshot()
    truth.record(finished(10.0, 0.5, prompt=1000, cached=992))  # computed 8
    truth.record(finished(20.0, 2.0, prompt=1000, cached=0))  # computed 1000
    assert truth.computed_at_most[COMPUTED_TOKEN_BOUNDS.index(10)] == 1
    assert truth.computed_at_most[COMPUTED_TOKEN_BOUNDS.index(1000)] == 2
    assert truth.recent_ttfts(since_s=15.0) == [2.0]
    assert truth.recent_ttfts(since_s=0.0) == [2.0]  # forgotten for good
    assert list(truth.ttft) == [0.5, 2.0]  # the cumulative view keeps everything


def test_fleet_totals_are_the_sum_of_every_pod_ever() -> None:
    emulator = make_emulator(small_scenario())
    try:
        emulator.advance_to(40.0)  # engine-0 is gone by now
        snapshot = emulator.truth_snapshot()
    finally:
        emulator.close()
    json.dumps(snapshot, allow_nan=False)
    pods, fleet = snapshot["pods"], snapshot["fleet"]
    assert pods["vllm-engine-0"]["gone_s"] is not None
    assert pods["vllm-engine-0"]["served"] is False
    for field in ("finished_requests", "prefix_cache_hits_tokens", "finished_computed_tokens"):
        assert fleet[field] == sum(pod[field] for pod in pods.values()) > 0
    assert fleet["ttft_s"]["count"] == fleet["finished_requests"]
    assert fleet["replicas"] == sum(pod["draining_since_s"] is None for pod in pods.values())
    for pod in pods.values():
        at_most = list(pod["finished_computed_tokens_at_most"].values())
        assert at_most == sorted(at_most)
        assert at_most[-1] <= pod["finished_requests"]
        assert pod["finished_computed_tokens"] == (
            pod["finished_prompt_tokens"] - pod["finished_cached_tokens"]
        )
