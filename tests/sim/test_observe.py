"""The simulated Prometheus: rate() and the gather layer's definitions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import pytest

from cachescale.sim.fleet import Fleet, Pod, RouterKind
from cachescale.sim.metrics import TTFT_BUCKETS_S, ReplicaSeries
from cachescale.sim.observe import ScrapedFleet
from cachescale.sim.profiles import get_profile
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest
from cachescale.sim.run import Simulation
from cachescale.sim.scenario import Scenario
from cachescale.sim.traffic import Traffic
from cachescale.sim.traffic_spec import WorkloadSpec
from cachescale.snapshot import EngineSignals, MetricsGeneration

AT = datetime(2026, 1, 1, tzinfo=UTC)
INF = math.inf

# --- hand-built pods ---------------------------------------------------------------------------


@dataclass
class FakeEngine:
    """The engine attributes the scraper reads, set by hand."""

    prefix_cache_queries_tokens: float = 0.0
    prefix_cache_hits_tokens: float = 0.0
    num_preemptions_total: float = 0.0
    prompt_tokens_total: float = 0.0
    generation_tokens_total: float = 0.0
    num_waiting: float = 0.0
    num_running: float = 0.0
    kv_usage: float = 0.0


def fake_pod(name: str, ready_s: float = 0.0) -> tuple[Pod, FakeEngine]:
    engine = FakeEngine()
    pod = Pod(
        name=name,
        engine=cast(EngineReplica, engine),
        series=ReplicaSeries(),
        created_s=min(ready_s, 0.0),
        ready_s=ready_s,
        gpus=1,
        revision=0,
    )
    return pod, engine


def finish_requests(pod: Pod, n: int) -> None:
    """Account ``n`` finished requests in the pod's series, as ``record_finished`` would:
    TTFT 0.05 s, 100 prompt tokens computed, 10 decode steps of 0.02 s each."""
    series = pod.series
    series.success_total += n
    series.ttft.observe(0.05, n)
    series.prefill_kv_computed.observe(100.0, n)
    series.inter_token_latency.observe(0.02, 10 * n)


@dataclass
class SteadyTraffic:
    """``per_s`` requests finish per second on ``pod`` from its readiness on, each looking
    up 1000 prompt tokens and finding 600 in the cache."""

    pod: Pod
    engine: FakeEngine
    per_s: float = 2.0
    done: int = 0

    def at(self, t: float) -> Pod:
        """The pod with its counters as of ``t``."""
        due = round(self.per_s * (t - self.pod.ready_s))
        new = due - self.done
        finish_requests(self.pod, new)
        self.engine.prefix_cache_queries_tokens += 1000.0 * new
        self.engine.prefix_cache_hits_tokens += 600.0 * new
        self.done = due
        return self.pod


def signals(scraped: ScrapedFleet, now_s: float, window_s: float = 300.0) -> EngineSignals:
    return scraped.signals(now_s, window_s, observed_at=AT)


def every_15s(start: float, stop: float) -> list[float]:
    return [start + 15.0 * i for i in range(int((stop - start) // 15.0) + 1)]


def scrape_steady(scraped: ScrapedFleet, traffic: SteadyTraffic, times: list[float]) -> None:
    for t in times:
        scraped.scrape([traffic.at(t)], t)


def test_steady_pod_reads_its_rates_ratios_and_quantiles() -> None:
    scraped = ScrapedFleet()
    pod, engine = fake_pod("engine-0")
    scrape_steady(scraped, SteadyTraffic(pod, engine), every_15s(0.0, 600.0))
    s = signals(scraped, 600.0)
    assert s.profile is MetricsGeneration.VLLM_0_13
    assert s.requests_per_second.value == pytest.approx(2.0)
    assert s.token_hit_rate_local.value == pytest.approx(0.6)
    # No KV connector: the external hits are exported at 0, so local + external is local.
    assert s.token_hit_rate_with_external.value == s.token_hit_rate_local.value
    assert s.request_full_hit_share.value == pytest.approx(1.0)  # 100 tokens computed each
    assert s.full_hit_max_computed_tokens == 200.0
    assert s.prefill_tokens_per_request.value == pytest.approx(100.0)
    # Every TTFT is 0.05 s, in the (0.04, 0.06] bucket: p50 is its middle.
    assert s.ttft_p50_seconds.value == pytest.approx(0.05)
    assert s.ttft_p99_seconds.value == pytest.approx(0.04 + 0.02 * 0.99)
    # Every step is 0.02 s, in (0.01, 0.025].
    assert s.itl_p95_seconds.value == pytest.approx(0.01 + 0.015 * 0.95)
    # 1 GPU over the 300 s window, 600 requests finished in it.
    assert s.gpu_seconds_per_1k_requests.value == pytest.approx(300 / 0.6)
    assert s.preemptions_per_second.value == 0.0
    assert s.notes == ()
    (only,) = s.pods
    assert only.age_seconds.value == 600.0
    assert only.token_hit_rate.value == pytest.approx(0.6)
    assert only.prompt_tokens_looked_up_per_second.value == pytest.approx(2000.0)


def test_pod_ready_mid_window_adds_its_share_of_the_window_not_its_current_rate() -> None:
    # Ready at 150 s, 2 req/s since, counters from 0: rate() extrapolates back only to the
    # counter's zero point, so over (0, 300] it reads 300 requests / 300 s.
    scraped = ScrapedFleet()
    pod, engine = fake_pod("engine-0", ready_s=150.0)
    scrape_steady(scraped, SteadyTraffic(pod, engine), every_15s(150.0, 300.0))
    assert signals(scraped, 300.0).requests_per_second.value == pytest.approx(1.0)


def test_series_starting_mid_window_is_extended_by_half_an_interval() -> None:
    # First sample 150 s after the window start (over 1.1 intervals), counter far from 0:
    # rate() extends the 150 s sampled by 7.5 s, and divides by the 300 s window.
    scraped = ScrapedFleet()
    pod, engine = fake_pod("engine-0")
    pod.series.success_total = 10_000
    scrape_steady(scraped, SteadyTraffic(pod, engine), every_15s(150.0, 300.0))
    expected = 300.0 * (150.0 + 7.5) / 150.0 / 300.0
    assert signals(scraped, 300.0).requests_per_second.value == pytest.approx(expected)


def test_a_gap_in_scrapes_uses_the_samples_that_exist() -> None:
    scraped = ScrapedFleet()
    pod, engine = fake_pod("engine-0")
    traffic = SteadyTraffic(pod, engine)
    engine.num_waiting = 1.0
    scrape_steady(scraped, traffic, every_15s(15.0, 150.0))  # 10 samples
    engine.num_waiting = 5.0
    engine.num_running = 7.0
    scrape_steady(scraped, traffic, every_15s(255.0, 300.0))  # 4; 165-240 s were lost
    s = signals(scraped, 300.0)
    assert s.requests_per_second.value == pytest.approx(2.0)
    assert s.token_hit_rate_local.value == pytest.approx(0.6)
    assert s.waiting_requests_per_pod.value == pytest.approx((10 * 1.0 + 4 * 5.0) / 14)
    assert s.running_requests_per_pod.value == pytest.approx(4 * 7.0 / 14)


def test_counter_reset_is_corrected_as_prometheus_does() -> None:
    # 100, 130, 160, reset, 10, 40: the increase is 40 − 100 + 160 = 100 over 60 s sampled,
    # extrapolated by 15 s to the start of the 75 s window.
    scraped = ScrapedFleet()
    pod, _ = fake_pod("engine-0")
    for t, total in zip((15.0, 30.0, 45.0, 60.0, 75.0), (100, 130, 160, 10, 40), strict=True):
        pod.series.success_total = total
        scraped.scrape([pod], t)
    s = signals(scraped, 75.0, window_s=75.0)
    assert s.requests_per_second.value == pytest.approx(100.0 * (60.0 + 15.0) / 60.0 / 75.0)


def test_pod_with_one_sample_contributes_nothing_and_says_why() -> None:
    scraped = ScrapedFleet()
    old, old_engine = fake_pod("engine-0")
    new, new_engine = fake_pod("engine-1", ready_s=300.0)
    traffic = SteadyTraffic(old, old_engine)
    scrape_steady(scraped, traffic, every_15s(15.0, 285.0))
    finish_requests(new, 50)  # on the new pod, but rate() needs a second sample to see them
    new_engine.prefix_cache_queries_tokens = 50_000.0
    new_engine.num_running = 4.0
    scraped.scrape([traffic.at(300.0), new], 300.0)
    s = signals(scraped, 300.0)
    assert s.requests_per_second.value == pytest.approx(2.0)
    by_name = {p.pod: p for p in s.pods}
    assert by_name["engine-0"].token_hit_rate.value == pytest.approx(0.6)
    reason = by_name["engine-1"].token_hit_rate.reason
    assert reason is not None
    assert reason.startswith("only 1 sample(s) of this pod in the window")
    assert by_name["engine-1"].prompt_tokens_looked_up_per_second.reason == reason
    assert by_name["engine-1"].running_requests.value == 4.0  # a gauge needs one sample
    assert by_name["engine-1"].age_seconds.value == 0.0
    assert s.running_requests_per_pod.value == pytest.approx(2.0)  # mean of 0 and 4


def test_only_single_samples_leave_every_rate_unknown_but_gauges_known() -> None:
    scraped = ScrapedFleet()
    pod, engine = fake_pod("engine-0")
    engine.num_running = 3.0
    engine.kv_usage = 0.25
    scraped.scrape([pod], 15.0)
    s = signals(scraped, 15.0)
    assert s.running_requests_per_pod.value == 3.0
    assert s.kv_cache_usage_ratio.value == 0.25
    unknown = dict(s.unknown_signals())
    assert "waiting_requests_per_pod" not in unknown
    for name in ("requests_per_second", "token_hit_rate_local", "ttft_p95_seconds"):
        assert unknown[name].startswith("only 1 sample(s) per series in the 300s window")


def test_starting_pod_exports_nothing() -> None:
    scraped = ScrapedFleet()
    starting, _ = fake_pod("engine-0", ready_s=1000.0)
    for t in every_15s(15.0, 300.0):
        scraped.scrape([starting], t)
    s = signals(scraped, 300.0)
    assert s.profile is None
    assert s.pods == ()
    assert s.running_requests_per_pod.reason is not None
    assert "has no data over the 300s window" in s.running_requests_per_pod.reason


def test_gone_pod_stops_exporting_and_is_no_longer_listed_by_kubernetes() -> None:
    scraped = ScrapedFleet()
    pod, engine = fake_pod("engine-0")
    scrape_steady(scraped, SteadyTraffic(pod, engine), every_15s(15.0, 150.0))
    pod.gone_s = 150.0
    for t in every_15s(165.0, 300.0):
        scraped.scrape([pod], t)
    s = signals(scraped, 300.0)
    (listed,) = s.pods
    assert listed.age_seconds.reason == "not among the pods the Kubernetes API listed (terminated?)"
    # 270 requests over 135 s sampled, extended by 15 s at the start, 7.5 s at the end.
    assert s.requests_per_second.value == pytest.approx(270.0 * (135 + 15 + 7.5) / 135 / 300)
    assert signals(scraped, 600.0).pods == ()


def test_no_traffic_is_a_measured_zero_rate_and_unknown_ratios() -> None:
    scraped = ScrapedFleet()
    pod, _ = fake_pod("engine-0")
    for t in every_15s(15.0, 300.0):
        scraped.scrape([pod], t)
    s = signals(scraped, 300.0)
    assert s.requests_per_second.value == 0.0
    assert s.preemptions_per_second.value == 0.0
    reasons = dict(s.unknown_signals())
    assert reasons["token_hit_rate_local"].startswith("no traffic")
    assert reasons["ttft_p95_seconds"] == "no traffic: no observations in the window"
    assert reasons["request_full_hit_share"] == "no requests finished in the window"
    assert reasons["prefill_tokens_per_request"] == "no requests finished in the window"
    assert reasons["gpu_seconds_per_1k_requests"].startswith("no requests finished")
    assert reasons["token_hit_rate_with_external"] == reasons["token_hit_rate_local"]
    (listed,) = s.pods
    assert listed.token_hit_rate.reason is not None


def test_requests_without_lookups_say_the_counter_did_not_move() -> None:
    scraped = ScrapedFleet()
    pod, _ = fake_pod("engine-0")
    for t in every_15s(15.0, 300.0):
        finish_requests(pod, 30)
        scraped.scrape([pod], t)
    reason = signals(scraped, 300.0).token_hit_rate_local.reason
    assert reason is not None
    assert "did not increase although requests finished" in reason


def test_time_must_advance_and_the_window_fit_the_retention() -> None:
    scraped = ScrapedFleet(retention_s=600.0)
    pod, _ = fake_pod("engine-0")
    scraped.scrape([pod], 15.0)
    with pytest.raises(ValueError, match="after one at"):
        scraped.scrape([pod], 15.0)
    with pytest.raises(ValueError, match="window"):
        signals(scraped, 15.0, window_s=900.0)


# --- a simulated fleet against its ground truth -------------------------------------------------
#
# Four warm pods at 6 req/s, scraped every 15 s up to 600 s. The window (300, 600] holds the
# samples at 315 ... 600 s; rate() extrapolates their 285 s to the 300 s window, i.e. reads
# "requests that finished in (315, 600]" / 285 s. Against the requests themselves, that is
# exact for everything counted per finished request; the token counters are counted at
# admission, which the requests do not record (arrival is used, see the tolerance there).


def test_cost_counts_every_pod_holding_gpus_for_its_part_of_the_window() -> None:
    """A pod still loading weights exports nothing but holds its GPU from creation, and a
    pod removed inside the window held its GPU until then: the cost counts both, each for
    the part of the window it existed, as kube-state-metrics' GPU requests show them."""
    scraped = ScrapedFleet()
    serving, engine = fake_pod("engine-0")
    traffic = SteadyTraffic(serving, engine)
    starting, _ = fake_pod("engine-1", ready_s=700.0)
    starting.created_s = 450.0
    leaving, _ = fake_pod("engine-2")
    for t in every_15s(0.0, 600.0):
        leaving.gone_s = 400.0 if t >= 400.0 else None
        pods = [traffic.at(t), leaving] + ([starting] if t >= starting.created_s else [])
        scraped.scrape(pods, t)
    s = signals(scraped, 600.0)
    assert [pod.pod for pod in s.pods] == ["engine-0", "engine-2"]  # engine-1 exports nothing
    # Over (300, 600]: 300 GPU-s serving, 150 starting, 100 leaving; 600 requests finished.
    assert s.requests_per_second.value == pytest.approx(2.0)
    assert s.gpu_seconds_per_1k_requests.value == pytest.approx((300 + 150 + 100) / 0.6)


