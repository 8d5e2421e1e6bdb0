"""vLLM V1's Prometheus series for one simulated replica, through prometheus_client.

Each simulated pod serves the series a real vLLM server exports (the families of vLLM 0.32,
``tests/emulator/fixtures``), with their real names, types, label names and bucket bounds
(the names gather reads are in :mod:`cachescale.api.engine_metrics`), so a real Prometheus
scraping the emulator sees what it would see in production and the gather layer's PromQL
is exercised for real. Every value comes from the simulated engine or the counts of its
finished requests (:mod:`cachescale.sim.metrics`); what the simulator has no counterpart
for (a KV connector, multi-modal inputs, sleep mode, admission limits, MFU estimates) holds
the value vLLM exports without that feature. The families left out, and why, are
``NOT_EXPOSED`` (listed in docs/emulator.md).

A custom collector builds the families on scrape from those plain counts (why they are not
prometheus_client's metric objects: :mod:`cachescale.sim.metrics`). Exposition still goes
through prometheus_client (``generate_latest``), so the text format is the library's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cachescale.api.engine_metrics import VLLM_PREFIX_CACHE_HITS, VLLM_PREFIX_CACHE_QUERIES
from cachescale.sim.metrics import REQUEST_PARAMS_N_BUCKETS, BucketCounts, ReplicaSeries
from cachescale.sim.replica import EngineReplica
from cachescale.sim.vllm_cache_config import cache_config_labels

# Label values vLLM registers at start, in its order (vllm/v1/metrics/loggers.py).
FINISHED_REASONS: Final = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS: Final = ("capacity", "deferred")
SLEEP_STATES: Final = ("awake", "weights_offloaded", "discard_all")
PROMPT_TOKEN_SOURCES: Final = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES: Final = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS: Final = ("max_num_queued_reqs", "max_num_queued_tokens")

NOT_EXPOSED: Final = {
    "vllm:iteration_tokens_total": (
        "tokens per engine step: the simulated engine runs a decode-only stretch as one "
        "event and keeps no per-step record"
    ),
}
"""vLLM 0.32 families the emulator does not serve, with why (docs/emulator.md, "Parity
with real vLLM", lists the same)."""


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
        self._model_name = model_name
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

    def _by_label(
        self,
        family: CounterMetricFamily | GaugeMetricFamily,
        label_values: Sequence[str],
        values: Mapping[str, float],
    ) -> Metric:
        """``family`` (labelled with the engine's labels and one more): a sample for each of
        vLLM's ``label_values``, in its order, from ``values`` (0 where it has none)."""
        for label in label_values:
            family.add_metric([*self._labels.values(), label], values.get(label, 0))
        return family

    def _histogram(self, name: str, doc: str, counts: BucketCounts) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), counts.cumulative(), counts.total)
        return family

    def collect(self) -> Iterator[Metric]:
        """Every family, in vLLM's order, with vLLM's names (``_total`` added by the
        library to counters)."""
        yield from self._mfu_families()
        yield from self._scheduler_families()
        yield from self._counter_families()
        yield from self._histogram_families()
        info = cache_config_labels(self._engine, self._series.max_model_len, self._hash_algo)
        family = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info)
        )
        family.add_metric(list(info.values()), 1.0)
        yield family

    def _scheduler_families(self) -> Iterator[Metric]:
        engine = self._engine
        labels = [*self._labels]
        yield self._gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            engine.num_running,
        )
        yield self._gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            engine.num_waiting,
        )
        # Nothing defers a simulated request (no LoRA budget, no KV transfer).
        yield self._by_label(
            GaugeMetricFamily(
                "vllm:num_requests_waiting_by_reason",
                (
                    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
                    "for scheduling capacity; 'deferred' = deferred by transient constraints "
                    "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
                    "vllm:num_requests_waiting."
                ),
                labels=[*labels, "reason"],
            ),
            WAITING_REASONS,
            {"capacity": engine.num_waiting},
        )
        yield self._by_label(
            GaugeMetricFamily(
                "vllm:engine_sleep_state",
                (
                    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means "
                    "engine is awake; weights_offloaded = 1 means sleep level 1; "
                    "discard_all = 1 means sleep level 2."
                ),
                labels=[*labels, "sleep_state"],
            ),
            SLEEP_STATES,
            {"awake": 1},
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            engine.kv_usage,
        )

    def _counter_families(self) -> Iterator[Metric]:
        engine, series = self._engine, self._series
        labels = [*self._labels]
        hits = engine.prefix_cache_hits_tokens
        yield self._counter(
            VLLM_PREFIX_CACHE_QUERIES.removesuffix("_total"),
            "Prefix cache queries, in terms of number of queried tokens.",
            engine.prefix_cache_queries_tokens,
        )
        yield self._counter(
            VLLM_PREFIX_CACHE_HITS.removesuffix("_total"),
            "Prefix cache hits, in terms of number of cached tokens.",
            hits,
        )
        # No KV connector and a text-only model: vLLM exports these at 0 too.
        for name, doc in (
            (
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache "
                "sharing, in terms of number of queried tokens.",
            ),
            (
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, "
                "in terms of number of cached tokens.",
            ),
            (
                "vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.",
            ),
            ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
        ):
            yield self._counter(name, doc, 0)
        yield self._counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            engine.num_preemptions_total,
        )
        prompt, cached = engine.prompt_tokens_total, engine.prompt_cached_tokens_total
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt)
        yield self._by_label(
            CounterMetricFamily(
                "vllm:prompt_tokens_by_source",
                "Number of prompt tokens by source.",
                labels=[*labels, "source"],
            ),
            PROMPT_TOKEN_SOURCES,
            {"local_compute": prompt - cached, "local_cache_hit": cached},
        )
        yield self._counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            cached,
        )
        yield self._by_label(
            CounterMetricFamily(
                "vllm:prompt_tokens_cached_by_source",
                (
                    "Prefix-cache hit tokens by the cache tier that supplied them: device "
                    "(local HBM), host (offloaded to DRAM), disk, p2p (transferred from "
                    "another vLLM instance) or external_unspecified. Counted at admission; "
                    "sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."
                ),
                labels=[*labels, "source"],
            ),
            CACHE_HIT_SOURCES,
            {"device": hits},
        )
        yield self._counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            engine.generation_tokens_total,
        )
        length = series.phases().length_total
        finished = {
            "stop": series.success_total - length,
            "length": length,
            "abort": series.aborted_total,
        }
        yield self._by_label(
            CounterMetricFamily(
                "vllm:request_success",
                "Count of successfully processed requests.",
                labels=[*labels, "finished_reason"],
            ),
            FINISHED_REASONS,
            finished,
        )
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason in ADMISSION_REASONS:  # the simulated engine has no queue limit
            rejections.add_metric([self._model_name, reason], 0)
        yield rejections

    def _histogram_families(self) -> Iterator[Metric]:
        series = self._series
        phases = series.phases()
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
        # One sequence per request (n = 1): its longest sequence is its only one.
        yield self._histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            series.generation_tokens,
        )
        n = BucketCounts(REQUEST_PARAMS_N_BUCKETS)
        n.observe(1, series.success_total)
        yield self._histogram("vllm:request_params_n", "Histogram of the n request parameter.", n)
        yield self._histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            phases.max_tokens,
        )
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
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            phases.time_per_output_token,
        )
        yield self._histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            series.e2e_latency,
        )
        for phase, state, counts in (
            ("queue", "WAITING", phases.queue),
            ("inference", "RUNNING", phases.inference),
            ("prefill", "PREFILL", phases.prefill),
            ("decode", "DECODE", phases.decode),
        ):
            yield self._histogram(
                f"vllm:request_{phase}_time_seconds",
                f"Histogram of time spent in {state} phase for request.",
                counts,
            )
        yield self._histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            phases.preemptions,
        )
        yield self._histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            series.prefill_kv_computed,
        )

    def _mfu_families(self) -> Iterator[Metric]:
        """vLLM's FLOPs and bytes estimates: 0 unless it runs with ``--enable-mfu-metrics``
        (off by default), so 0 here."""
        for name, what in (
            ("vllm:estimated_flops_per_gpu", "floating point operations"),
            ("vllm:estimated_read_bytes_per_gpu", "bytes read from memory"),
            ("vllm:estimated_write_bytes_per_gpu", "bytes written to memory"),
        ):
            yield self._counter(
                name,
                f"Estimated number of {what} per GPU (for Model Flops Utilization calculations).",
                0,
            )
