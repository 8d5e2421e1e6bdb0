"""Bounded reads: no answer costs more than the byte cap, and nothing outlives its deadline.

Against real loopback servers that answer hugely, endlessly or slowly: the read stops at
the cap (as sent and as decoded) and at the deadline, and the threads and connections it
used are gone by then, however the server paces its bytes.
"""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from cachescale.gather.prometheus import MAX_RESPONSE_BYTES, PrometheusClient, PrometheusConfig
from cachescale.gather.prometheus_errors import (
    DeadlineReached,
    PrometheusBadResponse,
    PrometheusResponseTooLarge,
)
from cachescale.snapshot import FetchFailure
from tests.gather.bounded_servers import (
    HostileServer,
    Script,
    chunked,
    declared_then_wait,
    gzipped,
    hostile_server,
    huge,
    raw_body,
    trickle,
    trickled_headers,
    vector_body,
)
from tests.gather.gather_fakes import FakePrometheus, fake_prometheus, vector

AT = datetime(2026, 1, 1, tzinfo=UTC)
MB = 1_000_000
MIB = 1024 * 1024
SLACK_SECONDS = 2.0
"""How long after its deadline a query's thread and connection may still be seen."""


def client_for(url: str, **overrides: object) -> PrometheusClient:
    settings: dict[str, object] = {"timeout_seconds": 5.0, "backoff_seconds": 0.0, "retries": 0}
    settings.update(overrides)
    return PrometheusClient(PrometheusConfig(url=url, **settings))  # type: ignore[arg-type]


def promql_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("promql")}


def threads_left(before: set[threading.Thread], within_seconds: float) -> set[threading.Thread]:
    """The query threads not in ``before`` still alive after waiting ``within_seconds``."""
    until = time.monotonic() + within_seconds
    while promql_threads() - before and time.monotonic() < until:
        time.sleep(0.02)
    return promql_threads() - before


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with fake_prometheus() as server:
        yield server


# --- the cap -------------------------------------------------------------------------------


def test_the_default_cap_is_16_mib() -> None:
    assert PrometheusConfig(url="http://p").max_response_bytes == MAX_RESPONSE_BYTES == 16 * MIB


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "until-close"])
def test_a_huge_answer_is_refused_at_the_cap_naming_it_and_where_it_is_set(
    declared: bool,
) -> None:
    with hostile_server(huge(300 * MB, declared=declared)) as server:
        started = time.monotonic()
        with (
            client_for(server.url, max_response_bytes=MIB) as client,
            pytest.raises(PrometheusResponseTooLarge) as caught,
        ):
            client.query("up", AT)
        assert time.monotonic() - started < 2.0
        assert server.settle(0, SLACK_SECONDS) == 0
    assert caught.value.failure is FetchFailure.TOO_LARGE
    assert str(caught.value) == (
        f"Prometheus at {server.url} sent a response over the size limit: more than "
        f"{MIB} bytes (operator flag --prometheus-max-response-bytes, chart value "
        "prometheus.maxResponseBytes)"
    )


def test_a_declared_length_over_the_cap_is_refused_before_reading_anything() -> None:
    """The server sends only headers and waits: a client that tried to read the body
    would wait for the deadline; it is refused at once, and the connection dropped."""
    with hostile_server(declared_then_wait(300 * MB)) as server:
        started = time.monotonic()
        with client_for(server.url) as client, pytest.raises(PrometheusResponseTooLarge):
            client.query("up", AT)
        assert time.monotonic() - started < 1.0
        assert server.settle(0, SLACK_SECONDS) == 0


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "until-close"])
def test_an_answer_of_exactly_the_cap_is_read_and_one_byte_more_is_not(declared: bool) -> None:
    body = vector_body(pods=50)
    script = raw_body(body) if declared else raw_body(body, Connection="close")
    with hostile_server(script) as server:
        with client_for(server.url, max_response_bytes=len(body)) as client:
            assert len(client.query("up", AT)) == 50
        with (
            client_for(server.url, max_response_bytes=len(body) - 1) as client,
            pytest.raises(PrometheusResponseTooLarge),
        ):
            client.query("up", AT)


def test_a_chunked_answer_is_read_across_its_chunks() -> None:
    body = vector_body(pods=200)
    with hostile_server(chunked(body, 1000)) as server, client_for(server.url) as client:
        assert len(client.query("up", AT)) == 200


