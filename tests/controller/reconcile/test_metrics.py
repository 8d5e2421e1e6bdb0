"""The operator's own metrics: the names the chart's rules and dashboard read, unknown
signals as absent series (never 0), and a deleted policy's series gone; the served
exposition byte for byte the library's, in each format it negotiates, over HTTP too."""

from __future__ import annotations

import gzip
import threading
import tracemalloc
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest, start_http_server
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics

from cachescale.controller.reconcile.metrics import OperatorMetrics
from cachescale.controller.reconcile.policy_series import (
    FAMILIES,
    LABELS,
    POLICY_GAUGES,
    PolicyRecord,
    rendered_format,
)
from cachescale.controller.runtime.metrics_server import start_metrics_server
from cachescale.decide import decide
from cachescale.decide.learned import LearnedState
from tests.decide.decide_builders import learned, signals, snapshot, spec

HIT_RATE = "cachescale_token_hit_rate{"


def exposition(metrics: OperatorMetrics) -> str:
    """What ``/metrics`` serves a plain GET (the Prometheus text format)."""
    return metrics.exposition(generate_latest).decode()


def test_a_decision_becomes_the_documented_series() -> None:
    metrics = OperatorMetrics()
    state = snapshot(signals(hit=0.04))
    memory = learned()
    for _ in range(3):
        decision = decide(spec(), state, memory, state.signals.observed_at)
        memory = decision.memory
    metrics.observe("llm", "vllm", spec(), state, decision)
    metrics.evaluated("llm", "vllm", 0.25, 1_700_000_000.0)
    text = exposition(metrics)
    labels = 'namespace="llm",policy="vllm"'
    for line in (
        f"cachescale_token_hit_rate{{{labels}}} 0.04",
        f"cachescale_gpu_seconds_per_1k_requests{{{labels}}} 680.0",
        f"cachescale_budget_gpu_seconds_per_1k_requests{{{labels}}} 780.0",
        f"cachescale_slo_ttft_p95_seconds{{{labels}}} 1.0",
        f"cachescale_replicas{{{labels}}} 11.0",
        f"cachescale_baseline_token_hit_rate{{{labels}}} 0.85",
        f"cachescale_baseline_prefill_tokens_per_request{{{labels}}} 400.0",
        f"cachescale_baseline_gpu_seconds_per_1k_requests{{{labels}}} 680.0",
        f'cachescale_alert_active{{{labels},reason="PrefixCollapse"}} 1.0',
        f'cachescale_alert_active{{{labels},reason="OverBudget"}} 0.0',
        f"cachescale_last_evaluation_timestamp_seconds{{{labels}}} 1.7e+09",
        "cachescale_evaluation_duration_seconds_count 1.0",
    ):
        assert line in text, line
    assert f'cachescale_decisions_total{{{labels},reason="{decision.reason}"}} 1.0' in text


def test_no_baseline_is_absent_not_zero() -> None:
    # A policy that has not learned what healthy looks like exports no baseline series.
    metrics = OperatorMetrics()
    state = snapshot(signals())
    decision = decide(spec(), state, LearnedState(), state.signals.observed_at)
    assert decision.memory.baseline.token_hit_rate is None
    metrics.observe("llm", "vllm", spec(), state, decision)
    text = exposition(metrics)
    assert "cachescale_baseline_token_hit_rate{" not in text
    assert "cachescale_baseline_gpu_seconds_per_1k_requests{" not in text
    assert HIT_RATE in text  # the policy's other series are there


def test_unknown_is_absent_and_deletion_forgets() -> None:
    metrics = OperatorMetrics()
    state = snapshot(signals(ttft_p95_seconds=None))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    metrics.observe("llm", "vllm", spec(), state, decision)
    metrics.failed("llm", "vllm", "PrometheusUnreachable")
    text = exposition(metrics)
    assert 'cachescale_ttft_p95_seconds{namespace="llm"' not in text
    assert 'cachescale_arrivals_per_second{namespace="llm"' not in text  # no estimate made
    labels = 'kind="PrometheusUnreachable",namespace="llm",policy="vllm"'  # sorted
    assert f"cachescale_evaluation_errors_total{{{labels}}} 1.0" in text
    metrics.forget("llm", "vllm")
    assert 'policy="vllm"' not in exposition(metrics)