SCRAPE_FROM_S = 315.0
NOW_S = 600.0


@pytest.fixture(scope="module")
def fleet_run() -> tuple[list[SimRequest], EngineSignals]:
    fleet = Fleet(get_profile("llama3-8b-a100"), 32, RouterKind.ROUND_ROBIN, 60.0, 4)
    scraped = ScrapedFleet()
    scrapes = iter(every_15s(15.0, NOW_S))
    next_scrape = next(scrapes)
    for request in Traffic(WorkloadSpec(rate_per_s=6.0), seed=11, until_s=NOW_S):
        while next_scrape <= request.arrival_s:
            fleet.advance_to(next_scrape)
            scraped.scrape(fleet.pods, next_scrape)
            next_scrape = next(scrapes)
        assert fleet.route(request)
    for t in (next_scrape, *scrapes):
        fleet.advance_to(t)
        scraped.scrape(fleet.pods, t)
    observed = scraped.signals(NOW_S, 300.0, observed_at=AT)
    fleet.advance_to(NOW_S + 600.0)  # the requests in flight at 600 s finish
    return fleet.finished, observed


def seen_finishing(finished: list[SimRequest]) -> list[SimRequest]:
    """The requests whose completion the window's counter increases cover."""
    return [r for r in finished if r.finished_s and SCRAPE_FROM_S < r.finished_s <= NOW_S]