def test_a_too_large_answer_is_not_retried_and_the_client_still_reads_the_next(
    fake: FakePrometheus,
) -> None:
    fake.respond = lambda _q: vector(*[({"pod": f"p{n}"}, "1") for n in range(20_000)])
    with client_for(fake.url, max_response_bytes=MIB, retries=2) as client:
        with pytest.raises(PrometheusResponseTooLarge):
            client.query("up", AT)
        assert len(fake.queries) == 1
        fake.respond = lambda _q: vector(({"pod": "a"}, "1"))
        assert client.query("up", AT)[0].value == 1.0


def test_the_size_error_never_echoes_the_body() -> None:
    marker = b"internal-metadata-fragment"
    with (
        hostile_server(raw_body(marker * 100_000)) as server,
        client_for(server.url, max_response_bytes=MIB) as client,
        pytest.raises(PrometheusResponseTooLarge) as caught,
    ):
        client.query("up", AT)
    assert marker.decode() not in str(caught.value)


def test_a_huge_error_answer_is_its_status_without_reading_the_body() -> None:
    with hostile_server(huge(300 * MB, status="500 Internal Server Error")) as server:
        started = time.monotonic()
        with client_for(server.url) as client, pytest.raises(PrometheusBadResponse) as caught:
            client.query("up", AT)
        assert time.monotonic() - started < 2.0
        assert server.settle(0, SLACK_SECONDS) == 0
    assert str(caught.value).endswith("sent a bad response: HTTP 500 Internal Server Error")
    assert not isinstance(caught.value, PrometheusResponseTooLarge)


# --- compression ----------------------------------------------------------------------------


def test_a_gzipped_answer_is_decoded() -> None:
    with hostile_server(gzipped(vector_body(pods=300))) as server, client_for(server.url) as client:
        assert len(client.query("up", AT)) == 300


def test_the_cap_applies_to_the_decoded_bytes_so_a_gzip_bomb_stops_at_it() -> None:
    """64 MiB of spaces compress to some 64 KiB, far under the cap on the wire: decoding
    stops just past the cap, never expanding the rest."""
    bomb = b'{"status": "success", "data": {"result": []' + b" " * (64 * MIB) + b"}"
    script = gzipped(bomb)
    with hostile_server(script) as server:
        started = time.monotonic()
        with (
            client_for(server.url, max_response_bytes=MIB) as client,
            pytest.raises(PrometheusResponseTooLarge),
        ):
            client.query("up", AT)
        assert time.monotonic() - started < 1.0


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"
"""A gzip member's header; a deflate block starting 0xff has an invalid type."""


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (raw_body(GZIP_HEADER + b"\xff" * 20, Content_Encoding="gzip"), "is corrupt"),
        (raw_body(gzip.compress(vector_body())[:-12], Content_Encoding="gzip"), "incomplete"),
        (raw_body(vector_body(), Content_Encoding="br"), "encoding that was not asked for"),
    ],
    ids=["corrupt", "truncated", "unasked-encoding"],
)
def test_an_answer_whose_encoding_cannot_be_undone_is_a_bad_response(
    script: Script, reason: str
) -> None:
    with (
        hostile_server(script) as server,
        client_for(server.url) as client,
        pytest.raises(PrometheusBadResponse, match=reason),
    ):
        client.query("up", AT)


def test_only_gzip_is_asked_for(fake: FakePrometheus) -> None:
    with client_for(fake.url) as client:
        client.query("up", AT)
    assert fake.headers[0]["Accept-Encoding"] == "gzip"


# --- the deadline: nothing outlives it ------------------------------------------------------


def endless_queries(server: HostileServer, times: int, timeout: float) -> list[float]:
    """Query ``server`` ``times`` times, each running into its deadline; after each, the
    thread and the connection it used must be gone within ``SLACK_SECONDS``. The
    seconds each query took."""
    before = promql_threads()
    took = []
    with client_for(server.url, timeout_seconds=timeout) as client:
        for _ in range(times):
            started = time.monotonic()
            with pytest.raises(DeadlineReached):
                client.query("up", AT)
            took.append(time.monotonic() - started)
            assert threads_left(before, SLACK_SECONDS) == set()
            assert server.settle(0, SLACK_SECONDS) == 0
    assert server.accepted == times
    return took


