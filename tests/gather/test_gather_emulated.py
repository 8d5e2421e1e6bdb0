"""The real query path end to end: ``cachescale emulate`` → Prometheus → ``gather_signals``.

The emulator runs a fixed two-pod fleet faster than real time; Prometheus scrapes it every
second. After a warm-up, every signal read over a wall-clock window is compared with the
simulator's ground truth over exactly the samples Prometheus used: the test reads each
pod's raw TTFT ``_count`` samples in the window, matches every sample to the scrape that
produced it (the ground truth notes each scrape with the counters and gauges it exported),
and takes the requests counted between the pod's first and last sample. Against that:

- token hit rates, fleet and per pod, and the full-hit share within 0.02; req/s, prefill
  and context tokens per request, preemptions/s and GPU-s/1k within 5%;
- TTFT p50/p95/p99 and ITL p95 inside the histogram bucket ``(lower, upper]`` holding the
  true quantile. ``histogram_quantile`` picks the first bucket whose cumulative count
  reaches q·N of the summed per-pod ``rate()`` histograms, and ``rate()`` scales each
  pod's increase by its extrapolation to the window's edges. So the true quantile is the
  inverted-CDF one (the smallest value whose cumulative weight reaches q of the total),
  each request weighted by its pod's extrapolation factor;
- waiting and running requests and KV usage, per pod and for the fleet, equal to the mean
  of the values the matched scrapes exported: ``avg_over_time`` averages samples, so the
  simulator sampled at the scrape instants is the exact truth (no time-average tolerance);
- each engine's ``vllm:cache_config_info`` (hash algorithm, prefix caching, block size) as
  exported, and the ``CacheIsolation`` condition ``decide`` makes of it: True for the
  default sha256 under MultiTenant, False once the emulator exports xxhash.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cachescale.api.reasons import ConditionReason
from cachescale.api.spec import Engine
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import decide
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import Selector
from cachescale.gather.signals import SignalRequest
from cachescale.sim import metrics, sglang_metrics
from cachescale.snapshot import EngineCacheConfig, EngineSignals, Measured, Snapshot
from tests.decide.decide_builders import condition, learned, spec, workload
from tests.polling import wait_for
from tests.prometheus_fixture import (
    EmulatorProcess,
    PrometheusServer,
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
SAMPLED_SHARE = 0.75
"""Of the window's scrapes (one a second), how many each pod must have had sampled for
the comparison to stand: with fewer, Prometheus missed the pod (a starved machine) and
there is little left to compare."""
OBSERVATIONS = 2
"""Attempts at a sampled window before the test fails with what Prometheus recorded."""
LOG_TAIL = 2000
"""Characters of Prometheus's log a failure quotes."""
TRUTH_WINDOW = "40s"
"""How much the ground truth keeps of requests and scrapes: more than the whole run."""
ALIGNMENT_S = 0.01
"""Prometheus stamps a sample with its scrape's start, moved by up to 2 ms to keep the
timestamps evenly spaced; the emulator's collection comes after that start."""
SCRAPE_TIMEOUT_S = 1.0
"""The fixture's scrape timeout: a collection later than this after the start is no
sample."""
TIE = 1e-9
"""Relative slack at a bucket bound, for exact ties only: when q·N equals a bucket's
cumulative count, float rounding decides on which side of the bound both numpy and
``histogram_quantile`` land, and the answer sits on the bound to within rounding."""
FULL_HIT_MAX_COMPUTED = 200
TTFT_BUCKETS = {"vllm": metrics.TTFT_BUCKETS_S, "sglang": sglang_metrics.TTFT_BUCKETS_S}
ITL_BUCKETS = {"vllm": metrics.ITL_BUCKETS_S, "sglang": sglang_metrics.ITL_BUCKETS_S}
TTFT_COUNT = {
    "vllm": "vllm:time_to_first_token_seconds_count",
    "sglang": "sglang:time_to_first_token_seconds_count",
}


@dataclass(frozen=True)
class PodWindow:
    """One pod's share of the window: the scrapes behind its samples, oldest first, the
    requests counted between the first and the last (ground-truth columns), and how much
    ``rate()`` scales this pod's increase to cover the whole window."""

    scrapes: list[dict[str, Any]]
    requests: dict[str, list[Any]]
    extrapolation: float

    def delta(self, field: str) -> float:
        """How much a cumulative field grew from the first scrape to the last."""
        return float(self.scrapes[-1][field] - self.scrapes[0][field])

    def mean(self, field: str) -> float:
        """A gauge's mean over the scrapes, as ``avg_over_time`` takes it."""
        return statistics.fmean(scrape[field] for scrape in self.scrapes)


