"""A fake Prometheus that answers the gather layer's queries with chosen engine numbers.

It builds the exact PromQL the gather layer sends for a policy (``build_queries``,
``detection_query``) and answers each with a vector in the shape the real query would
return — fleet values per group, per-pod values with a ``pod`` label, histogram
buckets per ``le`` — over real HTTP (``gather_fakes``). Tests then state "hit rate 0.85 on
4 pods" instead of curating TSDB blocks; the real query path and the real Prometheus are
exercised by the gather and end-to-end process tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from cachescale.api.spec import Engine
from cachescale.gather.detection import detection_query
from cachescale.gather.promql import QueryKey, build_queries
from cachescale.gather.selector import QueryScope, Selector
from cachescale.snapshot import MetricsGeneration
from tests.gather.gather_fakes import Answer, api_error, vector

PER_POD = {
    QueryKey.POD_SAMPLES: "samples",
    QueryKey.POD_HITS: "hits",
    QueryKey.POD_LOOKED_UP: "looked_up",
    QueryKey.POD_WAITING: "waiting",
    QueryKey.POD_RUNNING: "running",
    QueryKey.POD_KV_USAGE: "kv",
}


@dataclass
class EngineNumbers:
    """What the engines of one policy look like over the window (healthy by default)."""

    pods: tuple[str, ...]
    hit_rate: float = 0.85
    requests_per_second: float = 32.0
    prompt_tokens_per_request: float = 2400.0
    ttft_p95_s: float = 0.5
    running: float = 20.0
    waiting: float = 0.0
    preemptions_per_second: float = 0.0
    kv_usage: float = 0.5
    arrivals_per_second: float | None = None
    """Requests arriving per second (the engines' estimate); None: as many as are served."""
    overrides: dict[QueryKey, float] = field(default_factory=dict)

    def fleet(self) -> dict[QueryKey, float]:
        rps, looked_up = (
            self.requests_per_second,
            self.requests_per_second * self.prompt_tokens_per_request,
        )
        computed = looked_up * (1 - self.hit_rate)
        values = {
            QueryKey.HITS_LOCAL: looked_up * self.hit_rate,
            QueryKey.LOOKED_UP: looked_up,
            QueryKey.REQUESTS: rps,
            QueryKey.ARRIVALS: rps
            if self.arrivals_per_second is None
            else self.arrivals_per_second,
            QueryKey.PREEMPTIONS: self.preemptions_per_second,
            QueryKey.PREFILL_COMPUTED: computed,
            QueryKey.COMPUTED_COUNT: rps,
            QueryKey.KV_USAGE: self.kv_usage,
            QueryKey.CONTEXT_TOKENS: looked_up + rps * 300,
        }
        return values | self.overrides

    def buckets(self, key: QueryKey) -> list[tuple[float, float]]:
        """``(le, rate)`` of a latency histogram: TTFT p50, p95 and p99 at a third, once and
        1.5 times ``ttft_p95_s``; ITL p95 at 0.03 s."""
        p95 = self.ttft_p95_s if key is QueryKey.TTFT_BUCKETS else 0.03
        return latency_buckets(p95, self.requests_per_second)

    def pod(self, key: QueryKey) -> float:
        per_pod_lookups = self.requests_per_second * self.prompt_tokens_per_request / len(self.pods)
        return {
            QueryKey.POD_SAMPLES: 12.0,
            QueryKey.POD_HITS: per_pod_lookups * self.hit_rate,
            QueryKey.POD_LOOKED_UP: per_pod_lookups,
            QueryKey.POD_WAITING: self.waiting,
            QueryKey.POD_RUNNING: self.running,
            QueryKey.POD_KV_USAGE: self.kv_usage,
        }[key]


def latency_buckets(p95: float, total: float) -> list[tuple[float, float]]:
    """Bucket rates whose ``histogram_quantile`` is exactly ``p95 / 3`` at 0.5, ``p95`` at
    0.95 and ``p95 * 1.5`` at 0.99 (as floats): each rank ends its bucket, and each bucket
    starts at half its bound or more, so interpolating to its end is exact."""
    return [
        (p95 / 6, 0.0),
        (p95 / 3, 0.5 * total),
        (p95 / 2, 0.5 * total),
        (p95, 0.95 * total),
        (p95 * 1.5, 0.99 * total),
        (math.inf, total),
    ]


@dataclass
class EngineFake:
    """A responder for ``gather_fakes.fake_prometheus``: selector → engine numbers."""

    window_seconds: float = 60.0
    engines: dict[tuple[tuple[str, str], ...], EngineNumbers] = field(default_factory=dict)
    down: bool = False
    demand: dict[str, float] = field(default_factory=dict)
    """A policy's ``metrics.demandQuery`` text → the one series it returns."""

    def set(self, selector: Mapping[str, str], numbers: EngineNumbers) -> None:
        self.engines[tuple(sorted(selector.items()))] = numbers

    def __call__(self, promql: str) -> Answer:
        if self.down:
            return api_error(503, "unavailable", "the fake Prometheus is down")
        if promql in self.demand:
            return vector(({}, repr(self.demand[promql])))
        for key, numbers in self.engines.items():
            answer = self._answer(dict(key), numbers, promql)
            if answer is not None:
                return answer
        return vector()

    def _answer(self, labels: dict[str, str], numbers: EngineNumbers, promql: str) -> Answer | None:
        scope = QueryScope.for_selector(Selector.of(labels))
        if promql == detection_query(Engine.VLLM, scope):
            markers = (
                "vllm:request_prefill_kv_computed_tokens_count",
                "vllm:prefix_cache_queries_total",
            )
            count = str(len(numbers.pods))
            return vector(*(({**labels, "__name__": name}, count) for name in markers))
        queries = build_queries(MetricsGeneration.VLLM_0_13, scope, self.window_seconds)
        for key, query in queries.items():
            if query.promql != promql:
                continue
            if key in PER_POD:
                return vector(
                    *(({**labels, "pod": pod}, repr(numbers.pod(key))) for pod in numbers.pods)
                )
            if key in (QueryKey.TTFT_BUCKETS, QueryKey.ITL_BUCKETS):
                return vector(
                    *(
                        ({**labels, "le": "+Inf" if le == math.inf else repr(le)}, repr(rate))
                        for le, rate in numbers.buckets(key)
                    )
                )
            if key is QueryKey.COMPUTED_BUCKETS:
                rps = numbers.requests_per_second
                return vector(
                    ({**labels, "le": "200.0"}, repr(rps * 0.6)),
                    ({**labels, "le": "+Inf"}, repr(rps)),
                )
            value = numbers.fleet().get(key)
            return vector() if value is None else vector((labels, repr(value)))
        return None