def test_an_endless_trickle_leaves_no_thread_or_connection_behind_however_often() -> None:
    """4 KB every 0.5 s: every socket read succeeds in time, the answer never ends."""
    with hostile_server(trickle(4096, 0.5)) as server:
        took = endless_queries(server, times=10, timeout=0.7)
    assert max(took) < 0.7 + 0.3


@pytest.mark.parametrize(
    "script",
    [trickle(1, 0.4), trickled_headers(0.2)],
    ids=["a-byte-every-0.4s", "endless-headers"],
)
def test_a_slow_answer_is_cut_at_the_deadline_in_any_phase(script: Script) -> None:
    with hostile_server(script) as server:
        took = endless_queries(server, times=3, timeout=0.6)
    assert max(took) < 0.6 + 0.3


@pytest.mark.parametrize(
    "script",
    [
        trickled_headers(0.2),
        trickle(1, 0.2),
        trickle(1, 0.2, declared=True),
    ],
    ids=["headers", "body-until-close", "body-kept-alive"],
)
def test_an_abandoned_query_is_cut_so_its_thread_ends_with_the_deadline(script: Script) -> None:
    """Every read succeeds within any socket timeout, so only cutting the connection
    ends the thread with the deadline rather than at the server's pleasure."""
    with hostile_server(script) as server:
        before = promql_threads()
        with client_for(server.url, timeout_seconds=0.5) as client:
            with pytest.raises(DeadlineReached):
                client.query("up", AT)
            assert threads_left(before, 0.3) == set()
            assert server.settle(0, 0.3) == 0


# --- memory, in a process of its own ----------------------------------------------------------

PROBE = """
import json, resource, sys
from datetime import UTC, datetime
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig, PrometheusError

def peak():
    # VmHWM, the peak of this process's own memory: ru_maxrss would carry the peak of the
    # process that forked it (Linux keeps it across execve), e.g. a big test worker.
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

before = peak()
config = PrometheusConfig(url=sys.argv[1], timeout_seconds=120, retries=0)
try:
    with PrometheusClient(config) as client:
        outcome = f"{len(client.query('up', datetime.now(UTC)))} series"
except PrometheusError as error:
    outcome = type(error).__name__
print(json.dumps({"before": before, "peak": peak(), "outcome": outcome}))
"""


def probe_peak(url: str) -> dict[str, object]:
    """Query ``url`` with the default cap in a fresh Python process: its peak RSS (bytes)
    before and after, and the outcome."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, url], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_300_mb_answer_costs_the_reader_little_memory() -> None:
    assert resource.RUSAGE_SELF is not None  # Linux/macOS: ru_maxrss is the peak RSS
    with hostile_server(huge(300 * MB)) as server:
        measured = probe_peak(server.url)
    assert measured["outcome"] == "PrometheusResponseTooLarge"
    before, peak = measured["before"], measured["peak"]
    assert isinstance(before, int)
    assert isinstance(peak, int)
    assert peak - before < 4 * MAX_RESPONSE_BYTES  # the cap, its copy, and slack
    assert peak < 400 * MIB


def test_large_answers_are_parsed_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each parse costs many times its bytes: two at once must not happen for large
    bodies (small ones are not held up)."""
    from cachescale.gather import prometheus

    parsing, most = 0, 0
    count = threading.Lock()
    real = prometheus._DECODER

    class SlowDecoder:
        def decode(self, body: bytes) -> object:
            nonlocal parsing, most
            with count:
                parsing += 1
                most = max(most, parsing)
            time.sleep(0.05)
            with count:
                parsing -= 1
            return real.decode(body)

    monkeypatch.setattr(prometheus, "_DECODER", SlowDecoder())
    large = json.dumps({"data": {"result": [], "pad": " " * prometheus.LARGE_BODY_BYTES}})
    small = json.dumps({"data": {"result": []}})
    client = PrometheusClient(PrometheusConfig(url="http://127.0.0.1:9"))

    def parse_all(body: str) -> int:
        threads = [threading.Thread(target=client._result, args=(body.encode(),)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return most

    assert parse_all(large) == 1
    assert parse_all(small) > 1