Windows = Mapping[str, PodWindow]


def matching_scrape(
    scrapes: Sequence[dict[str, Any]], timestamp: float, count: float
) -> dict[str, Any]:
    """The scrape behind the sample ``(timestamp, count)``: the first collection after
    Prometheus stamped the scrape's start, within the scrape timeout; it must have
    exported that many finished requests."""
    scrape = next(s for s in scrapes if s["wall_time_s"] >= timestamp - ALIGNMENT_S)
    assert scrape["wall_time_s"] < timestamp + SCRAPE_TIMEOUT_S, ("no scrape", timestamp)
    assert scrape["finished_requests"] == count, ("sample and scrape disagree", timestamp)
    return scrape


def extrapolation(times: Sequence[float], at: float) -> float:
    """How much ``rate()`` stretches the increase between a series' first and last sample
    to cover the window (Prometheus's ``extrapolatedRate``): to each edge of the window if
    that edge is within 1.1 average intervals, else by half an interval. (Prometheus also
    stops a counter's extrapolation where it would reach zero. That needs a bucket's count
    before the window to be under a tenth of its growth inside it; with the warm-up and
    start-up before the window, every bucket's count before it is about its growth in it.)"""
    sampled = times[-1] - times[0]
    interval = sampled / (len(times) - 1)
    stretched = sampled
    for gap in (times[0] - (at - WINDOW_S), at - times[-1]):
        stretched += gap if gap < 1.1 * interval else interval / 2
    return stretched / sampled


def pod_window(truth: dict[str, Any], samples: list[tuple[float, float]], at: float) -> PodWindow:
    """What one pod's samples in the window cover, according to its ground truth."""
    scrapes = [matching_scrape(truth["recent_scrapes"], t, count) for t, count in samples]
    columns = dict(truth["recent_requests"])
    first = columns.pop("first_index")
    start, end = int(samples[0][1]) - first, int(samples[-1][1]) - first
    assert start >= 0, "the ground truth no longer holds the window's first requests"
    requests = {name: values[start:end] for name, values in columns.items()}
    return PodWindow(scrapes, requests, extrapolation([t for t, _ in samples], at))


def total(windows: Windows, field: str) -> float:
    """A cumulative field's growth, summed over pods."""
    return sum(window.delta(field) for window in windows.values())


def per_second(windows: Windows, field: str) -> float:
    """A counter's rate, summed over pods (each over its own sampled interval)."""
    return sum(w.delta(field) / w.delta("wall_time_s") for w in windows.values())


def column(windows: Windows, name: str) -> np.ndarray[Any, np.dtype[Any]]:
    """One ground-truth column of the window's requests, all pods together."""
    return np.concatenate([np.asarray(w.requests[name]) for w in windows.values()])


