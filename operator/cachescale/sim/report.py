"""Turn a run into the numbers an on-call engineer reads: windows, before/after, verdict.

Signals here are *ground truth* from finished requests, not PromQL estimates: the
token-weighted hit rate (what vLLM's counters show), the request-weighted full-hit share
(what they hide), prefill tokens computed per request, TTFT quantiles overall and split by
cache outcome, requests per second served (finished) beside requests per second offered
(every arrival, routed or dropped) and aborted by client timeouts, GPU-seconds per 1k
requests (GPUs held by pods, including starting and draining ones, over requests
finished), and preemptions per second. A window with no finished request has unknown
signals (``None``), never zeros; offered and aborted rates are counted, so always known.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cachescale.sim.request import SimRequest
from cachescale.sim.run import RunResult, TimelineSample


@dataclass(frozen=True)
class Signals:
    """The signals of one window. ``None`` means unknown (nothing finished in it)."""

    token_hit_rate: float | None
    request_hit_share: float | None
    prefill_tokens_per_request: float | None
    ttft_p95_s: float | None
    replicas: float | None
    req_per_s: float
    gpu_s_per_1k: float | None
    preemptions_per_s: float | None
    offered_req_per_s: float = 0.0
    """Requests that arrived per second (the demand), served or not."""
    aborted_per_s: float = 0.0
    """Requests per second whose clients gave up waiting (``workload.client_timeout_s``)."""


@dataclass(frozen=True)
class WindowDetail:
    """Extra per-window numbers for plots and sweeps."""

    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_p95_hit_s: float | None
    ttft_p95_miss_s: float | None
    ttft_p99_hit_s: float | None
    ttft_p99_miss_s: float | None
    throughput_tok_s: float
    requests: int


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-quantile by linear interpolation (numpy's default); None when empty."""
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


class Windows:
    """Finished requests and timeline samples, sliced by simulated time."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        self._full_hit_tokens = result.scenario.report.full_hit_max_computed_tokens
        self._finished = sorted(result.finished, key=lambda r: r.finished_s or 0.0)
        self._finish_times = [r.finished_s or 0.0 for r in self._finished]
        self._arrival_times = sorted(result.arrivals_s)
        self._abort_times = sorted(r.aborted_s or 0.0 for r in result.aborted)

    def _requests(self, start_s: float, end_s: float) -> list[SimRequest]:
        low = bisect.bisect_left(self._finish_times, start_s)
        high = bisect.bisect_left(self._finish_times, end_s)
        return self._finished[low:high]

    def _samples(self, start_s: float, end_s: float) -> list[TimelineSample]:
        return [s for s in self.result.samples if start_s <= s.t_s < end_s]

    def is_full_hit(self, request: SimRequest) -> bool:
        """Whether the request skipped almost all of its prefill."""
        computed = request.prefill_computed_tokens
        return computed is not None and computed <= self._full_hit_tokens

    def signals(self, start_s: float, end_s: float) -> Signals:
        """Signals over requests that finished in [start_s, end_s)."""
        requests = self._requests(start_s, end_s)
        samples = self._samples(start_s, end_s)
        duration = end_s - start_s
        replicas = sum(s.replicas for s in samples) / len(samples) if samples else None
        offered = _count_in(self._arrival_times, start_s, end_s) / duration
        aborted = _count_in(self._abort_times, start_s, end_s) / duration
        if not requests:
            return Signals(None, None, None, None, replicas, 0.0, None, None, offered, aborted)
        prompt = sum(r.prompt_tokens for r in requests)
        cached = sum(r.cached_tokens or 0 for r in requests)
        ttfts = sorted(r.ttft_s for r in requests if r.ttft_s is not None)
        gpu_s = sum(pod.gpu_seconds_between(start_s, end_s) for pod in self.result.pods)
        preemptions = None
        if len(samples) >= 2:
            span = samples[-1].t_s - samples[0].t_s
            moved = samples[-1].preemptions_total - samples[0].preemptions_total
            preemptions = moved / span if span > 0 else None
        return Signals(
            token_hit_rate=cached / prompt if prompt else None,
            request_hit_share=sum(map(self.is_full_hit, requests)) / len(requests),
            prefill_tokens_per_request=(prompt - cached) / len(requests),
            ttft_p95_s=quantile(ttfts, 0.95),
            replicas=replicas,
            req_per_s=len(requests) / duration,
            gpu_s_per_1k=1000.0 * gpu_s / len(requests),
            preemptions_per_s=preemptions,
            offered_req_per_s=offered,
            aborted_per_s=aborted,
        )

    def detail(self, start_s: float, end_s: float) -> WindowDetail:
        """TTFT quantiles split by cache outcome, and throughput, over a window."""
        requests = self._requests(start_s, end_s)
        hits = sorted(r.ttft_s for r in requests if r.ttft_s is not None and self.is_full_hit(r))
        misses = sorted(
            r.ttft_s for r in requests if r.ttft_s is not None and not self.is_full_hit(r)
        )
        every = sorted([*hits, *misses])
        tokens = sum(r.output_tokens for r in requests)
        return WindowDetail(
            ttft_p50_s=quantile(every, 0.5),
            ttft_p99_s=quantile(every, 0.99),
            ttft_p95_hit_s=quantile(hits, 0.95),
            ttft_p95_miss_s=quantile(misses, 0.95),
            ttft_p99_hit_s=quantile(hits, 0.99),
            ttft_p99_miss_s=quantile(misses, 0.99),
            throughput_tok_s=tokens / (end_s - start_s),
            requests=len(requests),
        )

    def replicas_max(self) -> int:
        """Most live pods at any tick."""
        return max((s.replicas for s in self.result.samples), default=0)


def _count_in(sorted_times: Sequence[float], start_s: float, end_s: float) -> int:
    """How many of ``sorted_times`` fall in [start_s, end_s)."""
    return bisect.bisect_left(sorted_times, end_s) - bisect.bisect_left(sorted_times, start_s)


def rounded(values: dict[str, object], digits: int = 4) -> dict[str, object]:
    """Round floats so JSON output is stable and readable."""
    return {
        key: round(value, digits) if isinstance(value, float) else value
        for key, value in values.items()
    }


def signals_dict(signals: Signals) -> dict[str, object]:
    """Signals as the JSON report's SIGNALS object."""
    return rounded(asdict(signals))