def test_fleet_per_request_signals_equal_the_requests_that_finished(
    fleet_run: tuple[list[SimRequest], EngineSignals],
) -> None:
    finished, s = fleet_run
    seen = seen_finishing(finished)
    computed = [r.prompt_tokens - (r.cached_tokens or 0) for r in seen]
    full_hits = sum(1 for tokens in computed if tokens <= 200)
    assert len(seen) > 1000
    assert s.requests_per_second.value == pytest.approx(len(seen) / (NOW_S - SCRAPE_FROM_S))
    assert s.request_full_hit_share.value == pytest.approx(full_hits / len(seen))
    assert s.prefill_tokens_per_request.value == pytest.approx(sum(computed) / len(seen))
    assert s.gpu_seconds_per_1k_requests.value == pytest.approx(
        4 * 1000 / len(seen) * (NOW_S - SCRAPE_FROM_S)
    )
    assert [p.age_seconds.value for p in s.pods] == [NOW_S] * 4


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_fleet_ttft_quantile_lies_in_the_bucket_of_the_true_one(
    fleet_run: tuple[list[SimRequest], EngineSignals], q: float
) -> None:
    # histogram_quantile finds the bucket holding rank q × n and interpolates inside it, so
    # it must land in the bucket of the order statistic at that rank (an exact check), and
    # cannot be closer to it than the bucket width allows.
    finished, s = fleet_run
    ttfts = sorted(r.ttft_s or 0.0 for r in seen_finishing(finished))
    true = ttfts[math.ceil(q * len(ttfts)) - 1]
    observed = {0.5: s.ttft_p50_seconds, 0.95: s.ttft_p95_seconds, 0.99: s.ttft_p99_seconds}[q]
    assert observed.value is not None
    assert bucket_of(observed.value) == bucket_of(true)


