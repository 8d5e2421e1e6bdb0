"""SGLang's Prometheus series for one simulated replica, through prometheus_client.

``cachescale emulate --engine sglang`` serves these instead of vLLM's, so the gather layer's
SGLang profile meets SGLang's real names, label sets and bucket bounds (SGLang 0.5.23,
``sglang/srt/observability/metrics_collector.py``). Only the exposition changes: the replica
behind it is still the simulator's vLLM-faithful engine (block-granular cache, vLLM's
scheduler), which stands in for SGLang's radix cache.

Where each series comes from:

- ``sglang:prefill_effective_tokens_total{mode}`` — the windowed hit-rate source. SGLang
  splits each request's prompt once, at its first prefill: ``input`` is what was computed,
  ``device_hit`` what the GPU cache served (``host_hit``/``storage_hit`` stay 0: there is no
  hierarchical cache here). Built from the engine's admission-time counters, so
  ``device_hit / (input + device_hit)`` equals vLLM's ``hits / queries``.
- Tokenizer counters (``prompt_tokens``, ``generation_tokens``, ``num_requests``,
  ``cached_tokens``) count finished requests, as SGLang's tokenizer manager does; they come
  from the per-replica :class:`~cachescale.sim.metrics.ReplicaSeries` sums.
- Latency histograms need SGLang's own bounds, which are not vLLM's, so they are kept
  per request in :class:`SglangSeries`, fed the same finished requests.
- ``sglang:cache_hit_rate`` (last prefill batch) and ``sglang:num_retracted_reqs`` (last
  retraction round) are point-in-time gauges: :meth:`SglangSeries.sample_engine` sets them
  from what the engine admitted and retracted since the previous sample.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cachescale.api.engine_metrics import (
    SGLANG_HIT_MODES,
    SGLANG_INPUT_MODE,
    SGLANG_PREFILL_EFFECTIVE_TOKENS,
)
from cachescale.sim.metrics import BucketCounts, ReplicaSeries
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest

# TokenizerMetricsCollector defaults (SGLang 0.5.23).
TTFT_BUCKETS_S = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
    100.0, 200.0, 400.0,
)  # fmt: skip
E2E_LATENCY_BUCKETS_S = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
    100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08,
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip

ENGINE_TYPE = "unified"
"""SGLang's ``engine_type`` label for a server that does both prefill and decode."""
EFFECTIVE_TOKEN_MODES = (SGLANG_INPUT_MODE, *SGLANG_HIT_MODES)


class SglangSeries:
    """Per-replica SGLang state the engine and :class:`ReplicaSeries` do not keep."""

    def __init__(self) -> None:
        self.ttft = BucketCounts(TTFT_BUCKETS_S)
        self.e2e_latency = BucketCounts(E2E_LATENCY_BUCKETS_S)
        self.inter_token_latency = BucketCounts(ITL_BUCKETS_S)
        self.last_batch_hit_rate = 0.0
        self.last_retracted = 0
        self._queries_seen = 0
        self._hits_seen = 0
        self._preemptions_seen = 0

    def record_finished(self, request: SimRequest) -> None:
        """Account one finished request as SGLang's tokenizer manager would."""
        assert request.first_token_s is not None
        assert request.finished_s is not None
        self.ttft.observe(request.first_token_s - request.arrival_s)
        self.e2e_latency.observe(request.finished_s - request.arrival_s)
        if request.output_tokens > 1:
            # As ReplicaSeries: every decode step lands in the request's mean-step bucket.
            steps = request.output_tokens - 1
            self.inter_token_latency.observe(
                (request.finished_s - request.first_token_s) / steps, steps
            )

    def sample_engine(self, engine: EngineReplica) -> None:
        """Set the point-in-time gauges from what happened since the previous sample.

        The hit rate of the prompt tokens admitted since then stands in for SGLang's last
        prefill batch; it keeps its value while nothing is admitted, as SGLang's gauge
        does while the server is idle.
        """
        queries = engine.prefix_cache_queries_tokens - self._queries_seen
        hits = engine.prefix_cache_hits_tokens - self._hits_seen
        if queries > 0:
            self.last_batch_hit_rate = hits / queries
        self.last_retracted = engine.num_preemptions_total - self._preemptions_seen
        self._queries_seen = engine.prefix_cache_queries_tokens
        self._hits_seen = engine.prefix_cache_hits_tokens
        self._preemptions_seen = engine.num_preemptions_total


