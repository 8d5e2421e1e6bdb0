"""A scripted fake Prometheus HTTP API on loopback, for the gather layer's fault tests.

Each test says what ``/api/v1/query`` answers (a status and a body, or a hang) and reads
back what the client sent. A batch (``promql.combine``) is answered query by query, as
Prometheus evaluates it: each part's answer tagged, the first error the batch's answer.
A real Prometheus is used elsewhere for PromQL semantics; this fake exists to produce the
failures a real one rarely does on demand.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cachescale.gather.selector import QUERY_TAG_LABEL

Answer = tuple[int, bytes]
Responder = Callable[[str], Answer]
HANG = (-1, b"")
"""Answer that never comes (until the server shuts down)."""


def vector(*series: tuple[dict[str, str], str]) -> Answer:
    """A successful instant-vector answer; values are strings as Prometheus sends them."""
    result = [{"metric": labels, "value": [1700000000.0, value]} for labels, value in series]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return 200, json.dumps(body).encode()


def api_error(status: int, error_type: str, error: str) -> Answer:
    """A Prometheus API error body."""
    return status, json.dumps({"status": "error", "errorType": error_type, "error": error}).encode()


_PART_RE = re.compile(
    rf'label_replace\(\n(.*?)\n, "{QUERY_TAG_LABEL}", "(\d+)", "", ""\)(?:\nor\n|$)', re.DOTALL
)


def parts_of(promql: str) -> list[tuple[str, str]]:
    """The (tag, query) parts of a combined query; ``[]`` for a plain one."""
    return [(match[2], match[1]) for match in _PART_RE.finditer(promql)]


def answer_combined(promql: str, respond: Responder) -> Answer:
    """``respond``'s answer to ``promql``, or, for a combined query, the tagged union of
    its answers to each part (the first failing part's answer if any fails)."""
    parts = parts_of(promql)
    if not parts:
        return respond(promql)
    result = []
    for tag, part in parts:
        status, body = respond(part)
        if status != 200:
            return status, body
        for element in json.loads(body)["data"]["result"]:
            element["metric"] = {**element["metric"], QUERY_TAG_LABEL: tag}
            result.append(element)
    answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return 200, json.dumps(answer).encode()


def form_of(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    """A request's parameters: the URL's and, for a POST, its form body's."""
    raw = urlsplit(handler.path).query
    if handler.command == "POST":
        raw += "&" + handler.rfile.read(int(handler.headers["Content-Length"])).decode()
    return {name: values[0] for name, values in parse_qs(raw).items()}


class HangAfter:
    """A responder that lets the first ``answered`` queries through to ``respond`` and
    hangs on every later one: a Prometheus that stalls in the middle of an evaluation."""

    def __init__(self, answered: int, respond: Responder) -> None:
        self._left = answered
        self._respond = respond
        self._lock = threading.Lock()

    def __call__(self, query: str) -> Answer:
        with self._lock:
            self._left -= 1
            if self._left < 0:
                return HANG
        return self._respond(query)


@dataclass
class FakePrometheus:
    """The running fake: ``respond`` maps a PromQL string to an answer."""

    url: str
    respond: Responder = field(default=lambda _query: vector())
    queries: list[str] = field(default_factory=list)
    params: list[dict[str, str]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    answer_headers: dict[str, str] = field(default_factory=dict)
    """Extra headers sent with every answer (a redirect's ``Location``)."""
    released: threading.Event = field(default_factory=threading.Event)


class _Server(ThreadingHTTPServer):
    request_queue_size = 64  # a batch connects at once; the default 5 drops SYNs
    daemon_threads = True


def _handler(fake: FakePrometheus) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            params = form_of(self)
            query = params.get("query", "")
            fake.queries.append(query)
            fake.params.append(params)
            fake.headers.append(dict(self.headers.items()))
            status, body = answer_combined(query, fake.respond)
            if (status, body) == HANG:
                fake.released.wait(timeout=30)
                return
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in fake.answer_headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.do_GET()

        def log_message(self, *_: object) -> None:
            pass

    return Handler


@contextmanager
def fake_prometheus(tls: tuple[Path, Path] | None = None) -> Iterator[FakePrometheus]:
    """Serve a fake on a free loopback port for the duration of the block; over HTTPS
    with ``tls=(certificate, key)``."""
    server = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    fake = FakePrometheus(url=f"{scheme}://127.0.0.1:{server.server_address[1]}")
    server.RequestHandlerClass = _handler(fake)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.released.set()
        server.shutdown()
        server.server_close()


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, made with the openssl command line."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def closed_port_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
