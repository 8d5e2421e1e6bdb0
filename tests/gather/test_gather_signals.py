"""The honesty rules: each way Prometheus can say "nothing" becomes unknown with a reason.

Pure tests feed ``compute_signals`` hand-made results; the fake-HTTP tests run the whole
``gather_signals`` path over a scripted server (empty vectors, NaN, two series).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from cachescale.api.spec import Engine
from cachescale.commands.signals_output import cache_config_line
from cachescale.gather.detection import Detection
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig, Series
from cachescale.gather.prometheus_errors import DeadlineReached
from cachescale.gather.promql import QueryKey, build_queries
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import QueryScope, Selector
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import SignalRequest, compute_signals, demand_from_result
from cachescale.snapshot import EngineCacheConfig, EngineSignals, Measured, MetricsGeneration, Unit
from tests.gather.gather_fakes import (
    HANG,
    FakePrometheus,
    HangAfter,
    api_error,
    fake_prometheus,
    parts_of,
    vector,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)
SELECTOR = Selector.of({"namespace": "llm", "model_name": "m"})
GROUP = {"namespace": "llm", "model_name": "m"}
REQUEST = SignalRequest(Engine.VLLM, SELECTOR, 300.0)


def fleet(value: float) -> list[Series]:
    return [Series(GROUP, value)]


def per_pod(**values: float) -> list[Series]:
    return [Series({**GROUP, "pod": pod}, value) for pod, value in values.items()]


def buckets(*rates: tuple[str, float]) -> list[Series]:
    """A ``sum by (..., le)`` result: ``(le, rate)`` per bucket."""
    return [Series({**GROUP, "le": le}, rate) for le, rate in rates]


TTFT = buckets(("0.1", 0.4), ("0.5", 1.6), ("1.0", 2.0), ("+Inf", 2.0))
"""p50 0.3 in (0.1, 0.5], p95 0.875 and p99 0.975 in (0.5, 1]."""
ITL = buckets(("0.01", 0.0), ("0.05", 1.0), ("0.1", 2.0), ("+Inf", 2.0))
"""p95 0.095 in (0.05, 0.1]."""
NO_OBSERVATIONS = buckets(("0.1", 0.0), ("0.5", 0.0), ("+Inf", 0.0))


def healthy() -> dict[QueryKey, list[Series]]:
    """One warm pod, 2 req/s, 80% token hits, 40% full hits."""
    return {
        QueryKey.HITS_LOCAL: fleet(800),
        QueryKey.HITS_EXTERNAL: fleet(0),
        QueryKey.LOOKED_UP: fleet(1000),
        QueryKey.REQUESTS: fleet(2),
        QueryKey.ARRIVALS: fleet(2.5),
        QueryKey.PREEMPTIONS: fleet(0),
        QueryKey.PREFILL_COMPUTED: fleet(400),
        QueryKey.COMPUTED_COUNT: fleet(2),
        QueryKey.COMPUTED_BUCKETS: [
            Series({**GROUP, "le": le}, v)
            for le, v in (("20.0", 0.2), ("200.0", 0.8), ("2000.0", 1.8), ("+Inf", 2.0))
        ],
        QueryKey.TTFT_BUCKETS: TTFT,
        QueryKey.ITL_BUCKETS: ITL,
        QueryKey.KV_USAGE: fleet(0.5),
        QueryKey.CONTEXT_TOKENS: fleet(2400),
        QueryKey.POD_SAMPLES: per_pod(a=21),
        QueryKey.POD_HITS: per_pod(a=800),
        QueryKey.POD_LOOKED_UP: per_pod(a=1000),
        QueryKey.POD_WAITING: per_pod(a=1),
        QueryKey.POD_RUNNING: per_pod(a=8),
        QueryKey.POD_KV_USAGE: per_pod(a=0.5),
    }


def compute(
    results: dict[QueryKey, list[Series]],
    request: SignalRequest = REQUEST,
    profile: MetricsGeneration = MetricsGeneration.VLLM_0_13,
) -> EngineSignals:
    queries = build_queries(
        profile,
        QueryScope.for_selector(request.selector),
        request.window_seconds,
        kube_state_metrics=request.kube_state_metrics,
    )
    return compute_signals(request, Detection(profile), queries, results, AT)


def test_healthy_results_are_all_known_but_cost_without_inputs() -> None:
    snapshot = compute(healthy())
    assert snapshot.unknown_signals() == [
        (
            "gpu_seconds_per_1k_requests",
            "needs GPUs per pod and the pods holding them (from the Deployment) or "
            "kube-state-metrics",
        )
    ]
    assert snapshot.request_full_hit_share.value == pytest.approx(0.4)
    assert snapshot.prefill_tokens_per_request.value == 200


def test_served_and_offered_load_are_separate_signals() -> None:
    # Saturated: 2 req/s served, 2.5 req/s arriving (aborts and a growing queue).
    snapshot = compute(healthy())
    assert snapshot.requests_per_second.value == 2
    assert snapshot.arrivals_per_second.value == 2.5


def test_arrivals_absent_or_too_few_samples_is_unknown_never_zero() -> None:
    absent = compute(healthy() | {QueryKey.ARRIVALS: []}).arrivals_per_second
    assert absent.value is None
    assert "vllm:request_success_total + vllm:num_requests_waiting" in str(absent.reason)
    few = compute(healthy() | {QueryKey.POD_SAMPLES: per_pod(a=1)}).arrivals_per_second
    assert few.value is None
    assert "only 1 sample(s)" in str(few.reason)


def test_demand_query_answer_replaces_the_estimate() -> None:
    queries = build_queries(MetricsGeneration.VLLM_0_13, QueryScope.for_selector(SELECTOR), 300)
    demand = Measured.known(7.0, Unit.REQUESTS_PER_SECOND)
    snapshot = compute_signals(
        REQUEST, Detection(MetricsGeneration.VLLM_0_13), queries, healthy(), AT, demand=demand
    )
    assert snapshot.arrivals_per_second.value == 7.0
    assert snapshot.requests_per_second.value == 2


@pytest.mark.parametrize(
    ("series", "fragment"),
    [
        ([], "returned no series"),
        ([Series({"route": "a"}, 1.0), Series({"route": "b"}, 2.0)], "returned 2 series"),
        ([Series({}, math.nan)], "returned nan"),
        ([Series({}, -1.0)], "returned -1.0"),
    ],
)
def test_demand_query_must_return_one_rate(series: list[Series], fragment: str) -> None:
    measured = demand_from_result(series)
    assert measured.value is None
    assert fragment in str(measured.reason)
    assert "metrics.demandQuery" in str(measured.reason)


def test_gpu_seconds_per_1k_from_kubernetes_inputs() -> None:
    # The incident's fleet: ~32 req/s on 2-GPU replicas; 10 replicas -> 625 GPU-s/1k.
    results = healthy() | {QueryKey.REQUESTS: fleet(32)}
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, gpus_per_pod=2, pods_holding_gpus=10)
    assert compute(results, request).gpu_seconds_per_1k_requests.value == pytest.approx(625)


def test_kube_state_metrics_gpu_seconds_win_over_the_deployment_count() -> None:
    # The Deployment says 10 pods now; kube-state-metrics saw 6 on average over the window
    # (4 were created near its end): the window's mean is the cost, not the last count.
    results = healthy() | {
        QueryKey.REQUESTS: fleet(32),
        QueryKey.GPU_SECONDS: fleet(2 * 6 * 300.0),
    }
    request = SignalRequest(
        Engine.VLLM,
        SELECTOR,
        300.0,
        gpus_per_pod=2,
        pods_holding_gpus=10,
        kube_state_metrics=True,
        pod_ages_seconds={"a": 600.0},
    )
    assert compute(results, request).gpu_seconds_per_1k_requests.value == pytest.approx(375)


def test_gpu_seconds_without_finished_requests_is_unknown_not_infinite() -> None:
    results = healthy() | {QueryKey.REQUESTS: fleet(0)}
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, gpus_per_pod=2, pods_holding_gpus=10)
    cost = compute(results, request).gpu_seconds_per_1k_requests
    assert cost.value is None
    assert "no requests finished" in str(cost.reason)


@pytest.mark.parametrize("key", [QueryKey.HITS_LOCAL, QueryKey.LOOKED_UP])
def test_absent_series_is_unknown_naming_the_series(key: QueryKey) -> None:
    snapshot = compute(healthy() | {key: []})
    reason = str(snapshot.token_hit_rate_local.reason)
    assert snapshot.token_hit_rate_local.value is None
    assert 'has no data for {model_name="m",namespace="llm"} over the 300s window' in reason


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_unknown(value: float) -> None:
    ttft = buckets(("0.1", 0.4), ("0.5", value), ("1.0", 2.0), ("+Inf", 2.0))
    snapshot = compute(healthy() | {QueryKey.TTFT_BUCKETS: ttft, QueryKey.KV_USAGE: fleet(value)})
    assert snapshot.kv_cache_usage_ratio.value is None
    assert f"returned {value}" in str(snapshot.kv_cache_usage_ratio.reason)
    assert snapshot.ttft_p99_seconds.value is None
    assert snapshot.ttft_p99_seconds.reason == (
        f"Prometheus returned {value} for vllm:time_to_first_token_seconds_bucket"
    )


def test_too_few_samples_makes_every_rate_unknown_but_keeps_gauges() -> None:
    snapshot = compute(healthy() | {QueryKey.POD_SAMPLES: per_pod(a=1)})
    assert snapshot.requests_per_second.value is None
    assert "only 1 sample(s) per series in the 300s window" in str(
        snapshot.requests_per_second.reason
    )
    assert snapshot.token_hit_rate_local.value is None
    assert snapshot.kv_cache_usage_ratio.value == 0.5
    assert snapshot.running_requests_per_pod.value == 8


def test_no_samples_at_all_is_all_unknown_with_the_profile() -> None:
    snapshot = compute(healthy() | {QueryKey.POD_SAMPLES: []})
    assert snapshot.profile is MetricsGeneration.VLLM_0_13
    assert len(snapshot.unknown_signals()) == len(snapshot.signals())


def test_requests_without_computed_histogram_increase_is_unknown() -> None:
    snapshot = compute(healthy() | {QueryKey.COMPUTED_COUNT: fleet(0)})
    assert "did not increase although 2 requests/s finished" in str(
        snapshot.request_full_hit_share.reason
    )
    assert snapshot.prefill_tokens_per_request.reason == "no requests finished in the window"


def test_full_hit_share_reads_the_highest_bound_under_the_threshold() -> None:
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, full_hit_max_computed_tokens=150)
    snapshot = compute(healthy(), request)
    assert snapshot.full_hit_max_computed_tokens == 20
    assert snapshot.request_full_hit_share.value == pytest.approx(0.1)
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, full_hit_max_computed_tokens=10)
    assert "no bucket bound" in str(compute(healthy(), request).request_full_hit_share.reason)


def test_negative_fallback_prefill_is_unknown() -> None:
    results = healthy() | {QueryKey.PREFILL_COMPUTED: fleet(-50)}
    snapshot = compute(results, profile=MetricsGeneration.VLLM_0_9_2)
    assert snapshot.prefill_tokens_per_request.value is None
    assert "negative" in str(snapshot.prefill_tokens_per_request.reason)


def test_two_series_where_one_is_expected_is_an_error_naming_both() -> None:
    twins = [Series(GROUP, 1.0), Series({**GROUP, "namespace": "other"}, 2.0)]
    with pytest.raises(AmbiguousSeriesError) as caught:
        compute(healthy() | {QueryKey.REQUESTS: twins})
    message = str(caught.value)
    assert 'namespace="llm"' in message
    assert 'namespace="other"' in message
    assert "matches 2 series of vllm:request_success_total" in message


def test_two_series_for_one_pod_is_an_error() -> None:
    pod_twice = [*per_pod(a=1), Series({**GROUP, "model_name": "n", "pod": "a"}, 2)]
    with pytest.raises(AmbiguousSeriesError):
        compute(healthy() | {QueryKey.POD_WAITING: pod_twice})


def test_pod_ages_from_kubernetes_inputs_and_warm_hit_rate() -> None:
    results = healthy() | {
        QueryKey.POD_SAMPLES: per_pod(a=21, b=21),
        QueryKey.POD_HITS: per_pod(a=900, b=100),
        QueryKey.POD_LOOKED_UP: per_pod(a=1000, b=1000),
    }
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, pod_ages_seconds={"a": 3600, "b": 30})
    snapshot = compute(results, request)
    assert [p.age_seconds.value for p in snapshot.pods] == [3600, 30]
    assert snapshot.warm_token_hit_rate(600).value == pytest.approx(0.9)
    assert snapshot.warm_token_hit_rate(10).value == pytest.approx(0.5)
    assert snapshot.pods[1].waiting_requests.value is None


# --- the whole path over a scripted HTTP server --------------------------------------


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with fake_prometheus() as server:
        yield server


def gather(fake: FakePrometheus) -> EngineSignals:
    config = PrometheusConfig(url=fake.url, retries=0, timeout_seconds=2)
    with PrometheusClient(config) as client:
        return gather_signals(client, REQUEST, AT)


def detects_vllm_0_13(query: str) -> tuple[int, bytes] | None:
    if query.startswith("count by (__name__"):
        return vector(
            ({**GROUP, "__name__": "vllm:prefix_cache_queries_total"}, "1"),
            ({**GROUP, "__name__": "vllm:request_prefill_kv_computed_tokens_count"}, "1"),
        )
    return None


def test_empty_vectors_everywhere_are_all_unknown(fake: FakePrometheus) -> None:
    fake.respond = lambda q: detects_vllm_0_13(q) or vector()
    snapshot = gather(fake)
    assert snapshot.profile is MetricsGeneration.VLLM_0_13
    assert all(m.value is None for m in snapshot.signals().values())
    detection, batch = fake.queries  # every query of the evaluation in one request
    assert detection.startswith("count by (__name__")
    assert len(parts_of(batch)) == len(
        build_queries(MetricsGeneration.VLLM_0_13, QueryScope.for_selector(SELECTOR), 300)
    )


def test_nan_from_prometheus_is_never_a_number(fake: FakePrometheus) -> None:
    fake.respond = lambda q: (
        detects_vllm_0_13(q) or vector(({**GROUP, "pod": "a"} if "pod)" in q else GROUP, "NaN"))
    )
    snapshot = gather(fake)
    assert all(m.value is None for m in snapshot.signals().values())
    assert "returned nan" in str(snapshot.kv_cache_usage_ratio.reason)


def test_multiple_series_over_http_is_an_error(fake: FakePrometheus) -> None:
    fake.respond = lambda q: (
        detects_vllm_0_13(q)
        or vector(({"model_name": "a", "pod": "p"}, "1"), ({"model_name": "b", "pod": "p"}, "1"))
    )
    with pytest.raises(AmbiguousSeriesError):
        gather(fake)


def test_no_engine_series_skips_the_batch(fake: FakePrometheus) -> None:
    snapshot = gather(fake)
    assert snapshot.profile is None
    assert len(fake.queries) == 1
    assert "no vLLM series match" in str(snapshot.requests_per_second.reason)


DEMAND = 'sum(rate(gateway_requests_total{route="llm"}[5m]))'


def gather_with_demand(fake: FakePrometheus) -> EngineSignals:
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, demand_query=DEMAND)
    config = PrometheusConfig(url=fake.url, retries=0, timeout_seconds=2)
    with PrometheusClient(config) as client:
        return gather_signals(client, request, AT)


def test_demand_query_is_sent_verbatim_instead_of_the_estimate(fake: FakePrometheus) -> None:
    fake.respond = lambda q: (
        detects_vllm_0_13(q)
        or (vector(({}, "41.5")) if q == DEMAND else vector(({**GROUP, "pod": "a"}, "21")))
    )
    snapshot = gather_with_demand(fake)
    assert snapshot.arrivals_per_second.value == 41.5
    estimate = build_queries(MetricsGeneration.VLLM_0_13, QueryScope.for_selector(SELECTOR), 300)
    assert estimate[QueryKey.ARRIVALS].promql not in fake.queries


def test_a_rejected_demand_query_leaves_the_other_signals(fake: FakePrometheus) -> None:
    def respond(query: str) -> tuple[int, bytes]:
        if query == DEMAND:
            return api_error(400, "bad_data", "parse error")
        return detects_vllm_0_13(query) or vector(
            ({**GROUP, "pod": "a"} if "pod)" in query else GROUP, "21")
        )

    fake.respond = respond
    snapshot = gather_with_demand(fake)
    assert snapshot.arrivals_per_second.value is None
    assert "metrics.demandQuery failed" in str(snapshot.arrivals_per_second.reason)
    assert "HTTP 400 Bad Request (bad_data)" in str(snapshot.arrivals_per_second.reason)
    assert "parse error" not in str(snapshot.arrivals_per_second.reason)  # never the body
    assert snapshot.requests_per_second.value == 21


def test_one_deadline_covers_detection_batch_and_demand_query(fake: FakePrometheus) -> None:
    # Each slow answer alone is well within the budget, both together are not; the slack
    # between them leaves the batch round trip time on a busy machine.
    slow_s, budget_s = 1.8, 3

    def slow(query: str) -> tuple[int, bytes]:
        detection = detects_vllm_0_13(query)
        if detection is not None or query == DEMAND:
            time.sleep(slow_s)
        return detection or vector()

    fake.respond = slow
    request = SignalRequest(Engine.VLLM, SELECTOR, 300.0, demand_query=DEMAND)
    started = time.monotonic()
    config = PrometheusConfig(url=fake.url, retries=0, timeout_seconds=budget_s)
    with PrometheusClient(config) as client, pytest.raises(DeadlineReached) as caught:
        gather_signals(client, request, AT)
    assert time.monotonic() - started < 2 * slow_s  # the demand query was cut short
    assert "no answer within 3s: the deadline was reached after 3." in str(caught.value)
    assert DEMAND in fake.queries  # the third round trip started


def test_a_demand_query_cut_by_the_deadline_fails_the_gathering_not_only_arrivals(
    fake: FakePrometheus,
) -> None:
    fake.respond = lambda q: (
        HANG if q == DEMAND else detects_vllm_0_13(q) or vector(({**GROUP, "pod": "a"}, "21"))
    )
    with pytest.raises(DeadlineReached, match="the deadline was reached after"):
        gather_with_demand(fake)


def test_a_stall_mid_batch_is_a_timeout_with_the_time_spent_never_a_partial_snapshot(
    fake: FakePrometheus,
) -> None:
    fake.respond = HangAfter(3, lambda q: detects_vllm_0_13(q) or vector(({**GROUP}, "1")))
    started = time.monotonic()
    with pytest.raises(DeadlineReached) as caught:
        gather(fake)
    assert time.monotonic() - started < 2.3
    assert "no answer within 2s: the deadline was reached after 2." in str(caught.value)
    assert len(fake.queries) == 2  # the detection, then the batch: never retried


def test_unreadable_sample_count_is_not_reported_as_zero_samples() -> None:
    snapshot = compute(healthy() | {QueryKey.POD_SAMPLES: per_pod(a=math.nan)})
    reason = str(snapshot.requests_per_second.reason)
    assert snapshot.requests_per_second.value is None
    assert "0 sample" not in reason
    assert "sample count per series could not be read" in reason
    assert "returned nan for vllm:num_requests_running" in reason
    (pod,) = snapshot.pods
    assert "this pod's sample count could not be read" in str(pod.token_hit_rate.reason)


def test_nan_quantile_with_an_unknown_request_rate_is_not_called_no_traffic() -> None:
    snapshot = compute(
        healthy() | {QueryKey.REQUESTS: fleet(math.nan), QueryKey.TTFT_BUCKETS: NO_OBSERVATIONS}
    )
    reason = str(snapshot.ttft_p95_seconds.reason)
    assert "no traffic" not in reason
    assert "the request rate is unknown" in reason
    assert "returned nan for vllm:request_success_total" in reason


def test_each_empty_ratio_names_the_request_rate_seen() -> None:
    zero = compute(
        healthy() | {QueryKey.REQUESTS: fleet(0), QueryKey.TTFT_BUCKETS: NO_OBSERVATIONS}
    )
    assert zero.ttft_p95_seconds.reason == (
        "no traffic: no observations of vllm:time_to_first_token_seconds_bucket in the window"
    )
    busy = compute(
        healthy() | {QueryKey.TTFT_BUCKETS: NO_OBSERVATIONS, QueryKey.LOOKED_UP: fleet(0)}
    )
    assert "although 2 requests/s finished" in str(busy.ttft_p95_seconds.reason)
    assert "although 2 requests/s finished" in str(busy.token_hit_rate_local.reason)


def test_quantiles_are_computed_from_the_bucket_rates_and_qualified() -> None:
    snapshot = compute(healthy())
    p50, p95, p99 = snapshot.ttft_p50_seconds, snapshot.ttft_p95_seconds, snapshot.ttft_p99_seconds
    itl = snapshot.itl_p95_seconds
    assert [p50.value, p95.value, p99.value, itl.value] == pytest.approx([0.3, 0.875, 0.975, 0.095])
    assert p50.bucket == (0.1, 0.5)  # five times its lower edge: wide, stated
    assert (p95.bucket, p95.lower_bound) == (None, False)  # (0.5, 1]: exactly twice
    assert itl.bucket is None


def test_a_quantile_past_the_last_finite_bucket_is_that_bound_as_a_lower_bound() -> None:
    slow = buckets(("100.0", 0.1), ("400.0", 0.3), ("+Inf", 3.0))
    snapshot = compute(healthy() | {QueryKey.TTFT_BUCKETS: slow})
    assert snapshot.ttft_p95_seconds == Measured.quantile(400.0, Unit.SECONDS, lower_bound=True)


@pytest.mark.parametrize(
    ("ttft", "reason"),
    [
        (
            [],
            'vllm:time_to_first_token_seconds_bucket has no data for {model_name="m",'
            'namespace="llm"} over the 300s window',
        ),
        (
            buckets(("0.1", 1.0), ("0.5", 2.0)),
            'vllm:time_to_first_token_seconds_bucket has no le="+Inf" bucket for '
            '{model_name="m",namespace="llm"} over the 300s window: without the count of '
            "every observation there is no quantile",
        ),
        (
            buckets(("+Inf", 2.0)),
            'vllm:time_to_first_token_seconds_bucket has only its le="+Inf" bucket for '
            '{model_name="m",namespace="llm"}: no finite bound to place a quantile at',
        ),
    ],
)
def test_a_histogram_without_a_quantile_says_why(ttft: list[Series], reason: str) -> None:
    snapshot = compute(healthy() | {QueryKey.TTFT_BUCKETS: ttft})
    for quantile in (snapshot.ttft_p50_seconds, snapshot.ttft_p95_seconds):
        assert (quantile.value, quantile.reason) == (None, reason)
    assert snapshot.itl_p95_seconds.value == pytest.approx(0.095)  # its own histogram


def test_a_bound_written_two_ways_is_one_bucket() -> None:
    # Two pods' client versions render le=1 as "1" and "1.0"; sum by (le) keeps both
    # series and histogram_quantile adds them: rank 1.9 lies in (0.5, 1], not past it.
    ttft = buckets(("0.5", 1.0), ("1", 1.0), ("1.0", 1.0), ("+Inf", 2.0))
    snapshot = compute(healthy() | {QueryKey.TTFT_BUCKETS: ttft})
    assert snapshot.ttft_p95_seconds.value == pytest.approx(0.95)
    assert not snapshot.ttft_p95_seconds.lower_bound


def test_a_bucket_bound_that_is_no_number_is_skipped() -> None:
    snapshot = compute(healthy() | {QueryKey.TTFT_BUCKETS: [*TTFT, *buckets(("fast", 9.0))]})
    assert snapshot.ttft_p95_seconds.value == pytest.approx(0.875)


def cache_config_series(pod: str, **labels: str) -> Series:
    return Series({**GROUP, "pod": pod, **labels}, 1.0)


def test_cache_config_is_read_per_engine_and_absent_labels_stay_unknown() -> None:
    results = healthy() | {
        QueryKey.POD_CACHE_CONFIG: [
            cache_config_series(
                "a",
                prefix_caching_hash_algo="xxhash",
                enable_prefix_caching="True",
                block_size="16",
            ),
            cache_config_series("b", enable_prefix_caching="False"),  # an older vLLM
        ]
    }
    config = compute(results).cache_config
    assert config.engines == (
        EngineCacheConfig("a", "xxhash", True, 16),
        EngineCacheConfig("b", None, False, None),
    )
    assert cache_config_line(config) == (
        "cache config: hash not exported, prefix caching OFF, block size ? (1 engine); "
        "xxhash, prefix caching on, block size 16 (1 engine)"
    )


def test_cache_config_absent_or_sglang_is_unknown_with_the_reason() -> None:
    absent = compute(healthy()).cache_config
    assert (
        absent.reason == 'vllm:cache_config_info has no data for {model_name="m",namespace="llm"}'
    )
    sglang = compute(healthy(), profile=MetricsGeneration.SGLANG_0_5_20).cache_config
    assert sglang.reason is not None
    assert sglang.reason.startswith("SGLang exports no cache configuration metric")
    assert cache_config_line(sglang).startswith("cache config: unknown: SGLang exports no")
