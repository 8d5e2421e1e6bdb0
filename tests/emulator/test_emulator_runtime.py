"""The emulator in-process: what each pod serves, as simulated time advances and pods change.

These drive ``Emulator.advance_to`` directly (no wall clock) and scrape the real HTTP
endpoints, parsing them with prometheus_client's own parser.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cachescale.emulator.runtime import Emulator
from cachescale.emulator.targets import Target
from cachescale.sim.metrics import TTFT_BUCKETS_S
from cachescale.sim.sglang_metrics import TTFT_BUCKETS_S as SGLANG_TTFT_BUCKETS_S
from tests.prometheus_fixture import (
    fixed_fleet_scenario,
    free_port_block,
    http_get,
    make_emulator,
    refuses_connections,
    small_scenario,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    # Fixed ports outside the ephemeral range: a closed pod's port is not reused at once.
    emulator = make_emulator(small_scenario(), base_port=free_port_block(16))
    yield emulator
    emulator.close()


def scrape(target: Target) -> Samples:
    """Every sample a pod serves, keyed by (name, labels)."""
    text = http_get(target.url).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample called ``name`` whose labels include ``labels``."""
    matches = [v for (n, got), v in samples.items() if n == name and labels.items() <= got]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def bucket_bounds(samples: Samples, name: str) -> list[float]:
    return sorted(
        float(dict(labels)["le"])
        for n, labels in samples
        if n == f"{name}_bucket" and dict(labels)["le"] != "+Inf"
    )


def served_pods(emulator: Emulator) -> set[str]:
    now = emulator.simulation.now_s
    return {
        f"vllm-{pod.name}"
        for pod in emulator.simulation.fleet.pods
        if pod.ready_s <= now and pod.gone_s is None
    }


def test_each_ready_pod_serves_vllm_series_with_engine_labels_only(emulator: Emulator) -> None:
    emulator.advance_to(10.0)
    targets = emulator.targets()
    assert [t.pod for t in targets] == ["vllm-engine-0", "vllm-engine-1"]
    base = emulator.settings.base_port
    assert base is not None
    assert [t.address for t in targets] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    for target in targets:
        samples = scrape(target)
        names = {name for name, _ in samples}
        for expected in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:num_preemptions_total",
            "vllm:request_success_total",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:request_prefill_kv_computed_tokens_count",
        ):
            assert expected in names
        assert not [name for name in names if name.endswith("_created")]
        label_names = {key for _, labels in samples for key, _ in labels}
        assert "pod" not in label_names
        assert "namespace" not in label_names
        assert value(samples, "vllm:prefix_cache_queries_total", model_name="test-model") > 0
        assert bucket_bounds(samples, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS_S)


