"""The engines' series of the bench's fleet: one HTTP thread serving every policy's vLLM
exposition, in shards of :data:`SHARD` policies, each a Prometheus scrape target.

No emulator process (at 10,000 policies it would be 10,000 scrape targets): each policy's
engine is ``bench/vllm_engine.prom`` (one emulated vLLM pod) with the labels a PodMonitor
would give (``namespace``, ``model_name``, ``pod``), its counters advancing at the rate
they had there. Per policy, with the layout of ``bench/fleet_shape.py``:

* its prefix-cache hits are its hit rate (``Shape.hit_share``) of the lookups, and the
  prefill tokens computed (the sum of ``vllm:request_prefill_kv_computed_tokens``) the
  rest of the prompt tokens; that histogram's buckets stay the template's;
* a moving policy, while it falls, adds hits at half its rate, computes the prompt
  tokens it missed, queues :data:`QUEUED_PER_S` more requests each second (its
  ``vllm:num_requests_waiting``; drained as fast once the fall ends, so its arrivals
  outrun what it serves, then fall behind it) and every request it finishes waits
  :data:`SLOW_TTFT_S` for its first token (over the bench policies' 1 s SLO);
* its pod's counters start at 0 when the pod starts (``restarted``: a new name from
  then on); the first pods started :data:`ENGINE_AGE_S` before the engines did, so
  their counters open at the template's values.

Every counter is the sum of a steady and a falling rate, each times the seconds spent in
that state since the pod started: counters never decrease while a pod lives.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.fleet_shape import Shape, groupable, name_of

ENGINE = Path(__file__).with_name("vllm_engine.prom")
ENGINE_AGE_S = 280.0
"""Simulated seconds behind ``vllm_engine.prom``'s counters: they grow by value/age per s."""
SHARD = 500
SLOW_TTFT_S = 1.5
"""A falling engine's time to first token: inside the template's (1, 2.5] s bucket."""
QUEUED_PER_S = 0.5
"""How fast a falling engine's queue grows: a tenth of what it serves (about 6 per s)."""
HITS = "vllm:prefix_cache_hits_total"
LOOKUPS = "vllm:prefix_cache_queries_total"
PROMPT = "vllm:prompt_tokens_total"
COMPUTED = "vllm:request_prefill_kv_computed_tokens_sum"
WAITING = "vllm:num_requests_waiting"
TTFT = "vllm:time_to_first_token_seconds"


class Engines:
    """The exposition of every policy's engine, cut into shards of :data:`SHARD`."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.started = time.time()
        self.pods = [(f"{name_of(k)}-0", self.started - ENGINE_AGE_S) for k in range(shape.count)]
        """Each policy's pod now: its name and when its engine started (epoch seconds)."""
        kinds: dict[str, str] = {}
        series: list[tuple[str, str, float, bool]] = []
        for line in ENGINE.read_text(encoding="utf-8").splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split()
                kinds[family] = kind
            elif line and not line.startswith("#"):
                head, value = line.rsplit(" ", 1)
                name, _, labels = head.partition("{")
                family = re.sub(r"_(bucket|sum|count)$", "", name)
                growing = kinds.get(family, kinds.get(name)) != "gauge"
                series.append((name, labels.rstrip("}"), float(value), growing))
        self.heads = [(name, labels) for name, labels, _, _ in series]
        self.growing = [growing for *_, growing in series]
        self.steady = [value for _, _, value, _ in series]
        self.falling = [_falling(name, labels, value, series) for name, labels, value, _ in series]
        names = [name for name, _ in self.heads]
        self.hits, self.computed = names.index(HITS), names.index(COMPUTED)
        self.waiting = names.index(WAITING)
        self.lookups = self.steady[names.index(LOOKUPS)]
        self.prompt = self.steady[names.index(PROMPT)]

    def restarted(self, k: int, pod: str, at: float) -> None:
        """Policy ``k``'s engine runs in pod ``pod`` from ``at`` on, its counters from 0."""
        self.pods[k] = (pod, at)

    def values(self, k: int, now: float) -> list[float]:
        """Policy ``k``'s engine's value of each template series at ``now``."""
        pod_start = self.pods[k][1]
        fell = self.shape.fallen_s(k, self.started, now)
        fell -= self.shape.fallen_s(k, self.started, pod_start)
        kept = (now - pod_start - fell) / ENGINE_AGE_S
        fell /= ENGINE_AGE_S
        out = [
            steady * kept + falling * fell if growing else steady
            for steady, falling, growing in zip(
                self.steady, self.falling, self.growing, strict=True
            )
        ]
        share = self.shape.hit_share(k)
        out[self.hits] = self.lookups * (share * kept + share / 2 * fell)
        out[self.computed] = self.prompt * ((1 - share) * kept + (1 - share / 2) * fell)
        out[self.waiting] += QUEUED_PER_S * self.shape.backlog_s(k, self.started, now)
        return out

    def shard(self, index: int) -> bytes:
        """Shard ``index``'s exposition now, each sample stamped with the time its value
        is for: Prometheus would otherwise stamp it with the scrape's start, and on a
        loaded machine the render's lag behind that varies by tenths of a second, enough
        to move a 2-minute rate (and the cost per request read from it) by its display
        precision."""
        now = time.time()
        stamp = round(now * 1000)
        lines = []
        for k in range(index * SHARD, min(self.shape.count, (index + 1) * SHARD)):
            name = name_of(k)
            own = "" if groupable(k) else f',adapter_{name}="lora"'
            namespace, pod = self.shape.namespace(k), self.pods[k][0]
            labels = f'namespace="{namespace}",model_name="{name}",pod="{pod}"{own}'
            for (metric, extra), value in zip(self.heads, self.values(k, now), strict=True):
                lines.append(f"{metric}{{{labels},{extra}}} {value!r} {stamp}\n")
        return "".join(lines).encode()

    @contextmanager
    def serve(self) -> Iterator[int]:
        """Serve ``/shard/N`` on a free port until the context closes."""
        engines = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = engines.shard(int(self.path.rsplit("/", 1)[1]))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield int(server.server_address[1])
        finally:
            server.shutdown()


def _falling(
    name: str, labels: str, value: float, series: list[tuple[str, str, float, bool]]
) -> float:
    """A template series' value while its engine falls, per :data:`ENGINE_AGE_S`: every
    request's first token after :data:`SLOW_TTFT_S`, the rest as steady (the hits and the
    prefill computed are set per policy, ``Engines.values``)."""
    if not name.startswith(TTFT) or name.endswith("_count"):
        return value
    count = next(v for n, lab, v, _ in series if n == f"{TTFT}_count" and lab == _engine(labels))
    if name.endswith("_sum"):
        return count * SLOW_TTFT_S
    bound = re.search(r'le="([^"]+)"', labels)
    assert bound is not None, labels
    return count if float(bound.group(1)) >= SLOW_TTFT_S else 0.0


def _engine(labels: str) -> str:
    """A series' labels without ``le``: its histogram's ``_count`` labels."""
    return ",".join(part for part in labels.split(",") if not part.startswith("le="))