def test_served_and_offered_load_side_by_side() -> None:
    metrics = OperatorMetrics()
    state = snapshot(signals(arrivals_per_second=41.0))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    metrics.observe("llm", "vllm", spec(), state, decision)
    text = exposition(metrics)
    labels = 'namespace="llm",policy="vllm"'
    assert f"cachescale_requests_per_second{{{labels}}} 32.0" in text
    assert f"cachescale_arrivals_per_second{{{labels}}} 41.0" in text


def test_the_schedulers_punctuality_is_fleet_wide() -> None:
    metrics = OperatorMetrics()
    metrics.started_late(0.3)
    metrics.started_late(12.0)
    metrics.missed_intervals(2)
    text = exposition(metrics)
    assert "cachescale_evaluation_lateness_seconds_count 2.0" in text
    assert 'cachescale_evaluation_lateness_seconds_bucket{le="0.5"} 1.0' in text
    assert "cachescale_evaluation_missed_intervals_total 2.0" in text
    metrics.forget("llm", "vllm")  # a policy's deletion leaves the fleet's series alone
    assert "cachescale_evaluation_missed_intervals_total 2.0" in exposition(metrics)


def observed_fleet(metrics: OperatorMetrics, policies: int) -> None:
    """Each of ``policies`` policies observed and evaluated twice, as in a steady state."""
    state = snapshot(signals(hit=0.04))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    for index in range(policies):
        for _ in range(2):
            metrics.observe("llm", f"policy-{index}", spec(), state, decision)
            metrics.evaluated("llm", f"policy-{index}", 0.1, 1_700_000_000.0)


def test_a_policys_series_cost_a_few_kib_not_a_child_each() -> None:
    """About twenty series per policy: a record per policy, not a ``prometheus_client``
    child per series (the bound below)."""
    tracemalloc.start()
    try:
        metrics = OperatorMetrics()
        observed_fleet(metrics, 1_000)
        traced, _ = tracemalloc.get_traced_memory()  # while ``metrics`` holds its series
    finally:
        tracemalloc.stop()
    assert traced / 1_000 < 4 * 1024


def test_a_scrape_during_evaluations_sees_whole_records() -> None:
    """The exposition thread reads while evaluations add and forget policies."""
    metrics = OperatorMetrics()
    observed_fleet(metrics, 50)
    done = threading.Event()

    def churn() -> None:
        while not done.is_set():
            observed_fleet(metrics, 60)
            for index in range(50, 60):
                metrics.forget("llm", f"policy-{index}")

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(20):
            text = exposition(metrics)
            hit_rates = [line for line in text.splitlines() if line.startswith(HIT_RATE)]
            assert len(hit_rates) >= 50
            assert all(line.endswith(" 0.04") for line in hit_rates)
    finally:
        done.set()
        worker.join()


def varied_fleet() -> OperatorMetrics:
    """Policies in every state a record has: gauges absent and present, alerts active,
    inactive and not yet decided, decisions and failures counted, one forgotten, label
    values to escape; and the operator-wide series, observed."""
    metrics = OperatorMetrics()
    state = snapshot(signals(hit=0.04, ttft_p95_seconds=None))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    metrics.observe("llm", "a", spec(), state, decision)
    metrics.observe("llm", "a", spec(), state, decision)
    metrics.evaluated("llm", "a", 0.25, 1_700_000_000.5)
    metrics.failed("llm", "a", "PrometheusUnreachable")
    metrics.failed("llm", "a", "PatchConflict")
    metrics.evaluated("other", "never-decided", 0.1, 1_700_000_001.0)
    metrics.failed("other", "never-decided", "NoTarget")
    metrics.observe("llm", "gone", spec(), state, decision)
    metrics.forget("llm", "gone")

    def odd(record: PolicyRecord) -> None:  # values the library writes its own way
        record.gauges = [None, 1e-07, 1234567.0, 12345678.0, float("inf"), float("nan"), -0.0]
        record.gauges += [2.5, -3.0, 1e22, *[None] * (len(POLICY_GAUGES) - 10)]
        record.active_alerts = frozenset({"PrefixCollapse", "OverBudget"})
        record.decisions = {'odd "reason"\\n': 7.0, "Hold": 1e300}

    metrics._policies.update(('ns"\\', "line\nbreak"), odd)
    metrics.started_late(0.3)
    metrics.missed_intervals(2)
    metrics.kube_request("get")
    metrics.jobs_waiting({"namespace": 3})
    return metrics