class SglangReplicaCollector(Collector):
    """Renders one replica's series, as its SGLang ``/metrics`` endpoint would, on scrape."""

    def __init__(
        self,
        engine: EngineReplica,
        series: ReplicaSeries,
        sglang: SglangSeries,
        model_name: str,
    ) -> None:
        self._engine = engine
        self._series = series
        self._sglang = sglang
        # Scheduler metrics carry the parallelism ranks; tokenizer metrics do not.
        self._scheduler = {
            "engine_type": ENGINE_TYPE,
            "model_name": model_name,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        self._tokenizer = {"engine_type": ENGINE_TYPE, "model_name": model_name}
        self._streaming = {**self._tokenizer, "is_streaming": "false"}

    @staticmethod
    def _family(
        family: CounterMetricFamily | GaugeMetricFamily, labels: dict[str, str], value: float
    ) -> Metric:
        family.add_metric(list(labels.values()), value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=list(self._scheduler))
        return self._family(family, self._scheduler, value)

    def _counter(self, name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
        return self._family(CounterMetricFamily(name, doc, labels=list(labels)), labels, value)

    @staticmethod
    def _histogram(name: str, doc: str, labels: dict[str, str], counts: BucketCounts) -> Metric:
        family = HistogramMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), counts.cumulative(), counts.total)
        return family

    def _effective_tokens(self) -> Metric:
        engine = self._engine
        hits = engine.prefix_cache_hits_tokens
        values = dict.fromkeys(EFFECTIVE_TOKEN_MODES, 0.0)
        values[SGLANG_INPUT_MODE] = engine.prefix_cache_queries_tokens - hits
        values["device_hit"] = hits
        family = CounterMetricFamily(
            SGLANG_PREFILL_EFFECTIVE_TOKENS.removesuffix("_total"),
            "Effective prefill tokens by mode, with re-counts of retracted requests removed.",
            labels=[*self._scheduler, "mode"],
        )
        for mode, value in values.items():
            family.add_metric([*self._scheduler.values(), mode], value)
        return family

    def _scheduler_metrics(self) -> Iterator[Metric]:
        engine, sglang = self._engine, self._sglang
        yield self._gauge(
            "sglang:num_running_reqs", "The number of running requests.", engine.num_running
        )
        yield self._gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            engine.num_waiting,
        )
        yield self._gauge("sglang:token_usage", "The token usage.", engine.kv_usage)
        yield self._gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            engine.num_blocks * engine.block_size,
        )
        yield self._gauge(
            "sglang:cache_hit_rate", "The prefix cache hit rate.", sglang.last_batch_hit_rate
        )
        yield self._gauge(
            "sglang:num_retracted_reqs", "The number of retracted requests.", sglang.last_retracted
        )
        yield self._counter(
            "sglang:num_retracted_requests",
            "Total number of retracted requests.",
            self._scheduler,
            engine.num_preemptions_total,
        )
        yield self._effective_tokens()

    def _tokenizer_metrics(self) -> Iterator[Metric]:
        series, sglang = self._series, self._sglang
        yield self._counter(
            "sglang:prompt_tokens",
            "Number of prefill tokens processed.",
            self._streaming,
            series.prompt_tokens.total,
        )
        yield self._counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            self._streaming,
            series.generation_tokens.total,
        )
        yield self._counter(
            "sglang:num_requests",
            "Number of requests processed.",
            self._streaming,
            series.success_total,
        )
        yield self._counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            {**self._tokenizer, "cache_source": "device"},
            series.prompt_tokens.total - series.prefill_kv_computed.total,
        )
        yield self._histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self._streaming,
            sglang.ttft,
        )
        yield self._histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            self._tokenizer,
            sglang.inter_token_latency,
        )
        yield self._histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            self._tokenizer,
            sglang.e2e_latency,
        )

    def collect(self) -> Iterator[Metric]:
        """Every series, with SGLang's names (the ``_total`` suffix added by the library)."""
        yield from self._scheduler_metrics()
        yield from self._tokenizer_metrics()
