"""Every signal's PromQL, run by a real Prometheus over synthetic series with known rates.

Each scenario lives under its own ``model_name`` in one TSDB; the evaluation time ``T`` is
the last sample. Rates are linear, so expected values are exact: hit rates, prefill per
request, histogram quantiles (interpolated inside the scraped buckets), GPU-seconds from
kube-state-metrics, and the unknowns of the honesty rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import Engine
from cachescale.decide import decide, words
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig, Series
from cachescale.gather.promql import build_queries
from cachescale.gather.reading import gather_signals
from cachescale.gather.report import SCRAPED_ONLY, Window, caveats, read_window
from cachescale.gather.selector import QueryScope, Selector, split_by_selector
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import SignalRequest, compute_signals
from cachescale.snapshot import EngineSignals, MetricsGeneration, Snapshot
from tests.decide.decide_builders import learned, spec, workload
from tests.gather.gather_dataset import AT, WINDOW_S


@pytest.fixture
def client(synthetic_prometheus: str) -> Iterator[PrometheusClient]:
    with PrometheusClient(PrometheusConfig(url=synthetic_prometheus, retries=0)) as c:
        yield c


def read(client: PrometheusClient, engine: Engine = Engine.VLLM, **selector: str) -> EngineSignals:
    request = SignalRequest(
        engine=engine,
        selector=Selector.of(selector),
        window_seconds=WINDOW_S,
        kube_state_metrics=True,
    )
    return gather_signals(client, request, AT)


def values(snapshot: EngineSignals) -> dict[str, float | None]:
    return {name: m.value for name, m in snapshot.signals().items()}


def test_arrivals_count_aborts_and_the_growing_queue(client: PrometheusClient) -> None:
    # Saturated: 2 req/s served, 0.5 req/s aborted, the queue grows by 0.1 req/s and the
    # batch stays full, so 2.6 req/s arrive.
    snapshot = read(client, namespace="llm", model_name="saturated")
    assert snapshot.requests_per_second.value == pytest.approx(2.0)
    assert snapshot.arrivals_per_second.value == pytest.approx(2.6)


def test_vllm_0_13_signals_are_exact(client: PrometheusClient) -> None:
    # GPU-seconds from kube-state-metrics: 2 GPUs held over the window by the old pod, 2
    # more at the last 30 s step by the new one: ~660 GPU-s for 600 requests. The fleet
    # GPU count is averaged over the subquery steps, so 2.x's closed range (11 steps)
    # and 3.x's left-open one (10) agree within 1%.
    snapshot = read(client, namespace="llm", model_name="steady")
    assert snapshot.profile is MetricsGeneration.VLLM_0_13
    assert values(snapshot) == pytest.approx(
        {
            "token_hit_rate_local": 0.8,
            "token_hit_rate_with_external": 0.9,
            "request_full_hit_share": 0.4,
            "prefill_tokens_per_request": 200.0,
            "ttft_p50_seconds": 0.3,
            "ttft_p95_seconds": 0.875,
            "ttft_p99_seconds": 0.975,
            "itl_p95_seconds": 0.095,
            "requests_per_second": 2.0,  # aborted requests are not successes
            "arrivals_per_second": 3.0,  # ...but they arrived: 2 + 1 aborted, queue flat
            "preemptions_per_second": 0.5,
            "waiting_requests_per_pod": 1.0,  # (2 + 0) / 2 pods
            "running_requests_per_pod": 7.0,  # (10 + 4) / 2 pods
            "kv_cache_usage_ratio": 0.3,
            "gpu_seconds_per_1k_requests": pytest.approx(1100.0, rel=0.01),
            "context_tokens_per_request": 600.0,  # (1000 prompt + 200 output tokens/s) / 2
        }
    )
    assert snapshot.full_hit_max_computed_tokens == 200.0


def test_a_pod_without_enough_samples_is_unknown_not_zero(client: PrometheusClient) -> None:
    snapshot = read(client, namespace="llm", model_name="steady")
    old, young = snapshot.pods
    assert (old.pod, young.pod) == ("steady-a", "steady-b")
    assert old.token_hit_rate.value == pytest.approx(0.8)
    assert old.age_seconds.value == pytest.approx(3600)
    assert young.token_hit_rate.value is None
    assert "only 1 sample(s) of this pod" in str(young.token_hit_rate.reason)
    assert young.age_seconds.value == pytest.approx(10)
    assert young.running_requests.value == 4
    assert snapshot.warm_token_hit_rate(600).value == pytest.approx(0.8)


def test_counter_reset_mid_window_is_absorbed_by_rate(client: PrometheusClient) -> None:
    snapshot = read(client, namespace="llm", model_name="reset")
    assert snapshot.token_hit_rate_local.value == pytest.approx(0.8)
    assert snapshot.requests_per_second.value == pytest.approx(2.0, rel=0.1)
    assert snapshot.prefill_tokens_per_request.value == pytest.approx(200.0)


def test_vllm_before_0_13_uses_the_fallback_formula_and_old_itl_name(
    client: PrometheusClient,
) -> None:
    snapshot = read(client, namespace="llm", model_name="legacy")
    assert snapshot.profile is MetricsGeneration.VLLM_0_9_2
    assert snapshot.prefill_tokens_per_request.value == pytest.approx((1000 - 800) / 2)
    assert snapshot.itl_p95_seconds.value == pytest.approx(0.095)
    assert snapshot.request_full_hit_share.value is None
    assert "vLLM 0.13" in str(snapshot.request_full_hit_share.reason)


def test_sglang_windowed_hit_rate_ignores_the_last_batch_gauge(client: PrometheusClient) -> None:
    snapshot = read(client, Engine.SGLANG, namespace="llm", model_name="sg")
    assert snapshot.profile is MetricsGeneration.SGLANG_0_5_20
    assert values(snapshot) == pytest.approx(
        {
            "token_hit_rate_local": 0.6,
            "token_hit_rate_with_external": 0.7,
            "request_full_hit_share": None,
            "prefill_tokens_per_request": 100.0,
            "ttft_p50_seconds": 0.3,
            "ttft_p95_seconds": 0.875,
            "ttft_p99_seconds": 0.975,
            "itl_p95_seconds": 0.095,
            "requests_per_second": 3.0,
            "arrivals_per_second": 3.0,
            "preemptions_per_second": 0.1,
            "waiting_requests_per_pod": 1.0,
            "running_requests_per_pod": 5.0,
            "kv_cache_usage_ratio": 0.4,
            "gpu_seconds_per_1k_requests": None,
            "context_tokens_per_request": pytest.approx(1300 / 3),
        }
    )


def test_nan_gauge_and_absent_series_are_unknown(client: PrometheusClient) -> None:
    snapshot = read(client, namespace="llm", model_name="nan")
    assert snapshot.kv_cache_usage_ratio.value is None
    assert "returned nan" in str(snapshot.kv_cache_usage_ratio.reason)
    assert snapshot.token_hit_rate_local.value == pytest.approx(0.5)
    assert "external_prefix_cache_hits_total has no data" in str(
        snapshot.token_hit_rate_with_external.reason
    )


def test_no_traffic_is_zero_requests_but_unknown_ratios(client: PrometheusClient) -> None:
    snapshot = read(client, namespace="llm", model_name="idle")
    assert snapshot.requests_per_second.value == 0
    assert snapshot.preemptions_per_second.value == 0
    assert str(snapshot.token_hit_rate_local.reason).startswith("no traffic")
    assert str(snapshot.ttft_p95_seconds.reason).startswith("no traffic")
    assert snapshot.gpu_seconds_per_1k_requests.value is None


def test_lookup_counter_flat_under_traffic_is_unknown_with_the_reason(
    client: PrometheusClient,
) -> None:
    snapshot = read(client, namespace="llm", model_name="nolookups")
    assert snapshot.requests_per_second.value == pytest.approx(2.0)
    assert snapshot.token_hit_rate_local.value is None
    assert re.search(
        r"did not increase although [0-9.]+ requests/s finished",
        str(snapshot.token_hit_rate_local.reason),
    )


def test_selector_matching_two_deployments_is_an_error_naming_them(
    client: PrometheusClient,
) -> None:
    with pytest.raises(AmbiguousSeriesError) as caught:
        read(client, namespace="twins")
    assert 'model_name="x"' in str(caught.value)
    assert 'model_name="y"' in str(caught.value)


def test_series_without_pod_label_give_fleet_signals_and_say_why_no_pods(
    client: PrometheusClient,
) -> None:
    snapshot = read(client, namespace="llm", model_name="nopod")
    assert snapshot.token_hit_rate_local.value == pytest.approx(0.8)
    assert snapshot.pods == ()
    assert "no 'pod' label" in str(snapshot.waiting_requests_per_pod.reason)


def test_injection_through_a_label_value_selects_nothing(client: PrometheusClient) -> None:
    snapshot = read(client, namespace="llm", model_name='steady"} or vector(1) or up{x="')
    assert snapshot.profile is None
    assert all(m.value is None for m in snapshot.signals().values())
    assert "no vLLM series match" in str(snapshot.token_hit_rate_local.reason)


def test_unknown_deployment_is_all_unknown(client: PrometheusClient) -> None:
    snapshot = read(client, namespace="llm", model_name="missing")
    assert snapshot.unknown_signals()
    assert len(snapshot.unknown_signals()) == len(snapshot.signals())


def test_shared_query_split_back_per_policy_equals_separate_queries(
    client: PrometheusClient,
) -> None:
    selectors = [Selector.of({"namespace": "llm", "model_name": m}) for m in ("steady", "reset")]
    queries = build_queries(MetricsGeneration.VLLM_0_13, QueryScope.shared(selectors), WINDOW_S)
    shared = client.query_many({k: q.promql for k, q in queries.items()}, AT)
    for selector in selectors:
        request = SignalRequest(Engine.VLLM, selector, WINDOW_S)
        detection = client.detect(Engine.VLLM, selector, AT)
        alone = gather_signals(client, request, AT)
        split = compute_signals(
            request, detection, queries, split_by_selector(shared, selector), AT
        )
        assert split == alone


def test_sglang_ttft_past_its_last_bucket_is_a_lower_bound_and_breaches(
    client: PrometheusClient,
) -> None:
    # 90% of first tokens over 400 s, SGLang's last finite bound: Prometheus answers 400
    # for p50, p95 and p99 alike; none of them is a value, each is "> 400 s".
    engine = read(client, Engine.SGLANG, namespace="llm", model_name="sgslow")
    for quantile in (engine.ttft_p50_seconds, engine.ttft_p95_seconds, engine.ttft_p99_seconds):
        assert quantile.value == pytest.approx(400.0)
        assert quantile.lower_bound
        assert words.latency(quantile) == "> 400 s"
    # The decision engine reads it as above the SLO, and says "> 400 s".
    decision = decide(spec(), Snapshot(engine, workload()), learned(), AT)
    (finding,) = [f for f in decision.findings if f.diagnosis is Diagnosis.SLO_AT_RISK]
    assert "TTFT p95 > 400 s above the 1.00 s SLO" in finding.evidence


def test_a_quantile_in_a_wide_bucket_carries_the_bucket(client: PrometheusClient) -> None:
    engine = read(client, namespace="llm", model_name="wide")
    assert engine.ttft_p95_seconds.value == pytest.approx(2368.0)
    assert engine.ttft_p95_seconds.bucket == (640.0, 2560.0)
    assert not engine.ttft_p95_seconds.lower_bound
    assert words.latency(engine.ttft_p95_seconds) == "2,368 s (bucket 640–2,560 s)"
    assert engine.ttft_p50_seconds.bucket == (160.0, 640.0)
    assert engine.itl_p95_seconds.bucket is None  # 0.095 in (0.05, 0.1]: not wide


def test_quantiles_in_narrow_buckets_are_plain_values(client: PrometheusClient) -> None:
    engine = read(client, namespace="llm", model_name="steady")
    p95 = engine.ttft_p95_seconds  # 0.875 in (0.5, 1]: exactly twice its lower bound
    assert p95.value == pytest.approx(0.875)
    assert (p95.lower_bound, p95.bucket) == (False, None)
    assert engine.ttft_p50_seconds.bucket == (0.1, 0.5)  # five times: stated


def _as_set(series: list[Series]) -> set[tuple[tuple[tuple[str, str], ...], str]]:
    """Label sets and values, comparable (NaN as text: NaN equals nothing)."""
    return {(tuple(sorted(s.labels.items())), repr(s.value)) for s in series}


@pytest.mark.parametrize(
    ("profile", "models", "ksm"),
    [
        (MetricsGeneration.VLLM_0_13, ("steady",), True),
        (MetricsGeneration.VLLM_0_13, ("steady", "reset", "nan", "idle", "wide", "nopod"), False),
        (MetricsGeneration.VLLM_0_9_2, ("legacy", "steady"), False),
        (MetricsGeneration.SGLANG_0_5_20, ("sg", "sgslow"), True),
    ],
)
def test_a_batch_in_one_request_answers_what_each_query_answers_alone(
    client: PrometheusClient, profile: MetricsGeneration, models: tuple[str, ...], ksm: bool
) -> None:
    selectors = [Selector.of({"namespace": "llm", "model_name": m}) for m in models]
    scope = (
        QueryScope.shared(selectors)
        if len(selectors) > 1
        else QueryScope.for_selector(selectors[0])
    )
    queries = {
        k: q.promql
        for k, q in build_queries(profile, scope, WINDOW_S, kube_state_metrics=ksm).items()
    }
    combined = client.query_many(queries, AT)
    alone = {key: client.query(promql, AT) for key, promql in queries.items()}
    assert {k: _as_set(v) for k, v in combined.items()} == {k: _as_set(v) for k, v in alone.items()}
    assert sum(map(len, alone.values())) > len(queries)  # the answers are not empty


def test_cost_counts_every_scheduled_pod_of_the_target(client: PrometheusClient) -> None:
    # scaling-a serves 600 requests over the window on 2 GPUs; scaling-b, of the rollout's
    # new ReplicaSet, loads weights all window (no engine series) on 2 more. The pending
    # pod and the other Deployment's pod hold none of the target's GPUs.
    snapshot = read(client, namespace="llm", model_name="scaling")
    assert snapshot.requests_per_second.value == pytest.approx(2.0)
    assert snapshot.gpu_seconds_per_1k_requests.value == pytest.approx(4 * 300 / 0.6)


def test_the_report_counts_starting_pods_only_with_kube_state_metrics(
    client: PrometheusClient,
) -> None:
    window = Window(AT - timedelta(seconds=WINDOW_S), AT, -WINDOW_S, 0.0)
    request = SignalRequest(
        Engine.VLLM, Selector.of({"namespace": "llm", "model_name": "scaling"}), WINDOW_S
    )
    held = read_window(client, replace(request, kube_state_metrics=True), window)
    assert held.replicas.value == pytest.approx(2.0)
    assert held.gpu_seconds_per_1k.value == pytest.approx(4 * 300 / 0.6)
    assert caveats(replace(request, kube_state_metrics=True)) == []
    scraped = read_window(client, replace(request, gpus_per_pod=2), window)
    assert scraped.replicas.value == pytest.approx(1.0)
    assert scraped.gpu_seconds_per_1k.value == pytest.approx(2 * 300 / 0.6)
    assert caveats(request) == [SCRAPED_ONLY]