def bucket_of(seconds: float) -> int:
    """Index of the TTFT bucket holding ``seconds`` (``le`` is inclusive)."""
    return next(i for i, bound in enumerate((*TTFT_BUCKETS_S, INF)) if seconds <= bound)


def test_fleet_token_hit_rate_matches_the_requests_looked_up(
    fleet_run: tuple[list[SimRequest], EngineSignals],
) -> None:
    # The counters move when a request is admitted; requests record only their arrival.
    # Admission follows arrival at once unless the request queues, and the pods queue
    # under a request each on average (waiting_requests_per_pod), so at most a few of the
    # ~1,700 requests straddle a window edge: 0.01 bounds the error (measured: < 0.002).
    finished, s = fleet_run
    looked_up = [r for r in finished if SCRAPE_FROM_S < r.arrival_s <= NOW_S]
    truth = sum(r.cached_tokens or 0 for r in looked_up) / sum(r.prompt_tokens for r in looked_up)
    assert s.waiting_requests_per_pod.value is not None
    assert s.waiting_requests_per_pod.value < 1.0
    assert s.token_hit_rate_local.value == pytest.approx(truth, abs=0.01)
    pooled = s.warm_token_hit_rate(min_age_seconds=0.0)
    assert pooled.value == pytest.approx(s.token_hit_rate_local.value)


