"""The ground-truth ledger: summaries, the trailing window, request and scrape logs, totals."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import cast

import pytest

from cachescale.emulator.truth import COMPUTED_TOKEN_BOUNDS, PodTruth, ttft_summary
from cachescale.sim.fleet import Pod
from cachescale.sim.request import SimRequest
from tests.prometheus_fixture import make_emulator, small_scenario


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


def finished(
    finished_s: float, ttft_s: float, prompt: int, cached: int, output: int = 5
) -> SimRequest:
    """A finished request: first token ``ttft_s`` after arrival, then one token a second."""
    first_token_s = finished_s - (output - 1)
    return SimRequest(
        request_id=0,
        arrival_s=first_token_s - ttft_s,
        tenant="t",
        prefix_group=0,
        prompt_tokens=prompt,
        output_tokens=output,
        block_hashes=[],
        cached_tokens=cached,
        first_token_s=first_token_s,
        finished_s=finished_s,
    )


def fake_engine(**values: float) -> SimpleNamespace:
    """An engine reporting ``values`` and zeros for its other counters and gauges."""
    names = (
        "prefix_cache_queries_tokens",
        "prefix_cache_hits_tokens",
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_preemptions_total",
        "num_waiting",
        "num_running",
        "kv_usage",
    )
    return SimpleNamespace(**(dict.fromkeys(names, 0) | values))


def fake_pod(engine: SimpleNamespace | None = None) -> Pod:
    """A one-GPU pod, ready from time 0, on ``engine`` (what the ledger reads of a pod)."""
    pod = SimpleNamespace(
        name="engine-0",
        created_s=0.0,
        ready_s=0.0,
        draining_since_s=None,
        gone_s=None,
        gpus=1,
        engine=engine or fake_engine(),
        gpu_seconds_between=lambda start_s, end_s: end_s - start_s,
    )
    return cast(Pod, pod)


def test_pod_ledger_counts_full_hits_and_forgets_old_requests() -> None:
    truth = PodTruth(fake_pod(), window_sim_s=5.0)
    truth.record(finished(10.0, 0.5, prompt=1000, cached=992))  # computed 8
    truth.record(finished(20.0, 2.0, prompt=1000, cached=0))  # computed 1000
    assert truth.computed_at_most[COMPUTED_TOKEN_BOUNDS.index(10)] == 1
    assert truth.computed_at_most[COMPUTED_TOKEN_BOUNDS.index(1000)] == 2
    assert truth.recent_ttfts() == [2.0]  # the first finished more than 5 s earlier
    assert list(truth.ttft) == [0.5, 2.0]  # the cumulative view keeps everything


def test_recent_requests_carry_their_index_and_what_the_histograms_observed() -> None:
    truth = PodTruth(fake_pod(), window_sim_s=5.0)
    truth.record(finished(10.0, 0.5, prompt=1000, cached=992))
    truth.record(finished(20.0, 2.0, prompt=900, cached=100, output=5))
    truth.record(finished(21.0, 1.5, prompt=800, cached=0, output=1))
    requests = truth.snapshot(now_s=22.0, served=True)["recent_requests"]
    assert requests == {
        "first_index": 1,  # the first request (index 0) left the window
        "finished_s": [20.0, 21.0],
        "ttft_s": [2.0, 1.5],
        "itl_s": [1.0, None],  # 4 decode steps in 4 s; a one-token reply has none
        "prompt_tokens": [900, 800],
        "cached_tokens": [100, 0],
        "output_tokens": [5, 1],
    }


def test_each_scrape_is_noted_with_the_state_it_exported() -> None:
    engine = fake_engine(prefix_cache_hits_tokens=30, num_waiting=2, kv_usage=0.25)
    truth = PodTruth(fake_pod(engine), window_sim_s=10.0)
    truth.record_scrape(now_s=1.0, wall_time_s=1000.0)
    engine.prefix_cache_hits_tokens, engine.num_waiting = 50, 0
    truth.record(finished(3.0, 0.5, prompt=100, cached=50))
    truth.record_scrape(now_s=4.0, wall_time_s=1000.5)
    first, second = truth.snapshot(now_s=4.0, served=True)["recent_scrapes"]
    assert (first["wall_time_s"], first["sim_time_s"], first["gpu_seconds"]) == (1000.0, 1.0, 1.0)
    assert (first["prefix_cache_hits_tokens"], first["waiting"]) == (30, 2)
    assert (first["finished_requests"], first["kv_usage"]) == (0, 0.25)
    assert (second["prefix_cache_hits_tokens"], second["waiting"]) == (50, 0)
    assert second["finished_requests"] == 1
    assert first["finished_computed_tokens_at_most"]["50"] == 0
    assert second["finished_computed_tokens_at_most"]["50"] == 1  # 100 - 50 computed
    truth.record_scrape(now_s=12.0, wall_time_s=1001.5)
    assert [s["sim_time_s"] for s in truth.scrapes] == [4.0, 12.0]  # 1.0 left the window


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
        requests = pod["recent_requests"]
        assert requests["first_index"] + len(requests["ttft_s"]) == pod["finished_requests"]
        at_most = list(pod["finished_computed_tokens_at_most"].values())
        assert at_most == sorted(at_most)
        assert at_most[-1] <= pod["finished_requests"]
        assert pod["finished_computed_tokens"] == (
            pod["finished_prompt_tokens"] - pod["finished_cached_tokens"]
        )
