"""The real query path end to end: ``cachescale emulate`` → Prometheus → ``gather_signals``.

The emulator runs a fixed two-pod fleet faster than real time; Prometheus scrapes it every
second. After a warm-up, the signals read over a wall-clock window must match the
simulator's ground truth differenced over the same window: token and request hit rates
within 0.02, rates and cost within 5%, TTFT quantiles inside the histogram bucket that
holds the true quantile (or its neighbour, when the true value sits on a bound).
"""

from __future__ import annotations

import bisect
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cachescale.api.spec import Engine
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from cachescale.gather.promql import Selector
from cachescale.gather.signals import SignalRequest, gather_signals
from cachescale.sim import sglang_metrics
from cachescale.sim.metrics import TTFT_BUCKETS_S
from cachescale.snapshot import EngineSignals
from prometheus_fixture import (
    fixed_fleet_scenario,
    prometheus_binary,
    run_emulator,
    run_prometheus,
)

SPEED = 8.0
WARMUP_S = 6.0
"""Wall seconds before the window opens: caches warm up, the first scrapes land."""
WINDOW_S = 12.0
PODS = 2
GPUS_PER_POD = 1
INGEST_LAG_S = 2.0
"""Evaluate this long in the past, so Prometheus holds the window's last scrape."""
NEAR_BOUND = 0.05
BUCKETS = {"vllm": TTFT_BUCKETS_S, "sglang": sglang_metrics.TTFT_BUCKETS_S}


def collect_truth(emulator: Any, until_wall_s: float) -> list[dict[str, Any]]:
    """Every ground-truth snapshot rewritten until ``until_wall_s`` (Unix time)."""
    snapshots: list[dict[str, Any]] = []
    while time.time() < until_wall_s:
        if emulator.truth_file.exists():
            truth = emulator.truth()
            if not snapshots or truth["wall_time_s"] > snapshots[-1]["wall_time_s"]:
                snapshots.append(truth)
        time.sleep(0.05)
    return snapshots


def nearest(snapshots: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    return min(snapshots, key=lambda s: abs(s["wall_time_s"] - wall_s))


def delta(start: dict[str, Any], end: dict[str, Any], field: str) -> float:
    return float(end["fleet"][field] - start["fleet"][field])


def computed_at_most_200(snapshot: dict[str, Any]) -> int:
    return sum(pod["finished_computed_tokens_at_most"]["200"] for pod in snapshot["pods"].values())


def quantile_range(true: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    """Where ``histogram_quantile`` may put a quantile whose true value is ``true``: the
    bucket ``(lower, upper]`` holding it, widened by the neighbouring bucket when ``true``
    lies within 5% of a bound (the window's edges differ by up to one scrape, so the
    empirical CDF may cross the quantile just on the other side of that bound)."""
    index = bisect.bisect_left(bounds, true)
    lower = bounds[index - 1] if index else 0.0
    upper = bounds[index]
    if upper - true < NEAR_BOUND * upper and index + 1 < len(bounds):
        upper = bounds[index + 1]
    if index and true - lower < NEAR_BOUND * lower:
        lower = bounds[index - 2] if index > 1 else 0.0
    return lower, upper


def read_signals(url: str, engine: str, at: float) -> EngineSignals:
    request = SignalRequest(
        engine=Engine(engine),
        selector=Selector.of({"namespace": "llm"}),
        window_seconds=WINDOW_S,
        gpus_per_pod=GPUS_PER_POD,
        ready_replicas=PODS,
    )
    with PrometheusClient(PrometheusConfig(url=url)) as client:
        return gather_signals(client, request, datetime.fromtimestamp(at, UTC))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_signals_match_the_simulators_ground_truth(tmp_path: Path, engine: str) -> None:
    prometheus_binary()
    sim_s = (WARMUP_S + WINDOW_S + INGEST_LAG_S + 4) * SPEED
    scenario = fixed_fleet_scenario(replicas=PODS, duration_s=sim_s)
    flags = ("--engine", engine, "--linger", "30", "--ground-truth-window", f"{WINDOW_S:g}s")
    with (
        run_emulator(tmp_path, scenario, *flags, speed=SPEED) as emulator,
        run_prometheus(tmp_path, emulator.file_sd) as prometheus,
    ):
        emulator.wait_for_targets()
        prometheus.wait_for_targets_up({f"{engine}-engine-{i}" for i in range(PODS)})
        opened = time.time() + WARMUP_S
        at = opened + WINDOW_S
        truths = collect_truth(emulator, at + INGEST_LAG_S)
        snapshot = read_signals(prometheus.url, engine, at)

    start, end = nearest(truths, at - WINDOW_S), nearest(truths, at)
    wall = end["wall_time_s"] - start["wall_time_s"]
    finished = delta(start, end, "finished_requests")
    assert finished > 500, "too few requests in the window for a 5% comparison"

    hits = delta(start, end, "prefix_cache_hits_tokens")
    queries = delta(start, end, "prefix_cache_queries_tokens")
    assert snapshot.token_hit_rate_local.value == pytest.approx(hits / queries, abs=0.02)
    assert snapshot.requests_per_second.value == pytest.approx(finished / wall, rel=0.05)
    computed = delta(start, end, "finished_computed_tokens")
    assert snapshot.prefill_tokens_per_request.value == pytest.approx(computed / finished, rel=0.05)
    true_cost = 1000 * delta(start, end, "gpu_seconds") / finished  # simulated GPU-seconds
    cost = snapshot.gpu_seconds_per_1k_requests.value
    assert cost is not None
    assert cost * SPEED == pytest.approx(true_cost, rel=0.05)

    true_ttft = end["fleet"]["ttft_recent_s"]
    for name in ("p50", "p95", "p99"):
        measured = getattr(snapshot, f"ttft_{name}_seconds").value
        lower, upper = quantile_range(true_ttft[name], BUCKETS[engine])
        assert measured is not None
        assert lower <= measured <= upper, (name, measured, true_ttft[name])

    if engine == "vllm":
        full_hits = computed_at_most_200(end) - computed_at_most_200(start)
        assert snapshot.request_full_hit_share.value == pytest.approx(
            full_hits / finished, abs=0.02
        )
        assert snapshot.token_hit_rate_with_external.value is None  # no connector series
    else:
        assert snapshot.token_hit_rate_with_external.value == pytest.approx(
            hits / queries, abs=0.02
        )
    assert {pod.pod for pod in snapshot.pods} == {f"{engine}-engine-{i}" for i in range(PODS)}
    assert all(pod.token_hit_rate.value is not None for pod in snapshot.pods)