def test_openmetrics_requests_still_get_the_colon_names(emulator: Emulator) -> None:
    emulator.advance_to(1.0)
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    request = urllib.request.Request(emulator.targets()[0].url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    assert "\nvllm:prefix_cache_hits_total{" in text
    assert "vllm_" not in text


def test_values_move_with_simulated_time_and_match_the_truth(emulator: Emulator) -> None:
    emulator.advance_to(5.0)
    target = emulator.targets()[0]
    early = scrape(target)
    emulator.advance_to(12.0)
    late = scrape(target)
    for name, labels in (
        ("vllm:prefix_cache_queries_total", {}),
        ("vllm:prompt_tokens_total", {}),
        ("vllm:request_success_total", {"finished_reason": "stop"}),
        ("vllm:time_to_first_token_seconds_count", {}),
    ):
        assert value(late, name, **labels) > value(early, name, **labels), name
    truth = emulator.truth_snapshot()
    pod = truth["pods"][target.pod]
    assert truth["sim_time_s"] == 12.0
    assert pod["served"] is True
    assert value(late, "vllm:prefix_cache_queries_total") == pod["prefix_cache_queries_tokens"]
    assert value(late, "vllm:prefix_cache_hits_total") == pod["prefix_cache_hits_tokens"]
    assert (
        value(late, "vllm:request_success_total", finished_reason="stop")
        == pod["finished_requests"]
    )
    assert value(late, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        pod["ttft_s"]["sum"]
    )
    assert (
        value(late, "vllm:request_prefill_kv_computed_tokens_sum")
        == pod["finished_computed_tokens"]
    )


def test_each_scrape_and_request_is_in_the_truth_as_served(emulator: Emulator) -> None:
    emulator.advance_to(12.0)
    target = emulator.targets()[0]
    samples = scrape(target)
    pod = emulator.truth_snapshot()["pods"][target.pod]
    served = pod["recent_scrapes"][-1]
    assert served["sim_time_s"] == 12.0
    assert served["finished_requests"] == value(samples, "vllm:time_to_first_token_seconds_count")
    assert served["prefix_cache_hits_tokens"] == value(samples, "vllm:prefix_cache_hits_total")
    assert served["waiting"] == value(samples, "vllm:num_requests_waiting")
    assert served["running"] == value(samples, "vllm:num_requests_running")
    assert served["kv_usage"] == value(samples, "vllm:kv_cache_usage_perc")
    requests = pod["recent_requests"]
    assert requests["first_index"] == 0  # all within the default 60 s window
    assert sum(requests["ttft_s"]) == pytest.approx(
        value(samples, "vllm:time_to_first_token_seconds_sum")
    )
    steps = [tokens - 1 for tokens in requests["output_tokens"]]
    observed = sum(itl * n for itl, n in zip(requests["itl_s"], steps, strict=True) if n)
    assert sum(steps) == value(samples, "vllm:inter_token_latency_seconds_count")
    assert observed == pytest.approx(value(samples, "vllm:inter_token_latency_seconds_sum"))


def test_servers_follow_the_fleet_as_it_scales_and_rolls(emulator: Emulator) -> None:
    added: set[str] = set()
    removed: list[Target] = []
    for t_s in range(0, 91, 3):
        changes = emulator.advance_to(float(t_s))
        added |= {target.pod for target in changes.added}
        removed += changes.removed
        assert {target.pod for target in emulator.targets()} == served_pods(emulator)
    assert {"vllm-engine-2", "vllm-engine-9"} <= added  # a scale-up and the rollout
    assert "vllm-engine-0" in {target.pod for target in removed}  # the scale-down
    for target in removed:
        assert refuses_connections(target.address), target
    for target in emulator.targets():
        assert scrape(target)


def test_sglang_mode_serves_sglang_series_built_from_the_same_engine() -> None:
    emulator = make_emulator(fixed_fleet_scenario(replicas=2), engine="sglang")
    try:
        emulator.advance_to(20.0)
        truth = emulator.truth_snapshot()["pods"]
        for target in emulator.targets():
            samples = scrape(target)
            pod = truth[target.pod]
            names = {name for name, _ in samples}
            assert not [name for name in names if name.startswith("vllm:")]
            scheduler = {
                "engine_type": "unified",
                "model_name": "test-model",
                "tp_rank": "0",
                "pp_rank": "0",
                "moe_ep_rank": "0",
            }
            effective = "sglang:prefill_effective_tokens_total"
            hits = value(samples, effective, mode="device_hit", **scheduler)
            computed = value(samples, effective, mode="input", **scheduler)
            assert hits == pod["prefix_cache_hits_tokens"] > 0
            assert computed + hits == pod["prefix_cache_queries_tokens"]
            assert value(samples, effective, mode="host_hit") == 0
            assert (
                value(samples, "sglang:num_requests_total", is_streaming="false")
                == pod["finished_requests"]
            )
            assert (
                value(samples, "sglang:cached_tokens_total", cache_source="device")
                == pod["finished_cached_tokens"]
            )
            assert 0 <= value(samples, "sglang:cache_hit_rate") <= 1
            assert bucket_bounds(samples, "sglang:time_to_first_token_seconds") == list(
                SGLANG_TTFT_BUCKETS_S
            )
            assert (
                value(samples, "sglang:time_to_first_token_seconds_count")
                == pod["finished_requests"]
            )
    finally:
        emulator.close()


def test_close_stops_every_server(emulator: Emulator) -> None:
    emulator.advance_to(1.0)
    targets = emulator.targets()
    changes = emulator.close()
    assert sorted(changes.removed) == targets
    assert emulator.targets() == []
    assert all(refuses_connections(target.address) for target in targets)