def test_fleet_rate_is_the_window_rate_up_to_sampling(
    fleet_run: tuple[list[SimRequest], EngineSignals],
) -> None:
    # Against the whole window (300, 600] the only difference is the first 15 s, which
    # rate() does not see but extrapolates: at ~6 req/s that bin holds ~90 ± 10 requests,
    # i.e. ±0.6% of the window's ~1,800. 3% is several standard deviations.
    finished, s = fleet_run
    in_window = [r for r in finished if r.finished_s and NOW_S - 300.0 < r.finished_s <= NOW_S]
    assert s.requests_per_second.value == pytest.approx(len(in_window) / 300.0, rel=0.03)


# --- arrivals: the offered load, against the simulator's ground truth ----------------------


@pytest.mark.parametrize(
    ("rate_per_s", "client_timeout_s"),
    [(12.0, 20.0), (8.0, None)],
    ids=["timeouts", "growing-queue"],
)
def test_arrivals_estimate_matches_the_offered_load_under_saturation(
    rate_per_s: float, client_timeout_s: float | None
) -> None:
    # Two 8B pods serve about 6 req/s. With client timeouts the queue stays bounded and the
    # surplus is aborted; without, it grows: either way the estimate sees what arrived.
    scenario = Scenario.model_validate(
        {
            "name": "saturated",
            "description": "offered load above capacity",
            "duration_s": 600,
            "fleet": {
                "profile": "llama3-8b-a100",
                "max_num_seqs": 32,
                "replicas": 2,
                "pod_start_delay_s": 0,
                "router": "least_loaded",
            },
            "workload": {"rate_per_s": rate_per_s, "client_timeout_s": client_timeout_s},
        }
    )
    simulation = Simulation(scenario, None)
    scraped = ScrapedFleet()
    for t in range(15, 601, 15):
        simulation.advance_to(float(t))
        scraped.scrape(simulation.fleet.pods, float(t))
    snapshot = scraped.signals(600.0, 300.0, observed_at=AT)
    offered = sum(1 for a in simulation.arrivals_s if 300.0 < a <= 600.0) / 300.0
    estimate, served = snapshot.arrivals_per_second.value, snapshot.requests_per_second.value
    assert estimate is not None
    assert served is not None
    assert estimate == pytest.approx(offered, rel=0.05)
    assert served < 0.8 * offered
    assert bool(simulation.fleet.aborted) == (client_timeout_s is not None)
    assert all(r.first_token_s is None for r in simulation.fleet.aborted)
