"""The simulated engine's /metrics: vLLM's names, types, labels and buckets, consistent values."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachescale.sim.fleet import Fleet, RouterKind
from cachescale.sim.metrics import TTFT_BUCKETS_S, BucketCounts, token_buckets
from cachescale.sim.profiles import get_profile, usable_blocks
from cachescale.sim.traffic import Traffic
from cachescale.sim.traffic_spec import WorkloadSpec
from cachescale.sim.vllm_metrics import FINISHED_REASONS, VllmReplicaCollector


def scrape() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    fleet = Fleet(get_profile("llama3-8b-a100"), 32, RouterKind.ROUND_ROBIN, 0.0, 1)
    for request in Traffic(WorkloadSpec(rate_per_s=4), seed=5, until_s=60.0):
        fleet.route(request)
    fleet.advance_to(300.0)
    pod = fleet.pods[0]
    registry = CollectorRegistry(auto_describe=True)
    registry.register(VllmReplicaCollector(pod.engine, pod.series, "llama-3-8b"))
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    (only,) = samples[name].values()
    return only


def test_series_names_match_vllm() -> None:
    samples = scrape()
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:request_prefill_kv_computed_tokens_sum",
        "vllm:inter_token_latency_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:cache_config_info",
    ):
        assert name in samples, name
    labels = dict(next(iter(samples["vllm:prefix_cache_hits_total"])))
    assert labels == {"model_name": "llama-3-8b", "engine": "0"}
    reasons = {
        dict(k)["finished_reason"]: v for k, v in samples["vllm:request_success_total"].items()
    }
    assert list(reasons) == list(FINISHED_REASONS)  # all registered, as vLLM does at start
    assert reasons["stop"] > 0
    assert reasons["length"] == reasons["abort"] == reasons["error"] == reasons["repetition"] == 0


def test_values_are_consistent() -> None:
    samples = scrape()
    finished = sum(samples["vllm:request_success_total"].values())
    assert finished > 100
    assert value(samples, "vllm:time_to_first_token_seconds_count") == finished
    assert value(samples, "vllm:request_prefill_kv_computed_tokens_count") == finished
    queries = value(samples, "vllm:prefix_cache_queries_total")
    hits = value(samples, "vllm:prefix_cache_hits_total")
    assert 0 < hits < queries
    computed = value(samples, "vllm:request_prefill_kv_computed_tokens_sum")
    assert computed == queries - hits  # every admitted request has finished by t=300
    ttft_buckets = [
        float(dict(k)["le"]) for k in samples["vllm:time_to_first_token_seconds_bucket"]
    ]
    assert sorted(ttft_buckets) == [*TTFT_BUCKETS_S, float("inf")]


def test_bucket_counts_are_cumulative_and_le_inclusive() -> None:
    counts = BucketCounts((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        counts.observe(v)
    assert counts.cumulative() == [("1.0", 2.0), ("2.0", 3.0), ("+Inf", 4.0)]
    assert counts.total == 6.0


def test_token_buckets_follow_1_2_5_up_to_max_model_len() -> None:
    assert token_buckets(100) == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    assert token_buckets(8192)[-1] == 5000.0


def test_cache_config_counts_the_null_block_as_vllm_does() -> None:
    """vLLM's ``num_gpu_blocks`` is its whole pool, the null block included; the replica's
    pool is the blocks that hold KV, one fewer."""
    (labels,) = scrape()["vllm:cache_config_info"]
    config = dict(labels)
    engine_pool = Fleet(get_profile("llama3-8b-a100"), 32, RouterKind.ROUND_ROBIN, 0.0, 1)
    usable = engine_pool.pods[0].engine.num_blocks
    assert int(config["num_gpu_blocks"]) == usable + 1
    assert usable_blocks(int(config["num_gpu_blocks"])) == usable
