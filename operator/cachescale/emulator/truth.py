"""The simulator's ground truth, per pod, for checking what Prometheus reports against.

Every signal the gather layer computes through PromQL (hit rates, prefill tokens per
request, rates, latency quantiles, mean gauges) has an exact counterpart in the simulator,
which saw every request. The ledger here accumulates it per pod from the engine's counters
and from each finished request, and renders a JSON snapshot that ``cachescale emulate
--ground-truth`` rewrites periodically. Counters are cumulative since the start, so a test
differences two snapshots to get a window; TTFT quantiles cannot be differenced, so they
are also given over a trailing window of simulated time (the Prometheus range window × the
speed). Summary quantiles use numpy's default (linear interpolation).

A window of Prometheus samples does not start or end where a snapshot was taken, so the
ledger also keeps, over the same trailing window, what makes an exact comparison possible:

- every finished request, in the order the pod's histograms observed it (its index is the
  pod's ``_count`` after it minus one), with its TTFT, mean inter-token latency and tokens;
- every scrape the pod served: the wall and simulated instants and the counters and
  gauges exported then. A Prometheus sample is matched to its scrape by timestamp, so a
  test knows exactly which requests a ``rate()`` window counted and which gauge values
  an ``avg_over_time()`` averaged.
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cachescale.sim.fleet import Pod
from cachescale.sim.request import SimRequest

COMPUTED_TOKEN_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Thresholds for the request-weighted view: vLLM's computed-tokens histogram bounds."""
QUANTILES = (0.5, 0.95, 0.99)


Summary = dict[str, float | int | None]


def ttft_summary(samples: Sequence[float]) -> Summary:
    """Count, sum, mean, p50/p95/p99 and max of TTFT samples (None when there are none)."""
    names = [f"p{round(q * 100)}" for q in QUANTILES]
    summary: Summary = {"count": len(samples), "sum": 0.0, "mean": None}
    summary |= dict.fromkeys(names) | {"max": None}
    if samples:
        values = np.asarray(samples, dtype=float)
        summary |= {"sum": float(values.sum()), "mean": float(values.mean())}
        summary |= {"max": float(values.max())}
        for name, value in zip(names, np.quantile(values, QUANTILES), strict=True):
            summary[name] = float(value)
    return summary


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """One finished request as the pod's histograms observed it."""

    finished_s: float
    ttft_s: float
    itl_s: float | None
    """Mean decode step, observed ``output_tokens - 1`` times (None: one output token)."""
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, request: SimRequest) -> FinishedRequest:
        """The record of a finished request (the engine has filled in its outcome)."""
        assert request.cached_tokens is not None
        assert request.first_token_s is not None
        assert request.finished_s is not None
        decode_steps = request.output_tokens - 1
        itl = (request.finished_s - request.first_token_s) / decode_steps if decode_steps else None
        return cls(
            finished_s=request.finished_s,
            ttft_s=request.first_token_s - request.arrival_s,
            itl_s=itl,
            prompt_tokens=request.prompt_tokens,
            cached_tokens=request.cached_tokens,
            output_tokens=request.output_tokens,
        )


REQUEST_FIELDS = tuple(field.name for field in fields(FinishedRequest))


def request_columns(first_index: int, requests: Iterable[FinishedRequest]) -> dict[str, Any]:
    """Requests as JSON columns, with the pod-wide index of the first one."""
    rows = list(requests)
    columns: dict[str, Any] = {"first_index": first_index}
    for name in REQUEST_FIELDS:
        columns[name] = [getattr(row, name) for row in rows]
    return columns