def weights(windows: Windows) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Each request's weight in the summed ``rate()`` histogram: its pod's extrapolation."""
    return np.concatenate(
        [np.full(len(w.requests["ttft_s"]), w.extrapolation) for w in windows.values()]
    )


def true_quantile(values: np.ndarray[Any, Any], weight: np.ndarray[Any, Any], q: float) -> float:
    """The smallest value whose cumulative weight reaches ``q`` of the total."""
    return float(np.quantile(values, q, method="inverted_cdf", weights=weight))


def bucket_of(value: float, bounds: Sequence[float]) -> tuple[float, float]:
    """The histogram bucket ``(lower, upper]`` holding ``value`` (``le`` is inclusive)."""
    index = bisect.bisect_left(bounds, value)
    assert index < len(bounds), f"{value} is in the +Inf bucket"
    return (bounds[index - 1] if index else 0.0), bounds[index]


def assert_in_bucket(name: str, measured: Measured, true: float, bounds: Sequence[float]) -> None:
    lower, upper = bucket_of(true, bounds)
    assert measured.value is not None, (name, measured.reason)
    inside = lower * (1 - TIE) < measured.value <= upper * (1 + TIE)
    assert inside, (name, measured.value, true, (lower, upper))


def read_signals(url: str, engine: str, at: float) -> EngineSignals:
    request = SignalRequest(
        engine=Engine(engine),
        selector=Selector.of({"namespace": "llm"}),
        window_seconds=WINDOW_S,
        gpus_per_pod=GPUS_PER_POD,
        pods_holding_gpus=PODS,
    )
    with PrometheusClient(PrometheusConfig(url=url)) as client:
        return gather_signals(client, request, datetime.fromtimestamp(at, UTC))


def truth_after(emulator: EmulatorProcess, wall_s: float) -> dict[str, Any]:
    """The first ground-truth snapshot taken after Unix time ``wall_s``."""

    def fresh() -> dict[str, Any] | None:
        truth = emulator.truth() if emulator.truth_file.exists() else None
        return truth if truth is not None and truth["wall_time_s"] > wall_s else None

    return wait_for(fresh, 10.0, "a fresh ground-truth snapshot")


@dataclass(frozen=True)
class Observation:
    """One run under Prometheus: the signals read at ``at``, the ground truth after it,
    each pod's TTFT count samples in the window, and what Prometheus recorded of its
    scrapes (``up`` and durations), for a failure message."""

    signals: EngineSignals
    truth: dict[str, Any]
    samples: dict[str, list[tuple[float, float]]]
    at: float
    scrapes: str

    def sampled(self) -> bool:
        """Whether Prometheus sampled every pod through the window."""
        return min(map(len, self.samples.values())) >= SAMPLED_SHARE * WINDOW_S

    def windows(self) -> dict[str, PodWindow]:
        return {
            pod: pod_window(self.truth["pods"][pod], self.samples[pod], self.at)
            for pod in sorted(self.samples)
        }


def observe(tmp_path: Path, engine: str) -> tuple[EngineSignals, dict[str, PodWindow]]:
    """Run the emulator under Prometheus; return the signals and the window's truth.

    A window Prometheus did not sample (fewer than :data:`SAMPLED_SHARE` of its scrapes on
    some pod) proves nothing about the signals: it is observed again, up to
    :data:`OBSERVATIONS` times, and the test fails with each attempt's scrape record."""
    missed: list[str] = []
    for attempt in range(OBSERVATIONS):
        workdir = tmp_path / f"attempt-{attempt}"
        workdir.mkdir()
        observation = observe_once(workdir, engine)
        assert set(observation.samples) == {f"{engine}-engine-{i}" for i in range(PODS)}
        if observation.sampled():
            return observation.signals, observation.windows()
        missed.append(observation.scrapes)
    pytest.fail("Prometheus missed the pods' scrapes in every attempt:\n" + "\n".join(missed))


def observe_once(workdir: Path, engine: str) -> Observation:
    """One run of the emulator under Prometheus, read at the end of the window."""
    prometheus_binary()
    sim_s = (WARMUP_S + WINDOW_S + INGEST_LAG_S + 4) * SPEED
    scenario = fixed_fleet_scenario(replicas=PODS, duration_s=sim_s)
    flags = ("--engine", engine, "--linger", "30", "--ground-truth-window", TRUTH_WINDOW)
    with (
        run_emulator(
            workdir, scenario, *flags, "--ground-truth-interval", "1", speed=SPEED
        ) as emulator,
        run_prometheus(workdir, emulator.file_sd) as prometheus,
    ):
        emulator.wait_for_targets()
        prometheus.wait_for_targets_up({f"{engine}-engine-{i}" for i in range(PODS)})
        at = round(time.time() + WARMUP_S + WINDOW_S, 3)  # what the queries send (ms)
        time.sleep(max(0.0, at + INGEST_LAG_S - time.time()))
        truth = truth_after(emulator, at)
        signals = read_signals(prometheus.url, engine, at)
        selector = f'{TTFT_COUNT[engine]}{{namespace="llm"}}[{WINDOW_S:g}s]'
        samples = prometheus.raw_samples(selector, at)
        return Observation(signals, truth, samples, at, scrape_record(prometheus, at))


