"""The simulator's ground truth, per pod, for checking what Prometheus reports against.

Every signal the gather layer computes through PromQL (hit rates, prefill tokens per
request, rates, TTFT quantiles) has an exact counterpart in the simulator, which saw every
request. The ledger here accumulates it per pod from the engine's counters and from each
finished request, and renders a JSON snapshot that ``cachescale emulate --ground-truth``
rewrites periodically. Counters are cumulative since the start, so a test differences two
snapshots to get a window; TTFT quantiles cannot be differenced, so they are also given
over a trailing window of simulated time (the Prometheus range window × the speed).
Quantiles use numpy's default (linear interpolation between order statistics).
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
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


class PodTruth:
    """What one pod really did: engine counters plus per-request sums and TTFTs."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.finished = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.computed_at_most = [0] * len(COMPUTED_TOKEN_BOUNDS)
        self.ttft: array[float] = array("d")
        self.recent: deque[tuple[float, float]] = deque()
        """``(finished_s, ttft_s)`` of requests inside the trailing window."""

    def record(self, request: SimRequest) -> None:
        """Account one finished request."""
        assert request.cached_tokens is not None
        assert request.ttft_s is not None
        assert request.finished_s is not None
        computed = request.prompt_tokens - request.cached_tokens
        self.finished += 1
        self.prompt_tokens += request.prompt_tokens
        self.cached_tokens += request.cached_tokens
        for index, bound in enumerate(COMPUTED_TOKEN_BOUNDS):
            if computed <= bound:
                self.computed_at_most[index] += 1
        self.ttft.append(request.ttft_s)
        self.recent.append((request.finished_s, request.ttft_s))

    def recent_ttfts(self, since_s: float) -> list[float]:
        """TTFTs of requests finished at or after ``since_s`` (older ones are forgotten)."""
        while self.recent and self.recent[0][0] < since_s:
            self.recent.popleft()
        return [ttft for finished_s, ttft in self.recent if finished_s >= since_s]

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

    def snapshot(self, now_s: float, since_s: float, served: bool) -> dict[str, Any]:
        """This pod's truth at ``now_s``; the recent TTFTs are those since ``since_s``."""
        pod, engine = self.pod, self.pod.engine
        return {
            "replica": pod.name,
            "served": served,
            "created_s": pod.created_s,
            "ready_s": pod.ready_s,
            "draining_since_s": pod.draining_since_s,
            "gone_s": pod.gone_s,
            "gpus": pod.gpus,
            "gpu_seconds": pod.gpu_seconds_between(0.0, now_s),
            "waiting": engine.num_waiting,
            "running": engine.num_running,
            "kv_usage": engine.kv_usage,
            **self.counters(),
            "finished_computed_tokens_at_most": {
                str(bound): count
                for bound, count in zip(COMPUTED_TOKEN_BOUNDS, self.computed_at_most, strict=True)
            },
            "ttft_s": ttft_summary(self.ttft),
            "ttft_recent_s": ttft_summary(self.recent_ttfts(since_s)),
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
        self.pods[label] = truth = PodTruth(pod)
        return truth

    def snapshot(
        self, now_s: float, wall_time_s: float, done: bool, fleet: FleetState, served: set[str]
    ) -> dict[str, Any]:
        """Everything, as one JSON-ready object (take it under the emulator's lock)."""
        since_s = now_s - self._window_sim_s
        pods = {
            label: truth.snapshot(now_s, since_s, label in served)
            for label, truth in sorted(self.pods.items())
        }
        totals: Counter[str] = Counter()
        for truth in self.pods.values():
            totals.update(truth.counters())  # update() keeps zero counts; sum() would not
        all_ttfts = [ttft for truth in self.pods.values() for ttft in truth.ttft]
        recent = [ttft for truth in self.pods.values() for ttft in truth.recent_ttfts(since_s)]
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
