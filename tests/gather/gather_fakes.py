"""A scripted fake Prometheus HTTP API on loopback, for the gather layer's fault tests.

Each test says what ``/api/v1/query`` answers (a status and a body, or a hang) and reads
back what the client sent. A real Prometheus is used elsewhere for PromQL semantics; this
fake exists to produce the failures a real one rarely does on demand.
"""

from __future__ import annotations

import json
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
            params = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            query = params.get("query", "")
            fake.queries.append(query)
            fake.params.append(params)
            fake.headers.append(dict(self.headers.items()))
            status, body = fake.respond(query)
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