def scrape_record(prometheus: PrometheusServer, at: float) -> str:
    """Each pod's ``up`` and scrape durations over the window, as Prometheus kept them, and
    the end of its log."""
    lines = [f"window ending {at:.3f}:"]
    for series in ("up", "scrape_duration_seconds"):
        for pod, values in sorted(prometheus.raw_samples(f"{series}[{WINDOW_S:g}s]", at).items()):
            lines.append(f"  {series} {pod}: {[(round(t - at, 2), v) for t, v in values]}")
    log = prometheus.log.read_text(encoding="utf-8", errors="replace")
    lines.append(f"  Prometheus's log (warnings and worse): {log[-LOG_TAIL:] or 'empty'}")
    return "\n".join(lines)


def check_hit_rates(snapshot: EngineSignals, windows: Windows) -> None:
    hit_rate = total(windows, "prefix_cache_hits_tokens") / total(
        windows, "prefix_cache_queries_tokens"
    )
    assert snapshot.token_hit_rate_local.value == pytest.approx(hit_rate, abs=0.02)
    # No KV connector (vLLM exports its counter at 0, as real vLLM does), no host or
    # storage tier (SGLang): the hit rate with external hits is the local one.
    external = snapshot.token_hit_rate_with_external.value
    assert external == pytest.approx(hit_rate, abs=0.02)


def check_per_request(snapshot: EngineSignals, windows: Windows, engine: str) -> None:
    computed = column(windows, "prompt_tokens") - column(windows, "cached_tokens")
    assert snapshot.prefill_tokens_per_request.value == pytest.approx(computed.mean(), rel=0.05)
    context = column(windows, "prompt_tokens") + column(windows, "output_tokens")
    # Engine token counters move at prefill and per decode step, not at finish: close.
    assert snapshot.context_tokens_per_request.value == pytest.approx(context.mean(), rel=0.05)
    if engine == "vllm":
        share = float(np.mean(computed <= FULL_HIT_MAX_COMPUTED))
        assert snapshot.request_full_hit_share.value == pytest.approx(share, abs=0.02)


def check_rates(snapshot: EngineSignals, windows: Windows) -> None:
    finished = total(windows, "finished_requests")
    assert finished == len(column(windows, "ttft_s")) > 500, "too few requests for 5%"
    true_rps = per_second(windows, "finished_requests")
    assert snapshot.requests_per_second.value == pytest.approx(true_rps, rel=0.05)
    check_preemptions(snapshot.preemptions_per_second, per_second(windows, "preemptions"))
    pace = total(windows, "sim_time_s") / total(windows, "wall_time_s")  # sim s per wall s
    true_cost = 1000 * total(windows, "gpu_seconds") / finished  # simulated GPU-seconds
    cost = snapshot.gpu_seconds_per_1k_requests.value
    assert cost is not None
    assert cost * pace == pytest.approx(true_cost, rel=0.05)


def check_preemptions(measured: Measured, true: float) -> None:
    """Within 5%; none at all must read as a known 0 (the series exists and stayed put,
    which is a measurement, not missing data)."""
    if true == 0:
        assert measured.value == 0.0, measured.reason
    else:
        assert measured.value == pytest.approx(true, rel=0.05)


def check_quantiles(snapshot: EngineSignals, windows: Windows, engine: str) -> None:
    ttfts, weight = column(windows, "ttft_s"), weights(windows)
    for q in (0.5, 0.95, 0.99):
        name = f"ttft_p{round(q * 100)}_seconds"
        true = true_quantile(ttfts, weight, q)
        assert_in_bucket(name, getattr(snapshot, name), true, TTFT_BUCKETS[engine])
    decoded = column(windows, "output_tokens") > 1
    itl = column(windows, "itl_s")[decoded].astype(float)
    steps = column(windows, "output_tokens")[decoded] - 1  # one observation per step
    true_itl = true_quantile(itl, steps * weight[decoded], 0.95)
    assert_in_bucket("itl_p95_seconds", snapshot.itl_p95_seconds, true_itl, ITL_BUCKETS[engine])


def exactly(true: float) -> Any:
    """Equal up to float rounding (a mean of the same samples, summed in another order)."""
    return pytest.approx(true, rel=1e-9, abs=1e-12)


