"""SGLang exposition of a simulated replica: names, labels, buckets, point-in-time gauges."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachescale.sim.run import Simulation
from cachescale.sim.scenario import Scenario
from cachescale.sim.sglang_metrics import (
    TTFT_BUCKETS_S,
    SglangReplicaCollector,
    SglangSeries,
)
from tests.prometheus_fixture import fixed_fleet_scenario


def fake_engine(queries: int, hits: int, preemptions: int) -> SimpleNamespace:
    return SimpleNamespace(
        prefix_cache_queries_tokens=queries,
        prefix_cache_hits_tokens=hits,
        num_preemptions_total=preemptions,
    )


def test_cache_hit_rate_is_the_last_steps_rate_and_holds_while_idle() -> None:
    series = SglangSeries()
    series.sample_engine(fake_engine(1000, 800, 0))
    assert series.last_batch_hit_rate == 0.8
    series.sample_engine(fake_engine(1500, 850, 2))
    assert series.last_batch_hit_rate == 0.1  # 50 of the 500 tokens admitted since
    assert series.last_retracted == 2
    series.sample_engine(fake_engine(1500, 850, 2))
    assert series.last_batch_hit_rate == 0.1  # nothing admitted: the gauge holds
    assert series.last_retracted == 0


def test_collector_exports_sglang_families_from_a_simulated_replica() -> None:
    simulation = Simulation(Scenario.model_validate(fixed_fleet_scenario(replicas=1)), None)
    simulation.advance_to(15.0)
    (pod,) = simulation.fleet.pods
    sglang = SglangSeries()
    for request in simulation.fleet.finished:
        sglang.record_finished(request)
    registry = CollectorRegistry()
    registry.register(SglangReplicaCollector(pod.engine, pod.series, sglang, "m"))
    families = {
        family.name: family
        for family in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert families["sglang:prefill_effective_tokens"].type == "counter"
    assert families["sglang:time_to_first_token_seconds"].type == "histogram"
    assert families["sglang:token_usage"].type == "gauge"
    modes = {s.labels["mode"] for s in families["sglang:prefill_effective_tokens"].samples}
    assert modes == {"input", "device_hit", "host_hit", "storage_hit"}
    running = families["sglang:num_running_reqs"].samples[0]
    assert running.labels == {
        "engine_type": "unified",
        "model_name": "m",
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    assert running.value == pod.engine.num_running
    ttft = families["sglang:time_to_first_token_seconds"].samples
    bounds = [float(s.labels["le"]) for s in ttft if s.name.endswith("_bucket")]
    assert bounds == [*TTFT_BUCKETS_S, float("inf")]
    count = next(s.value for s in ttft if s.name.endswith("_count"))
    assert count == len(simulation.fleet.finished) > 0
    assert {s.labels["is_streaming"] for s in ttft} == {"false"}
