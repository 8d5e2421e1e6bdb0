"""vLLM V1's histograms and counters for one simulated replica, counted per finished request.

Each simulated pod keeps what a real vLLM server counts for its ``/metrics``: vLLM's bucket
bounds (``vllm/v1/metrics/buckets.py``), its 1-2-5 token buckets capped at
``max_model_len``, and the per-request histograms and finish counters of its output
processor. Every value comes from the simulated engine's finished requests. The simulator
reads some of these itself; the rest only an exposition reads
(:mod:`cachescale.sim.vllm_metrics` renders them all, and
:mod:`cachescale.sim.sglang_metrics` reuses the sums).

Why plain counts instead of ``Histogram.observe``: a simulation finishes hundreds of
thousands of requests, and prometheus_client's metric objects lock on every observation.
Here each finished request updates plain bucket counts (a bisect and two adds) for the
histograms the simulator itself reads, and is only appended to a list for the others
(:class:`RequestPhases`), which are folded in when something scrapes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

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
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
REQUEST_PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)


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


class RequestPhases:
    """vLLM's per-request histograms that only an exposition reads: the request's phases
    (from its first admission, ``scheduled_s``), its mean time per output token, its
    preemptions and its ``max_tokens``; and the requests that finished by ``length``."""

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.queue = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.prefill = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.decode = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.inference = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.time_per_output_token = BucketCounts(ITL_BUCKETS_S)
        self.preemptions = BucketCounts(REQUEST_NUM_PREEMPTIONS_BUCKETS)
        self.max_tokens = BucketCounts(token_buckets(max_model_len))
        self.length_total = 0

    def observe(self, request: SimRequest) -> None:
        """Account one finished request as vLLM's ``update_from_finished_request`` does."""
        scheduled, first, finished = request.scheduled_s, request.first_token_s, request.finished_s
        assert scheduled is not None
        assert first is not None
        assert finished is not None
        self.queue.observe(scheduled - request.arrival_s)
        self.prefill.observe(first - scheduled)
        self.decode.observe(finished - first)
        self.inference.observe(finished - scheduled)
        steps = request.output_tokens - 1
        self.time_per_output_token.observe((finished - first) / steps if steps > 0 else 0.0)
        self.preemptions.observe(request.num_preemptions)
        max_tokens = request.max_tokens
        if max_tokens is None:
            # The client set none: vLLM's OpenAI server fills in what the context leaves.
            max_tokens = self.max_model_len - request.prompt_tokens
        elif request.output_tokens >= max_tokens:
            self.length_total += 1
        if max_tokens > 0:
            self.max_tokens.observe(max_tokens)


class ReplicaSeries:
    """Per-replica histogram and counter state that the engine does not keep itself."""

    def __init__(self, max_model_len: int = MAX_MODEL_LEN_TOKENS) -> None:
        tokens = token_buckets(max_model_len)
        self.max_model_len = max_model_len
        """The context length the token buckets stop at (and ``cache_config_info`` uses)."""
        self.ttft = BucketCounts(TTFT_BUCKETS_S)
        self.e2e_latency = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.inter_token_latency = BucketCounts(ITL_BUCKETS_S)
        self.prefill_kv_computed = BucketCounts(tokens)
        self.prompt_tokens = BucketCounts(tokens)
        self.generation_tokens = BucketCounts(tokens)
        self.success_total = 0
        """Finished requests, by ``stop`` or ``length`` (aborts are ``aborted_total``)."""
        self.aborted_total = 0
        self._phases = RequestPhases(max_model_len)
        self._unfolded: list[SimRequest] = []

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
        self._unfolded.append(request)

    def record_aborted(self) -> None:
        """Account one request its client gave up on (``finished_reason="abort"``)."""
        self.aborted_total += 1

    def phases(self) -> RequestPhases:
        """The exposition-only histograms, with every request finished so far folded in
        (a simulation nobody scrapes pays one append per request for them)."""
        for request in self._unfolded:
            self._phases.observe(request)
        self._unfolded.clear()
        return self._phases