def check_pods(snapshot: EngineSignals, windows: Windows) -> None:
    assert [pod.pod for pod in snapshot.pods] == list(windows)
    for pod in snapshot.pods:
        window = windows[pod.pod]
        hit_rate = window.delta("prefix_cache_hits_tokens") / window.delta(
            "prefix_cache_queries_tokens"
        )
        assert pod.token_hit_rate.value == pytest.approx(hit_rate, abs=0.02)
        assert pod.waiting_requests.value == exactly(window.mean("waiting"))
        assert pod.running_requests.value == exactly(window.mean("running"))
        assert pod.kv_cache_usage_ratio.value == exactly(window.mean("kv_usage"))
        assert pod.age_seconds.value is None  # neither the Kubernetes API nor KSM here
    for signal, field in (
        (snapshot.waiting_requests_per_pod, "waiting"),
        (snapshot.running_requests_per_pod, "running"),
        (snapshot.kv_cache_usage_ratio, "kv_usage"),
    ):
        true = statistics.fmean(window.mean(field) for window in windows.values())
        assert signal.value == exactly(true), field


def test_extrapolation_stretches_to_near_edges_and_half_an_interval_to_far_ones() -> None:
    at = 100.0
    every_second = [at - WINDOW_S + 0.25 + i for i in range(12)]  # 0.25 s and 0.75 s gaps
    assert extrapolation(every_second, at) == pytest.approx(12 / 11)
    first_missed = every_second[1:]  # 1.25 s to the start: beyond 1.1 intervals
    assert extrapolation(first_missed, at) == pytest.approx((10 + 0.5 + 0.75) / 10)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_signals_match_the_simulators_ground_truth(tmp_path: Path, engine: str) -> None:
    snapshot, windows = observe(tmp_path, engine)
    check_rates(snapshot, windows)
    check_hit_rates(snapshot, windows)
    check_per_request(snapshot, windows, engine)
    check_quantiles(snapshot, windows, engine)
    check_pods(snapshot, windows)
    check_cache_config(snapshot, engine)
    if engine == "vllm":
        assert isolation(snapshot, "MultiTenant") == (
            ConditionStatus.TRUE,
            ConditionReason.CRYPTOGRAPHIC_PREFIX_HASH,
        )
    else:
        assert isolation(snapshot, "MultiTenant")[0] is ConditionStatus.UNKNOWN


def check_cache_config(snapshot: EngineSignals, engine: str, algo: str = "sha256") -> None:
    """Every engine's ``vllm:cache_config_info`` as the emulator exported it; SGLang has
    no equivalent, so its configuration is unknown with the reason."""
    config = snapshot.cache_config
    if engine == "sglang":
        assert config.reason is not None
        assert config.reason.startswith("SGLang exports no cache configuration metric")
        return
    pods = [f"{engine}-engine-{i}" for i in range(PODS)]
    assert config.engines == tuple(EngineCacheConfig(pod, algo, True, 16) for pod in pods)


def isolation(snapshot: EngineSignals, tenancy: str) -> tuple[ConditionStatus, str]:
    """The CacheIsolation condition ``decide`` gives on this snapshot."""
    decision = decide(
        spec(cache={"tenancy": tenancy}),
        Snapshot(snapshot, workload()),
        learned(),
        snapshot.observed_at,
    )
    return condition(decision, ConditionType.CACHE_ISOLATION)


def test_cache_isolation_reads_the_emulators_hash(tmp_path: Path) -> None:
    """The emulator exporting xxhash under MultiTenant: CacheIsolation=False; SingleTenant:
    True. (sha256, the emulator's default, is read in the ground-truth test above.)"""
    prometheus_binary()
    scenario = fixed_fleet_scenario(replicas=PODS, duration_s=20 * SPEED)
    flags = ("--prefix-caching-hash-algo", "xxhash", "--linger", "30")
    with (
        run_emulator(tmp_path, scenario, *flags, speed=SPEED) as emulator,
        run_prometheus(tmp_path, emulator.file_sd) as prometheus,
    ):
        emulator.wait_for_targets()
        prometheus.wait_for_targets_up({f"vllm-engine-{i}" for i in range(PODS)})
        snapshot = read_signals(prometheus.url, "vllm", time.time())
    check_cache_config(snapshot, "vllm", "xxhash")
    assert isolation(snapshot, "MultiTenant") == (
        ConditionStatus.FALSE,
        ConditionReason.NON_CRYPTOGRAPHIC_PREFIX_HASH,
    )
    assert isolation(snapshot, "SingleTenant") == (
        ConditionStatus.TRUE,
        ConditionReason.SINGLE_TENANT,
    )
