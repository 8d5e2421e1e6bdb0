"""Prometheus access: every transport failure becomes one typed error naming the URL."""

from __future__ import annotations

import gc
import math
import re
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cachescale.gather.deadline import Deadline
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig, redact_url
from cachescale.gather.prometheus_errors import (
    DeadlineReached,
    PrometheusBadResponse,
    PrometheusError,
    PrometheusQueryError,
    PrometheusTimeout,
    PrometheusUnreachable,
)
from cachescale.snapshot import FetchFailure
from tests.gather.gather_fakes import (
    HANG,
    FakePrometheus,
    HangAfter,
    api_error,
    closed_port_url,
    fake_prometheus,
    self_signed_certificate,
    vector,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)
TOKEN = "s3cret-token-value"


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with fake_prometheus() as server:
        yield server


def client_for(url: str, **overrides: object) -> PrometheusClient:
    settings: dict[str, object] = {"timeout_seconds": 2.0, "backoff_seconds": 0.0}
    settings.update(overrides)
    return PrometheusClient(PrometheusConfig(url=url, **settings))  # type: ignore[arg-type]


def test_instant_vector_is_parsed_with_nan_and_infinities(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: vector(({"pod": "a"}, "0.5"), ({"pod": "b"}, "NaN"), ({}, "+Inf"))
    with client_for(fake.url) as client:
        series = client.query("up", AT)
    assert series[0].labels == {"pod": "a"}
    assert series[0].value == 0.5
    assert math.isnan(series[1].value)
    assert series[2].value == math.inf


def test_a_decoded_answer_leaves_nothing_for_the_garbage_collector_to_track() -> None:
    """A group's answer is tens of thousands of samples decoded at once: tracked, they
    would be promoted through the collector's generations while it is decoded."""
    client = client_for("http://127.0.0.1:9")
    body = b'{"data": {"result": [{"metric": {"pod": "a"}, "value": [1, "+Inf"]}]}}'
    (sample,) = client._result(body)
    assert not gc.is_tracked(sample)
    assert not gc.is_tracked(sample.value)
    assert not gc.is_tracked(sample.metric)


def test_queries_are_evaluated_at_the_given_time_with_what_remains_as_server_timeout(
    fake: FakePrometheus,
) -> None:
    now = [100.0]  # a monotonic clock that only moves when told
    config = PrometheusConfig(url=fake.url, timeout_seconds=7)
    with PrometheusClient(config, clock=lambda: now[0]) as client:
        client.query('up{job="x"}', AT)
        deadline = client.deadline()
        now[0] += 4.5
        client.until(deadline).query("up", AT)
    assert fake.params == [
        {"query": 'up{job="x"}', "time": f"{AT.timestamp():.3f}", "timeout": "7000ms"},
        {"query": "up", "time": f"{AT.timestamp():.3f}", "timeout": "2500ms"},
    ]


def test_connection_refused_is_unreachable_with_one_clear_line() -> None:
    url = closed_port_url()
    with client_for(url, retries=1) as client, pytest.raises(PrometheusUnreachable) as caught:
        client.query("up", AT)
    message = str(caught.value)
    assert message.startswith(f"Prometheus is unreachable at {url}: ")
    assert "refused" in message.lower()
    assert "\n" not in message
    assert caught.value.failure is FetchFailure.UNREACHABLE


def test_hanging_server_times_out_without_retrying(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: HANG
    started = time.monotonic()
    with (
        client_for(fake.url, timeout_seconds=0.3, retries=3) as client,
        pytest.raises(PrometheusTimeout, match=r"no answer within 0\.3s"),
    ):
        client.query("up", AT)
    assert time.monotonic() - started < 2.0
    assert len(fake.queries) == 1


def test_the_deadline_is_one_budget_with_the_time_spent_read_off_the_clock() -> None:
    now = [50.0]
    deadline = Deadline.start(10, clock=lambda: now[0])
    now[0] += 4.0
    assert (deadline.elapsed(), deadline.remaining()) == (4.0, 6.0)
    now[0] += 7.25
    assert deadline.remaining() == 0.0
    assert deadline.reached() == "no answer within 10s: the deadline was reached after 11.2s"


def test_sequential_queries_share_one_deadline_and_report_the_time_spent(
    fake: FakePrometheus,
) -> None:
    def slow(_query: str) -> tuple[int, bytes]:
        time.sleep(0.6)
        return vector()

    fake.respond = slow
    started = time.monotonic()
    with client_for(fake.url, timeout_seconds=1.0) as client:
        bounded = client.until(client.deadline())
        assert bounded.query("up", AT) == []
        with pytest.raises(DeadlineReached) as caught:
            bounded.query("up", AT)  # 0.6 s more would overrun the 1 s budget
    assert time.monotonic() - started < 1.3
    expected = (
        f"Prometheus at {fake.url} timed out: no answer within 1s: the deadline was reached after "
    )
    assert str(caught.value) in {expected + "1.0s", expected + "1.1s", expected + "1.2s"}
    assert caught.value.failure is FetchFailure.TIMEOUT


def promql_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("promql")}


def test_a_batch_that_stalls_ends_at_the_deadline_and_leaves_no_thread_behind(
    fake: FakePrometheus,
) -> None:
    fake.respond = HangAfter(1, lambda _q: vector())
    before = promql_threads()
    queries = {n: f"up{{n='{n}'}}" for n in range(5)}
    started = time.monotonic()
    with (
        client_for(fake.url, timeout_seconds=1.0) as client,
        pytest.raises(DeadlineReached) as caught,
    ):
        client.query_many(queries, AT)
    assert time.monotonic() - started < 1.3
    assert re.search(
        r"no answer within 1s: the deadline was reached after 1\.[0-2]s$",
        str(caught.value),
    )
    # The batch in flight was abandoned, not awaited: its connection was cut at the
    # deadline, so its thread ends then, while the server still holds the request.
    gone_by = time.monotonic() + 1.0
    while promql_threads() - before and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert promql_threads() - before == set()
    assert not fake.released.is_set()


class SlowToRead(PrometheusClient):
    """Reads each answer slowly, as a busy operator does a group's megabytes of JSON."""

    def _result(self, body: bytes) -> Any:
        time.sleep(0.6)
        return super()._result(body)


def test_the_deadline_bounds_the_wait_for_the_answer_not_its_reading(
    fake: FakePrometheus,
) -> None:
    """An answer that arrived in time is read however long that takes: reading it under
    the deadline called the operator's own CPU contention a Prometheus timeout."""
    fake.respond = lambda _q: vector(({"pod": "a"}, "0.5"))
    config = PrometheusConfig(url=fake.url, timeout_seconds=0.5)
    with SlowToRead(config) as client:
        started = time.monotonic()
        assert client.query_many({"up": "up"}, AT)["up"][0].value == 0.5
    assert time.monotonic() - started >= 0.6


@pytest.fixture
def trickling() -> Iterator[str]:
    """A server that sends headers, then one byte of body every 0.2 s: every read
    succeeds within any socket timeout, but the answer never completes."""
    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            while not stop.wait(0.2):
                self.wfile.write(b" ")
                self.wfile.flush()

        def do_POST(self) -> None:
            self.do_GET()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_an_answer_that_never_completes_is_left_behind_at_the_deadline(trickling: str) -> None:
    started = time.monotonic()
    with (
        client_for(trickling, timeout_seconds=1.0) as client,
        pytest.raises(DeadlineReached, match=r"no answer within 1s: the deadline was reached"),
    ):
        client.query("up", AT)
    assert time.monotonic() - started < 1.3


def test_retries_and_their_pauses_stay_within_the_deadline(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: (503, b"overloaded")
    started = time.monotonic()
    with (
        client_for(fake.url, timeout_seconds=4.0, retries=5, backoff_seconds=1.0) as client,
        pytest.raises(PrometheusBadResponse, match="HTTP 503"),
    ):
        client.query("up", AT)
    # Attempts at 0 s, 0 s and 2 s (pauses 0 and 2 s); the next pause, 4 s, is past the
    # deadline, so the last failure is reported instead of sleeping through it. The first
    # two attempts may take up to 2 s on a loaded machine and still leave room for the third.
    assert time.monotonic() - started < 4.0
    assert len(fake.queries) == 3


def test_http_500_is_retried_a_bounded_number_of_times_then_a_bad_response(
    fake: FakePrometheus,
) -> None:
    fake.respond = lambda _q: (500, b"internal error")
    with client_for(fake.url, retries=2) as client, pytest.raises(PrometheusBadResponse) as caught:
        client.query("up", AT)
    assert len(fake.queries) == 3
    assert "HTTP 500" in str(caught.value)


def test_malformed_json_is_a_bad_response(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: (200, b'{"status": "success", "data": {')
    with client_for(fake.url) as client, pytest.raises(PrometheusBadResponse, match="not JSON"):
        client.query("up", AT)


@pytest.mark.parametrize(
    "body",
    [
        b'{"status": "success"}',
        b'{"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}',
        b'{"status": "success", "data": {"result": [{"metric": {}, "value": [1, "x"]}]}}',
        b'{"status": "success", "data": {"result": [{"metric": {"a": 1}, "value": [1, "2"]}]}}',
        b"[1, 2]",
    ],
)
def test_json_that_is_not_an_instant_vector_is_a_bad_response(
    fake: FakePrometheus, body: bytes
) -> None:
    fake.respond = lambda _q: (200, body)
    with client_for(fake.url) as client, pytest.raises(PrometheusBadResponse):
        client.query("up", AT)


def test_rejected_query_is_a_query_error_with_its_error_type(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: api_error(400, "bad_data", 'parse error: unexpected "}"')
    with client_for(fake.url) as client, pytest.raises(PrometheusQueryError) as caught:
        client.query("up{", AT)
    assert str(caught.value).endswith("rejected a query: HTTP 400 Bad Request (bad_data)")
    assert len(fake.queries) == 1


BODY_MARKER = "internal-metadata-fragment"
"""Text an SSRF target would answer with: it must never reach an error message."""


@pytest.mark.parametrize(
    "answer",
    [
        api_error(500, "internal", BODY_MARKER),
        api_error(400, BODY_MARKER, BODY_MARKER),
        api_error(422, "execution", BODY_MARKER),
        (403, f"<html>{BODY_MARKER}</html>".encode()),
        (599, BODY_MARKER.encode()),
        (200, f'{{"status": "success", "data": {{"result": ["{BODY_MARKER}"]}}}}'.encode()),
        (200, f'{{"status": "success", "data": {{"result": "{BODY_MARKER}"}}}}'.encode()),
        (200, f"<html>{BODY_MARKER}</html>".encode()),
    ],
    ids=[
        "500-json",
        "400-unknown-type",
        "422",
        "403-html",
        "599",
        "bad-element",
        "no-list",
        "html",
    ],
)
def test_errors_never_echo_the_answer_body(fake: FakePrometheus, answer: tuple[int, bytes]) -> None:
    fake.respond = lambda _q: answer
    with client_for(fake.url, retries=0) as client, pytest.raises(PrometheusError) as caught:
        client.query("up", AT)
    assert BODY_MARKER not in str(caught.value)
    assert fake.url.removeprefix("http://") in str(caught.value)


def test_a_redirect_to_another_host_is_not_followed_and_gets_no_token(
    fake: FakePrometheus,
) -> None:
    with fake_prometheus() as elsewhere:
        other_host = elsewhere.url.replace("127.0.0.1", "localhost")
        fake.respond = lambda _q: (302, BODY_MARKER.encode())
        fake.answer_headers["Location"] = f"{other_host}/api/v1/query?query=up"
        config = PrometheusConfig(url=fake.url, bearer_token=TOKEN, retries=0)
        with PrometheusClient(config) as client, pytest.raises(PrometheusBadResponse) as caught:
            client.query("up", AT)
        assert str(caught.value).endswith("HTTP 302 Found: redirects are not followed")
        assert elsewhere.queries == []
        assert len(fake.queries) == 1


def test_prometheus_own_query_timeout_is_a_timeout_and_not_retried(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: api_error(503, "timeout", "query timed out in expression evaluation")
    with client_for(fake.url, retries=2) as client, pytest.raises(PrometheusTimeout):
        client.query("up", AT)
    assert len(fake.queries) == 1  # it was told what remained of the deadline: none is left


def test_bearer_token_is_sent_but_never_shown(fake: FakePrometheus) -> None:
    fake.respond = lambda _q: api_error(401, "unauthorized", "bad token")
    config = PrometheusConfig(url=fake.url, bearer_token=TOKEN, retries=0)
    with PrometheusClient(config) as client, pytest.raises(PrometheusBadResponse) as caught:
        client.query("up", AT)
    assert fake.headers[0]["Authorization"] == f"Bearer {TOKEN}"
    assert "check the bearer token" in str(caught.value)
    assert TOKEN not in str(caught.value)
    assert TOKEN not in repr(config)


def test_credentials_in_the_url_are_never_shown() -> None:
    assert redact_url("https://user:pw@prom.example:9090/prefix?x=1") == (
        "https://prom.example:9090/prefix"
    )
    url = closed_port_url().replace("http://", "http://user:pw@")
    with client_for(url, retries=0) as client, pytest.raises(PrometheusUnreachable) as caught:
        client.query("up", AT)
    assert "pw" not in str(caught.value)


@pytest.fixture
def tls_fake(tmp_path: Path) -> Iterator[tuple[FakePrometheus, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is needed to make a test certificate")
    cert, key = self_signed_certificate(tmp_path)
    with fake_prometheus(tls=(cert, key)) as server:
        yield server, cert


def test_tls_is_verified_by_default(tls_fake: tuple[FakePrometheus, Path]) -> None:
    fake, _ = tls_fake
    with client_for(fake.url, retries=0) as client, pytest.raises(PrometheusUnreachable) as caught:
        client.query("up", AT)
    assert "TLS verification failed" in str(caught.value)
    assert fake.queries == []


def test_tls_is_verified_against_the_given_ca_bundle(tls_fake: tuple[FakePrometheus, Path]) -> None:
    fake, cert = tls_fake
    with client_for(fake.url, ca_file=str(cert)) as client:
        assert client.query("up", AT) == []


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_verification_can_be_skipped(tls_fake: tuple[FakePrometheus, Path]) -> None:
    fake, _ = tls_fake
    with client_for(fake.url, verify_tls=False) as client:
        assert client.query("up", AT) == []


def test_many_queries_are_issued_together_and_keyed(fake: FakePrometheus) -> None:
    fake.respond = lambda q: vector(({"q": q}, "1"))
    with client_for(fake.url) as client:
        results = client.query_many({"a": "up", "b": "down"}, AT)
    assert {key: [s.labels["q"] for s in series] for key, series in results.items()} == {
        "a": ["up"],
        "b": ["down"],
    }


def test_one_failing_query_fails_the_whole_batch(fake: FakePrometheus) -> None:
    fake.respond = lambda q: api_error(422, "execution", "boom") if q == "bad" else vector()
    with client_for(fake.url) as client, pytest.raises(PrometheusQueryError, match="HTTP 422"):
        client.query_many({"good": "up", "bad": "bad"}, AT)
