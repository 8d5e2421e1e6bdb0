"""Check 4's harness: the simulator's closed-loop chat clients against a real vLLM, and the
same engine and clients in the simulator, measured alike.

The clients are the simulator's own (``cachescale.sim.clients.ChatClient``), seeded as the
scenario file seeds them, so each real client sends the prompts its simulated twin sends,
turn for turn; a real client's next turn carries the answer vLLM gave (its token ids,
``return_token_ids``), as the simulated one carries the answer it drew. Each client sends
its next turn when its answer arrives, until the deadline; the last answers are awaited.

What is compared, measured the same way on both sides:

- *token hit rate*: cached prompt tokens / prompt tokens over every answered request
  (vLLM's per-request ``usage.prompt_tokens_details.cached_tokens``; the simulator's
  ``SimRequest.cached_tokens``, both fixed at the request's first scheduling);
- *preemptions*: ``vllm:num_preemptions_total`` over the run; the simulator's
  ``num_preemptions`` summed over its requests;
- *TTFT quantiles*: interpolated within the buckets of vLLM's
  ``vllm:time_to_first_token_seconds`` histogram (its increase over the run), the
  simulator's exact TTFTs put into the same buckets;
- *inter-token latency*, the mean decode step under the run's load:
  ``vllm:inter_token_latency_seconds``' mean; the simulator's decode time per generated
  token after the first.

The servers run with vLLM's torch on one thread (``run_engine``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from cachescale.audit.live import parse_samples
from cachescale.sim.clients import ChatClient, system_prompts
from cachescale.sim.engine_spec import max_model_len
from cachescale.sim.run import RunResult
from cachescale.sim.scenario import Scenario
from referee.vllm import EngineSettings, VllmServer, run_vllm

TTFT = "vllm:time_to_first_token_seconds"
PREEMPTIONS = "vllm:num_preemptions_total"
STEPS = "vllm:iteration_tokens_total_count"
ITL = "vllm:inter_token_latency_seconds"
THREADS = 1
"""vLLM's torch runs one thread: with two (the cores), every step waits for both, and a core
taken by anything else on the machine (the clients, the API server, other work) stalls
steps many times over; the tiny model gains nothing from the second thread."""


@dataclass
class Measured:
    """One run's figures: requests, prompt and cached tokens, preemptions, TTFT buckets."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    ttft_buckets: list[tuple[float, float]] = field(default_factory=list)
    """(upper bound, cumulative count), as a Prometheus histogram's ``le`` series."""
    failures: list[str] = field(default_factory=list)
    itl_s: float = math.nan
    """Mean inter-token latency: a decode step's time under the run's load."""
    steps: int = 0
    """Engine steps over the run (``vllm:iteration_tokens_total``'s count): with the
    run's length, the mean step time the calibration is checked against."""
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft(self, q: float) -> float:
        """The ``q`` quantile of TTFT, as ``histogram_quantile`` interpolates it."""
        return bucket_quantile(self.ttft_buckets, q)


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """``histogram_quantile``: linear within the bucket the rank falls in."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def _ttft_series(text: str) -> list[tuple[float, float]]:
    series: dict[float, float] = {}
    for name, labels, value in parse_samples(text):
        if name == f"{TTFT}_bucket":
            bound = float(labels["le"])
            series[bound] = series.get(bound, 0.0) + value
    return sorted(series.items())


def _counter(text: str, name: str) -> float:
    return sum(value for sample, _, value in parse_samples(text) if sample == name)


class _RealClients:
    """The clients' shared record while they run against a server."""

    def __init__(self, server: VllmServer, until: float) -> None:
        self.server = server
        self.until = until
        self.lock = threading.Lock()
        self.measured = Measured()

    def run(self, client: ChatClient) -> None:
        """Send turns until the deadline; stop at the first failure."""
        while time.time() < self.until:
            prompt, max_tokens = client.next_turn()
            try:
                answer = self.server.complete(prompt, max_tokens, token_ids=True)
            except OSError as error:
                with self.lock:
                    self.measured.failures.append(f"{type(error).__name__}: {error}")
                return
            usage = answer["usage"]
            details = usage.get("prompt_tokens_details") or {}
            client.answered(list(answer["choices"][0]["token_ids"]))
            with self.lock:
                self.measured.requests += 1
                self.measured.prompt_tokens += int(usage["prompt_tokens"])
                self.measured.cached_tokens += int(details.get("cached_tokens") or 0)


@contextmanager
def run_engine(workdir: Path, settings: EngineSettings) -> Iterator[VllmServer]:
    """``run_vllm`` with vLLM's torch on ``THREADS`` threads."""
    with run_vllm(workdir, replace(settings, threads=THREADS)) as server:
        yield server


def drive_real(server: VllmServer, scenario: Scenario, seconds: float) -> Measured:
    """The scenario's clients against ``server`` for ``seconds``, and what it did."""
    spec = scenario.clients
    assert spec is not None, f"{scenario.name} has no clients"
    systems = system_prompts(spec, scenario.seed)
    longest = max_model_len(scenario.fleet.engine)
    clients = [
        ChatClient(spec, systems, scenario.seed, index, longest) for index in range(spec.count)
    ]
    before = server.metrics()
    started = time.time()
    shared = _RealClients(server, started + seconds)
    with ThreadPoolExecutor(spec.count, thread_name_prefix="chat-client") as pool:
        for future in [pool.submit(shared.run, client) for client in clients]:
            future.result()
    after = server.metrics()
    measured = shared.measured
    measured.seconds = time.time() - started
    measured.steps = round(_counter(after, STEPS) - _counter(before, STEPS))
    itl_count = _counter(after, f"{ITL}_count") - _counter(before, f"{ITL}_count")
    itl_sum = _counter(after, f"{ITL}_sum") - _counter(before, f"{ITL}_sum")
    measured.itl_s = itl_sum / itl_count if itl_count else math.nan
    measured.preemptions = round(_counter(after, PREEMPTIONS) - _counter(before, PREEMPTIONS))
    start = dict(_ttft_series(before))
    measured.ttft_buckets = [(b, c - start.get(b, 0.0)) for b, c in _ttft_series(after)]
    return measured


def measure_sim(result: RunResult, bounds: Sequence[float], requests: int) -> Measured:
    """The same figures over the first ``requests`` a simulated run answered (by finish
    time), TTFTs put into the buckets ``bounds``.

    A closed loop moves along its conversations by answers, not by seconds: compared at
    the number of requests real vLLM answered, both sides are at the same point of every
    client's conversation, however much of the machine the real server got."""
    answered = [r for r in result.finished if r.cached_tokens is not None]
    answered.sort(key=lambda r: (r.finished_s or 0.0, r.request_id))
    done = answered[:requests]
    ttfts = sorted(r.ttft_s for r in done if r.ttft_s is not None)
    buckets = [(bound, float(sum(1 for t in ttfts if t <= bound))) for bound in bounds]
    decoding = [r for r in done if r.finished_s is not None and r.first_token_s is not None]
    gaps = sum(r.output_tokens - 1 for r in decoding)
    decode_s = sum((r.finished_s or 0.0) - (r.first_token_s or 0.0) for r in decoding)
    return Measured(
        itl_s=decode_s / gaps if gaps else math.nan,
        requests=len(done),
        prompt_tokens=sum(r.prompt_tokens for r in done),
        cached_tokens=sum(r.cached_tokens or 0 for r in done),
        preemptions=sum(r.num_preemptions for r in done),
        ttft_buckets=buckets,
    )
