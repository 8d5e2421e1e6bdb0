"""The allow list decides on the URL the HTTP client connects to: a differential test.

Whenever ``AllowedUrls`` allows a policy URL, the host and port that ``requests`` (and
``urllib3`` under it) would connect to, for the URL as the author wrote it and for the
normalized URL the operator actually hands the client, are an allowed entry's. The URLs
are hostile spellings built from pieces that made other parsers disagree: backslashes,
``@`` and user info, percent-encoding, IPv6 brackets, whitespace and control characters,
mixed case, ports, non-ASCII lookalikes, ``#``, ``?`` and ``;``. Hypothesis runs
derandomized with a bounded number of examples, so CI runs the same few thousand URLs in
a few seconds. A last test connects for real, to two loopback listeners.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from urllib3.util import parse_url

from cachescale.gather.egress import DEFAULT_PORTS, AllowedUrls, UrlRefused

ENTRIES = [
    "http://prom.monitoring:9090",
    "https://thanos.example/prefix",
    "http://[::1]:9090",
    r"re:http://prom-[a-z]+\.monitoring:9090(/.*)?",
]
ALLOWED = AllowedUrls.parse(ENTRIES)
PREFIXES = {("http", "prom.monitoring", 9090), ("https", "thanos.example", 443)}
PREFIXES |= {("http", "[::1]", 9090)}
PATTERN_HOST = re.compile(r"prom-[a-z]+\.monitoring")

SCHEMES = ["http://", "https://", "HTTP://", "hTTps://", "http:/", "http:\\\\", "ftp://", ""]
PIECES = [
    # hosts and ports, allowed and not
    "prom.monitoring", "PROM.Monitoring", "prom-main.monitoring", "prom.monitoring.",
    "thanos.example", "127.0.0.1", "169.254.169.254", "localhost", "evil.example",
    "[::1]", "[::ffff:127.0.0.1]", "[0:0::1]", "::1",
    ":9090", ":443", ":80", ":18080", ":09090", ":", ":0", ":99999",
    # separators that split an authority differently in different parsers
    "\\", "@", "user:pw@", "#", "?", ";", "/", "//", "/prefix", "/prefix/", "/prefixed",
    "/./", "/../", "/%2e%2e/", ".", "..",
    # whole authority prefixes that end where one parser ends the host and another not
    "127.0.0.1:18080\\@", "127.0.0.1:18080@", "127.0.0.1:18080#@", "127.0.0.1:18080?@",
    "evil.example\\", "evil.example:80\\@", "169.254.169.254%40", "[::1]\\@",
    # encodings, whitespace, controls, lookalikes
    "%40", "%2f", "%5c", "%2e", "%00", "%25", " ", "\t", "\n", "\r", "\x00", "\x7f",
    "\u3002", "\uff0e", "\u2024", "ｐｒｏｍ", "é", "\u200b", "\ufeff",
]  # fmt: skip


ORIGINS = [
    "http://prom.monitoring:9090", "HTTP://PROM.Monitoring:09090", "https://thanos.example",
    "hTTps://thanos.example:443", "http://[::1]:9090", "http://prom-main.monitoring:9090",
]  # fmt: skip
PATHS = ["", "/", "/prefix", "/prefix/a", "/api/prom", "/a;b=c"]
SLIPPED = st.sampled_from(PIECES) | st.text(alphabet="\\@#?;/:%[]. \t.aZ09", max_size=3)


@st.composite
def hostile_urls(draw: st.DrawFn) -> str:
    """Either pieces in any order after a scheme, or an allowed-looking URL with a few
    pieces or raw characters slipped in anywhere."""
    if draw(st.booleans()):
        pieces = draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=7))
        return draw(st.sampled_from(SCHEMES)) + "".join(pieces)
    parts = [draw(st.sampled_from(ORIGINS)), draw(st.sampled_from(PATHS))]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        text = "".join(parts)
        authority = text.find("//") + 2  # where a slipped piece does most harm
        spot = draw(st.sampled_from([authority]) | st.integers(0, len(text)))
        parts = [text[:spot], draw(SLIPPED), text[spot:]]
    return "".join(parts)


def client_reaches(url: str) -> tuple[str, str, int]:
    """Where requests connects for ``url``: the prepared request's URL, as urllib3 (whose
    connection pool parses it again when sending) reads it."""
    prepared = requests.Request("POST", url).prepare()
    parsed = parse_url(prepared.url or "")
    scheme = parsed.scheme or ""
    return scheme, (parsed.host or "").lower(), parsed.port or DEFAULT_PORTS.get(scheme, 0)


def is_allowed_destination(destination: tuple[str, str, int]) -> bool:
    """Whether an allowed entry names this scheme, host and port."""
    scheme, host, port = destination
    by_pattern = (scheme, port) == ("http", 9090) and PATTERN_HOST.fullmatch(host) is not None
    return destination in PREFIXES or by_pattern


def check(url: str) -> bool:
    """The property for one URL; whether it was allowed."""
    try:
        normalized = ALLOWED.admits(url)
    except UrlRefused:
        return False
    if normalized is None:
        return False
    assert is_allowed_destination(client_reaches(url)), url
    # What the operator really sends: the normalized URL with the API path appended.
    assert is_allowed_destination(client_reaches(f"{normalized}/api/v1/query")), url
    assert client_reaches(url) == client_reaches(normalized), url
    return True


def test_whenever_the_list_allows_the_client_connects_to_an_allowed_entry() -> None:
    seen: Counter[bool] = Counter()

    @settings(
        max_examples=1200,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(hostile_urls())
    def run(url: str) -> None:
        seen[check(url)] += 1

    run()
    # Not vacuous: the generator reaches both sides of the decision.
    assert seen[True] >= 50, seen
    assert seen[False] >= 600, seen


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:18080\\@prom.monitoring:9090",  # docs/security.md's example
        "http://prom.monitoring:9090\\@127.0.0.1:18080",
        "http://127.0.0.1:18080@prom.monitoring:9090",
        "http://prom.monitoring:9090@127.0.0.1:18080",
        "http://127.0.0.1:18080#@prom.monitoring:9090",
        "http://127.0.0.1:18080?@prom.monitoring:9090",
        "http://127.0.0.1:18080;@prom.monitoring:9090",
        "http://127.0.0.1:18080%40prom.monitoring:9090",
        "http://prom.monitoring%2f@127.0.0.1:18080",
        "http://prom.monitoring:9090%5c@127.0.0.1:18080",
        "http://prom.monitoring\t:9090",
        "http://prom.monitoring\u3002:9090",
        "http:\\\\prom.monitoring:9090",
        "http:/prom.monitoring:9090",
        "http://[::1]:9090@127.0.0.1:18080",
        "http://[::1%2509]:9090",
    ],
)
def test_known_bypasses_are_refused(url: str) -> None:
    assert not ALLOWED.allows(url)


def test_the_known_allowed_spellings_pass_the_property() -> None:
    for url in (
        "http://prom.monitoring:9090",
        "HTTP://PROM.monitoring:9090/api/prom/",
        "https://thanos.example:443/prefix/tenant;a=b",
        "http://[::1]:9090",
        "http://prom-main.monitoring:9090/x",
    ):
        assert check(url), url


class _Recorder(BaseHTTPRequestHandler):
    """Counts the requests that reach it; answers an empty Prometheus vector."""

    def do_POST(self) -> None:
        self.server.hits += 1  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def listener() -> Iterator[ThreadingHTTPServer]:
    """An HTTP server on a free loopback port, counting the requests it receives."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.hits = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_real_connections_reach_only_the_allowed_listener() -> None:
    with listener() as allowed, listener() as sink:
        good, bad = allowed.server_address[1], sink.server_address[1]
        entries = AllowedUrls.parse([f"http://127.0.0.1:{good}"])
        spellings = [
            f"http://127.0.0.1:{bad}\\@127.0.0.1:{good}",
            f"http://127.0.0.1:{bad}#@127.0.0.1:{good}",
            f"http://127.0.0.1:{good}@127.0.0.1:{bad}",
            f"http://127.0.0.1:{bad}%40127.0.0.1:{good}",
        ]
        for url in spellings:
            assert not entries.allows(url), url
        # Sent as written, the first spelling really reaches the sink: the refusal matters.
        requests.post(spellings[0], timeout=5)
        assert sink.hits == 1
        normalized = entries.admits(f"HTTP://127.0.0.1:{good}/")
        assert normalized == f"http://127.0.0.1:{good}"
        answer = requests.post(f"{normalized}/api/v1/query", data={"query": "up"}, timeout=5)
        assert answer.status_code == 200
        assert (allowed.hits, sink.hits) == (1, 1)