class PodTruth:
    """What one pod really did: engine counters, finished requests and served scrapes."""

    def __init__(self, pod: Pod, window_sim_s: float) -> None:
        self.pod = pod
        self.window_sim_s = window_sim_s
        self.finished = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.computed_at_most = [0] * len(COMPUTED_TOKEN_BOUNDS)
        self.ttft: array[float] = array("d")
        self.recent: deque[FinishedRequest] = deque()
        """Requests finished inside the trailing window, oldest first."""
        self.scrapes: deque[dict[str, Any]] = deque()
        """Scrapes served inside the trailing window, oldest first."""

    def record(self, request: SimRequest) -> None:
        """Account one finished request."""
        finished = FinishedRequest.of(request)
        computed = finished.prompt_tokens - finished.cached_tokens
        self.finished += 1
        self.prompt_tokens += finished.prompt_tokens
        self.cached_tokens += finished.cached_tokens
        for index, bound in enumerate(COMPUTED_TOKEN_BOUNDS):
            if computed <= bound:
                self.computed_at_most[index] += 1
        self.ttft.append(finished.ttft_s)
        self.recent.append(finished)
        self.forget_before(finished.finished_s - self.window_sim_s)

    def record_scrape(self, now_s: float, wall_time_s: float) -> None:
        """Remember what a scrape served at ``now_s`` (take it under the scrape's lock)."""
        self.scrapes.append(
            {"wall_time_s": wall_time_s, "sim_time_s": now_s, **self.gauges(now_s)}
            | self.counters()
            | {"finished_computed_tokens_at_most": self.computed_tokens_at_most()}
        )
        self.forget_before(now_s - self.window_sim_s)

    def forget_before(self, since_s: float) -> None:
        """Drop requests finished and scrapes served before ``since_s``."""
        while self.recent and self.recent[0].finished_s < since_s:
            self.recent.popleft()
        while self.scrapes and self.scrapes[0]["sim_time_s"] < since_s:
            self.scrapes.popleft()

    def recent_ttfts(self) -> list[float]:
        """TTFTs of the requests finished inside the trailing window."""
        return [request.ttft_s for request in self.recent]

    def counters(self) -> dict[str, int]:
        """Cumulative counts, named as in the snapshot."""
        engine = self.pod.engine
        return {
            "prefix_cache_queries_tokens": engine.prefix_cache_queries_tokens,
            "prefix_cache_hits_tokens": engine.prefix_cache_hits_tokens,
            "prompt_tokens": engine.prompt_tokens_total,
            "generation_tokens": engine.generation_tokens_total,
            "preemptions": engine.num_preemptions_total,
            "finished_requests": self.finished,
            "finished_prompt_tokens": self.prompt_tokens,
            "finished_cached_tokens": self.cached_tokens,
            "finished_computed_tokens": self.prompt_tokens - self.cached_tokens,
        }

    def computed_tokens_at_most(self) -> dict[str, int]:
        """Finished requests whose computed prompt tokens are at most each bucket bound."""
        return {
            str(bound): count
            for bound, count in zip(COMPUTED_TOKEN_BOUNDS, self.computed_at_most, strict=True)
        }

    def gauges(self, now_s: float) -> dict[str, float]:
        """The engine's gauges now, and the GPU-seconds held since the start."""
        engine = self.pod.engine
        return {
            "gpu_seconds": self.pod.gpu_seconds_between(0.0, now_s),
            "waiting": engine.num_waiting,
            "running": engine.num_running,
            "kv_usage": engine.kv_usage,
        }

    def snapshot(self, now_s: float, served: bool) -> dict[str, Any]:
        """This pod's truth at ``now_s``, with the trailing window's requests and scrapes."""
        self.forget_before(now_s - self.window_sim_s)
        pod = self.pod
        return {
            "replica": pod.name,
            "served": served,
            "created_s": pod.created_s,
            "ready_s": pod.ready_s,
            "draining_since_s": pod.draining_since_s,
            "gone_s": pod.gone_s,
            "gpus": pod.gpus,
            **self.gauges(now_s),
            **self.counters(),
            "finished_computed_tokens_at_most": self.computed_tokens_at_most(),
            "ttft_s": ttft_summary(self.ttft),
            "ttft_recent_s": ttft_summary(self.recent_ttfts()),
            "recent_requests": request_columns(self.finished - len(self.recent), self.recent),
            "recent_scrapes": list(self.scrapes),
        }


@dataclass(frozen=True)
class FleetState:
    """Fleet-wide facts the ledger does not track itself."""

    live_replicas: int
    ready_replicas: int
    desired_replicas: int
    dropped_requests: int


class GroundTruth:
    """Per-pod ledgers and the JSON snapshot built from them."""

    def __init__(self, header: dict[str, Any], window_sim_s: float) -> None:
        self._header = header
        self._window_sim_s = window_sim_s
        self.pods: dict[str, PodTruth] = {}

    def add_pod(self, label: str, pod: Pod) -> PodTruth:
        """Start a ledger for a new pod."""
        self.pods[label] = truth = PodTruth(pod, self._window_sim_s)
        return truth

    def snapshot(
        self,
        now_s: float,
        wall_time_s: float,
        done: bool,
        fleet: FleetState,
        served: Mapping[str, str],
    ) -> dict[str, Any]:
        """Everything, as one JSON-ready object (take it under the emulator's lock).
        ``served``: the pods served now, by label, with the ``pod`` label each is scraped
        as (the pod's ``target_pod``: its own label, or a real pod's name; None when not
        served)."""
        pods = {
            label: truth.snapshot(now_s, label in served) | {"target_pod": served.get(label)}
            for label, truth in sorted(self.pods.items())
        }
        totals: Counter[str] = Counter()
        for truth in self.pods.values():
            totals.update(truth.counters())  # update() keeps zero counts; sum() would not
        all_ttfts = [ttft for truth in self.pods.values() for ttft in truth.ttft]
        recent = [ttft for truth in self.pods.values() for ttft in truth.recent_ttfts()]
        return {
            **self._header,
            "sim_time_s": now_s,
            "wall_time_s": wall_time_s,
            "done": done,
            "window_sim_s": self._window_sim_s,
            "fleet": {
                "replicas": fleet.live_replicas,
                "ready_replicas": fleet.ready_replicas,
                "desired_replicas": fleet.desired_replicas,
                "dropped_requests": fleet.dropped_requests,
                "gpu_seconds": sum(pod["gpu_seconds"] for pod in pods.values()),
                **totals,
                "ttft_s": ttft_summary(all_ttfts),
                "ttft_recent_s": ttft_summary(recent),
            },
            "pods": pods,
        }
