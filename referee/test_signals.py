"""Check 1: every signal ``cachescale signals`` reads from a real vLLM equals raw PromQL.

A real vLLM serves a minute of multi-turn chat load (``referee.load``) while a real
Prometheus scrapes it with a pod scrape's labels. ``cachescale signals --json`` is run as
a user runs it, over that window and at its end (``--at``); every signal it prints is then
computed again by this module's own PromQL, written from vLLM's metric names and the
definitions in docs/signals.md (never from ``cachescale.gather``), at the same evaluation
time over the same window, and the two must be equal to float rounding: hit rates, the
full-hit share, prefill and context tokens per request, TTFT p50/p95/p99 and ITL p95
(Prometheus's ``histogram_quantile`` against cachescale's own quantiles), served and
arriving requests per second, preemptions, waiting and running requests per pod and KV
usage, fleet-wide and for the pod. The profile must be ``vllm>=0.13``, each signal known
(the load makes every one of them defined), and GPU-seconds unknown: no GPU, no
kube-state-metrics, so cachescale must say why rather than report 0. The engine's cache
configuration must read as vLLM was started. The figures of a run are in docs/signals.md,
"Checked against real vLLM".
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from referee.conftest import NAMESPACE, POD, WINDOW_S, ChatWindow
from referee.vllm import MODEL_NAME, EngineSettings
from tests.prometheus_fixture import PrometheusServer

SELECTOR = f'namespace="{NAMESPACE}",model_name="{MODEL_NAME}"'
FULL_HIT_TOKENS = 200
"""cachescale's default full-hit threshold, a bound of vLLM's computed-tokens histogram."""
SUCCESS = 'finished_reason=~"stop|length|repetition"'
"""vLLM 0.32's finish reasons other than abort and error: a request served."""
FULL_HIT_LE = f'le=~"{FULL_HIT_TOKENS}|{FULL_HIT_TOKENS}[.]0"'
"""The full-hit bucket, however the client writes its bound."""


def exactly(value: float) -> Any:
    """Equal up to float rounding: the same samples, the same arithmetic, in another order."""
    return pytest.approx(value, rel=1e-9, abs=1e-12)


def _select(metric: str, extra: str = "") -> str:
    matchers = ",".join(part for part in (SELECTOR, extra) if part)
    return f"{metric}{{{matchers}}}"


def raw_promql(window: str) -> dict[str, str]:
    """Each fleet signal as one PromQL expression, straight from vLLM's series."""

    def rate(metric: str, extra: str = "") -> str:
        return f"sum(rate({_select(metric, extra)}[{window}]))"

    def quantile(q: float, histogram: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate({_select(histogram)}[{window}])))"

    def mean(gauge: str) -> str:
        return f"avg_over_time({_select(gauge)}[{window}])"

    def per_pod_mean(gauge: str) -> str:
        return f"avg(sum by (pod) ({mean(gauge)}))"

    def delta(gauge: str) -> str:
        return f"sum(delta({_select(gauge)}[{window}]))"

    hits, queries = rate("vllm:prefix_cache_hits_total"), rate("vllm:prefix_cache_queries_total")
    computed = "vllm:request_prefill_kv_computed_tokens"
    requests = rate(computed + "_count")
    served = rate("vllm:request_success_total", SUCCESS)
    seconds = window.removesuffix("s")
    growth = f"{delta('vllm:num_requests_waiting')} + {delta('vllm:num_requests_running')}"
    context = f"{rate('vllm:prompt_tokens_total')} + {rate('vllm:generation_tokens_total')}"
    ttft, itl = "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"
    return {
        "token_hit_rate_local": f"{hits} / {queries}",
        "token_hit_rate_with_external": (
            f"({hits} + {rate('vllm:external_prefix_cache_hits_total')}) / {queries}"
        ),
        "request_full_hit_share": f"{rate(computed + '_bucket', FULL_HIT_LE)} / {requests}",
        "prefill_tokens_per_request": f"{rate(computed + '_sum')} / {requests}",
        "ttft_p50_seconds": quantile(0.5, ttft),
        "ttft_p95_seconds": quantile(0.95, ttft),
        "ttft_p99_seconds": quantile(0.99, ttft),
        "itl_p95_seconds": quantile(0.95, itl),
        "requests_per_second": served,
        "arrivals_per_second": (
            f"clamp_min({rate('vllm:request_success_total')} + ({growth}) / {seconds}, 0)"
        ),
        "preemptions_per_second": rate("vllm:num_preemptions_total"),
        "waiting_requests_per_pod": per_pod_mean("vllm:num_requests_waiting"),
        "running_requests_per_pod": per_pod_mean("vllm:num_requests_running"),
        "kv_cache_usage_ratio": f"avg({mean('vllm:kv_cache_usage_perc')})",
        "context_tokens_per_request": f"({context}) / {served}",
    }