FAST = [
    None,  # no Accept header (curl): text 0.0.4
    "text/plain; version=0.0.4",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,"
    "*/*;q=0.2",  # Prometheus 3's
    "application/openmetrics-text; version=2.0.0; escaping=underscores",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "text/plain; version=1.0.0; escaping=underscores",
]
LIBRARY_RENDERED = [  # escapings that rename these series: the library renders them
    "text/plain; version=1.0.0; escaping=dots",
    "application/openmetrics-text; version=1.0.0; escaping=values",
]


@pytest.mark.parametrize("accept", FAST + LIBRARY_RENDERED)
def test_the_exposition_is_the_librarys_byte_for_byte(accept: str | None) -> None:
    """The oracle: the library's encoder over the registry, whose per-policy collector
    builds ``prometheus_client`` families from the same records."""
    metrics = varied_fleet()
    encoder, _ = choose_encoder(accept)  # type: ignore[arg-type]  # None as the server's
    assert (rendered_format(encoder) is not None) == (accept in FAST)  # which path is tested
    ours = metrics.exposition(encoder)
    assert ours == encoder(metrics.registry)
    text = ours.decode()
    assert 'policy="gone"' not in text
    assert text.count("# EOF") == (1 if "openmetrics" in (accept or "") else 0)
    assert text.endswith("# EOF\n") == ("openmetrics" in (accept or ""))


def test_an_empty_fleet_still_describes_every_family() -> None:
    metrics = OperatorMetrics()
    for accept in ("", openmetrics.CONTENT_TYPE_LATEST):
        encoder, _ = choose_encoder(accept)
        text = metrics.exposition(encoder).decode()
        assert text == encoder(metrics.registry).decode()
        described = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
        assert described[: len(FAMILIES)] == [
            f"{f.name}_total" if f.type == "counter" and not accept else f.name for f in FAMILIES
        ]
        assert "cachescale_evaluation_jobs_waiting" in described[len(FAMILIES) :]


def test_the_label_names_need_no_escaping_in_any_scheme() -> None:
    """The records' label text is written once, for every format and escaping."""
    names = {*LABELS, *(family.label for family in FAMILIES if family.label)}
    for escaping in (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8, openmetrics.DOTS):
        assert {openmetrics.escape_label_name(name, escaping) for name in names} == names


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[OperatorMetrics, str, str]]:
    """The operator's server and the library's, on one fleet: their base URLs."""
    metrics = varied_fleet()
    ours, ours_thread = start_metrics_server(0, metrics, "127.0.0.1")
    library, library_thread = start_http_server(0, "127.0.0.1", registry=metrics.registry)
    try:
        yield (
            metrics,
            f"http://127.0.0.1:{ours.server_port}",
            f"http://127.0.0.1:{library.server_port}",
        )
    finally:
        for server, thread in ((ours, ours_thread), (library, library_thread)):
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def fetch(
    url: str, headers: dict[str, str], method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, dict(response.headers), response.read()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Accept": "application/openmetrics-text; version=1.0.0"},
        {"Accept-Encoding": "gzip"},
        {"Accept": "application/openmetrics-text", "Accept-Encoding": "deflate, gzip;q=0.9"},
    ],
)
def test_served_over_http_as_the_library_serves(
    servers: tuple[OperatorMetrics, str, str], headers: dict[str, str]
) -> None:
    metrics, ours, library = servers
    status, got, body = fetch(ours + "/metrics", headers)
    expected_status, expected, expected_body = fetch(library + "/metrics", headers)
    assert status == expected_status == 200
    for header in ("Content-Type", "Content-Encoding"):
        assert got.get(header) == expected.get(header), header
    assert got["Content-Length"] == str(len(body))
    if "gzip" in headers.get("Accept-Encoding", ""):
        assert got["Content-Encoding"] == "gzip"  # another level, and the time: compare inflated
        body, expected_body = gzip.decompress(body), gzip.decompress(expected_body)
    else:
        assert got["Content-Length"] == expected["Content-Length"]
    assert body == expected_body
    assert 'cachescale_token_hit_rate{namespace="llm",policy="a"} 0.04' in body.decode()
    encoder, _ = choose_encoder(headers.get("Accept", ""))
    assert body == encoder(metrics.registry)


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/metrics?name[]=cachescale_evaluation_missed_intervals_total", "GET"),
        ("/metrics?name[]=cachescale_replicas", "GET"),
        ("/favicon.ico", "GET"),
        ("/metrics", "OPTIONS"),
    ],
)
def test_the_rest_of_the_librarys_answers(
    servers: tuple[OperatorMetrics, str, str], path: str, method: str
) -> None:
    _, ours, library = servers
    assert fetch(ours + path, {}, method) == fetch(library + path, {}, method)
