"""vLLM V1's Prometheus series for one simulated replica, through prometheus_client.

Each simulated pod keeps the series a real vLLM ≥ 0.13 server exports, with their real
names, types, label names and bucket bounds (the names gather reads are in
:mod:`cachescale.api.engine_metrics`), so a real Prometheus scraping the emulator sees what
it would see in production and the gather layer's PromQL is exercised for real.

Why a custom collector instead of ``Histogram.observe``: a default simulation finishes
~230,000 requests, and per-observation locking in prometheus_client's metric objects would
cost seconds. Here each finished request updates plain bucket counts (a bisect and two
adds), and the families are built only when something scrapes. Exposition still goes
through prometheus_client (``generate_latest``), so the text format is the library's.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cachescale.api.engine_metrics import VLLM_PREFIX_CACHE_HITS, VLLM_PREFIX_CACHE_QUERIES
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest

MAX_MODEL_LEN_TOKENS = 8192
"""Llama 3's context length: caps the token histograms' buckets, as vLLM does."""

# vllm/v1/metrics/buckets.py (identical 0.8.5 … 0.33).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series for token histograms, capped at ``max_model_len``."""
    bounds: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return tuple(bounds)
            bounds.append(float(value))
        scale *= 10


@dataclass
class BucketCounts:
    """A histogram's non-cumulative bucket counts, its sum and its count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times (``le`` is inclusive, as in Prometheus)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class ReplicaSeries:
    """Per-replica histogram and counter state that the engine does not keep itself."""

    def __init__(self, max_model_len: int = MAX_MODEL_LEN_TOKENS) -> None:
        tokens = token_buckets(max_model_len)
        self.ttft = BucketCounts(TTFT_BUCKETS_S)
        self.e2e_latency = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.inter_token_latency = BucketCounts(ITL_BUCKETS_S)
        self.prefill_kv_computed = BucketCounts(tokens)
        self.prompt_tokens = BucketCounts(tokens)
        self.generation_tokens = BucketCounts(tokens)
        self.success_total = 0
        self.aborted_total = 0

    def record_finished(self, request: SimRequest) -> None:
        """Account one finished request as vLLM's output processor would."""
        assert request.first_token_s is not None
        assert request.finished_s is not None
        assert request.cached_tokens is not None
        ttft = request.first_token_s - request.arrival_s
        self.ttft.observe(ttft)
        self.e2e_latency.observe(request.finished_s - request.arrival_s)
        self.prefill_kv_computed.observe(request.prompt_tokens - request.cached_tokens)
        self.prompt_tokens.observe(request.prompt_tokens)
        self.generation_tokens.observe(request.output_tokens)
        if request.output_tokens > 1:
            # vLLM observes every decode step; the simulator knows only the request's mean
            # step time, so all of its steps land in that bucket (documented limit).
            mean_itl = (request.finished_s - request.first_token_s) / (request.output_tokens - 1)
            self.inter_token_latency.observe(mean_itl, request.output_tokens - 1)
        self.success_total += 1

    def record_aborted(self) -> None:
        """Account one request its client gave up on (``finished_reason="abort"``)."""
        self.aborted_total += 1


class VllmReplicaCollector(Collector):
    """Renders one replica's series, as its vLLM ``/metrics`` endpoint would, on scrape."""

    def __init__(
        self,
        engine: EngineReplica,
        series: ReplicaSeries,
        model_name: str,
        hash_algo: str = "sha256",
    ) -> None:
        self._engine = engine
        self._series = series
        self._labels = {"model_name": model_name, "engine": "0"}
        self._hash_algo = hash_algo
        """``--prefix-caching-hash-algo`` as ``vllm:cache_config_info`` reports it (only
        reported: the simulated cache compares token blocks, whatever the hash)."""

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def _histogram(self, name: str, doc: str, counts: BucketCounts) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), counts.cumulative(), counts.total)
        return family

    def collect(self) -> Iterator[Metric]:
        """Every series, with vLLM's names (the ``_total`` suffix added by the library)."""
        engine, series = self._engine, self._series
        yield self._gauge("vllm:num_requests_running", "Requests in the batch.", engine.num_running)
        yield self._gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", engine.num_waiting
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.", engine.kv_usage
        )
        yield self._counter(
            VLLM_PREFIX_CACHE_QUERIES.removesuffix("_total"),
            "Prefix cache queries, in tokens.",
            engine.prefix_cache_queries_tokens,
        )
        yield self._counter(
            VLLM_PREFIX_CACHE_HITS.removesuffix("_total"),
            "Prefix cache hits, in tokens.",
            engine.prefix_cache_hits_tokens,
        )
        yield self._counter(
            "vllm:num_preemptions",
            "Cumulative number of preemptions.",
            engine.num_preemptions_total,
        )
        yield self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", engine.prompt_tokens_total
        )
        yield self._counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            engine.generation_tokens_total,
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self._labels, "finished_reason"],
        )
        success.add_metric([*self._labels.values(), "stop"], series.success_total)
        if series.aborted_total:
            # vLLM registers every finish reason at start; here the abort series appears
            # with the first client timeout, so runs without timeouts export what they did.
            success.add_metric([*self._labels.values(), "abort"], series.aborted_total)
        yield success
        yield self._histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            series.ttft,
        )
        yield self._histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            series.inter_token_latency,
        )
        yield self._histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            series.e2e_latency,
        )
        yield self._histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            series.prefill_kv_computed,
        )
        yield self._histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            series.prompt_tokens,
        )
        yield self._histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            series.generation_tokens,
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "engine",
                "block_size",
                "enable_prefix_caching",
                "num_gpu_blocks",
                "prefix_caching_hash_algo",
            ],
        )
        info.add_metric(
            ["0", str(engine.block_size), "True", str(engine.num_blocks), self._hash_algo], 1.0
        )
        yield info