def raw_pod_promql(window: str) -> dict[str, str]:
    """The per-pod signals, each by ``pod``."""

    def rate(metric: str) -> str:
        return f"sum by (pod) (rate({_select(metric)}[{window}]))"

    def mean(gauge: str) -> str:
        return f"sum by (pod) (avg_over_time({_select(gauge)}[{window}]))"

    looked_up = rate("vllm:prefix_cache_queries_total")
    return {
        "token_hit_rate": f"{rate('vllm:prefix_cache_hits_total')} / {looked_up}",
        "prompt_tokens_looked_up_per_second": looked_up,
        "waiting_requests": mean("vllm:num_requests_waiting"),
        "running_requests": mean("vllm:num_requests_running"),
        "kv_cache_usage_ratio": mean("vllm:kv_cache_usage_perc"),
    }


def evaluate(prometheus: PrometheusServer, promql: str, at: float) -> dict[str, float]:
    """An instant query at ``at``: each series' value by its ``pod`` label ("" without)."""
    data = prometheus.api("query", query=promql, time=f"{at:.3f}")
    assert data["resultType"] == "vector", (promql, data)
    return {row["metric"].get("pod", ""): float(row["value"][1]) for row in data["result"]}


def single(values: dict[str, float], promql: str) -> float:
    """The one value a fleet-wide query gives."""
    assert len(values) == 1, (promql, values)
    return next(iter(values.values()))


def cachescale_signals(prometheus: PrometheusServer, window: ChatWindow) -> dict[str, Any]:
    """``cachescale signals --json`` over the window, at its end, as a user runs it."""
    command = [
        sys.executable, "-m", "cachescale.commands.main", "signals",
        "--prometheus", prometheus.url, "--engine", "vllm", "--selector", SELECTOR,
        "--window", window.window, "--at", f"{window.at:.0f}", "--json", "--timeout", "30",
        "--full-hit-max-computed-tokens", str(FULL_HIT_TOKENS),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def reading(prometheus: PrometheusServer, chat_window: ChatWindow) -> dict[str, Any]:
    """What ``cachescale signals`` printed for the window (the load ran without failure)."""
    assert not chat_window.run.failures, chat_window.run.failures[:5]
    return cachescale_signals(prometheus, chat_window)


@pytest.fixture(scope="module")
def raw(prometheus: PrometheusServer, chat_window: ChatWindow) -> dict[str, float]:
    """Each fleet signal by raw PromQL at the window's end."""
    return {
        name: single(evaluate(prometheus, promql, chat_window.at), promql)
        for name, promql in raw_promql(chat_window.window).items()
    }


def test_the_profile_is_vllm_0_13(reading: dict[str, Any]) -> None:
    assert reading["profile"] == "vllm>=0.13"


def test_every_signal_is_checked(reading: dict[str, Any]) -> None:
    checked = set(raw_promql(f"{WINDOW_S}s")) | {"gpu_seconds_per_1k_requests"}
    assert set(reading["signals"]) == checked


@pytest.mark.parametrize("name", list(raw_promql(f"{WINDOW_S}s")))
def test_signal_equals_raw_promql(
    reading: dict[str, Any], raw: dict[str, float], name: str
) -> None:
    signal = reading["signals"][name]
    print(f"{name}: cachescale {signal['value']!r}, raw PromQL {raw[name]!r}")  # -rP shows it
    assert signal["value"] is not None, signal["reason"]
    assert math.isfinite(raw[name]), (name, raw[name])
    assert signal["value"] == exactly(raw[name])


def test_the_load_makes_the_signals_telling(reading: dict[str, Any], raw: dict[str, float]) -> None:
    """Not a window of zeros: hits and misses both, full hits and cold requests, a queue."""
    assert 0 < raw["token_hit_rate_local"] < 1
    assert 0 < raw["request_full_hit_share"] < 1
    assert raw["requests_per_second"] > 1
    assert raw["running_requests_per_pod"] > 1
    assert raw["kv_cache_usage_ratio"] > 0
    assert reading["full_hit_max_computed_tokens"] == FULL_HIT_TOKENS


def test_gpu_seconds_are_unknown_not_zero(reading: dict[str, Any]) -> None:
    gpu = reading["signals"]["gpu_seconds_per_1k_requests"]
    assert gpu["value"] is None
    assert "GPUs per pod" in gpu["reason"]


def test_the_pod_signals_equal_raw_promql(
    reading: dict[str, Any], prometheus: PrometheusServer, chat_window: ChatWindow
) -> None:
    (pod,) = reading["pods"]
    assert pod["pod"] == POD
    assert pod["age_seconds"]["value"] is None  # no Kubernetes API, no kube-state-metrics
    for name, promql in raw_pod_promql(chat_window.window).items():
        expected = evaluate(prometheus, promql, chat_window.at)
        assert pod[name]["value"] == exactly(expected[POD]), name


def test_the_cache_configuration_is_read_as_vllm_was_started(
    reading: dict[str, Any], engine_settings: EngineSettings
) -> None:
    assert reading["cache_config"]["engines"] == [
        {
            "pod": POD,
            "hash_algo": "sha256",
            "prefix_caching": True,
            "block_size": engine_settings.block_size,
        }
    ]
