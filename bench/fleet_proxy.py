"""A Prometheus slow for one chunk: a delaying HTTP proxy in front of the bench's Prometheus.

``bench_fleet --slow-chunk SECONDS`` points the policies of ``Shape.slowed`` (one
Prometheus URL and one window of their own, at most the operator's group size: one
gather group, one chunk) at this proxy instead of at Prometheus. It listens on loopback
and forwards every request (method, path, body, the headers that shape it) to Prometheus
over real HTTP, one thread per request. Until :meth:`SlowProxy.arm` it forwards at once;
from then on each request waits ``SECONDS`` before it is forwarded, longer than the
operator's Prometheus deadline, so every read of that chunk times out (the operator
splits a timed-out group once and reads the halves side by side, and each half times
out too). A request whose client hung up while it was held is not forwarded, as
Prometheus cancels a query its client left. Counted per request
(:meth:`SlowProxy.snapshot`): ``passed`` (forwarded at once), ``delayed`` (held
``SECONDS``) and, of those, ``abandoned`` (its client gone by then).
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

FORWARDED_HEADERS = ("Content-Type", "Accept", "Accept-Encoding", "Authorization")
ANSWERED_HEADERS = ("Content-Type", "Content-Encoding")
UPSTREAM_TIMEOUT_S = 120.0


class Answer(NamedTuple):
    """Prometheus's answer, as relayed: status, the headers kept, body."""

    status: int
    headers: dict[str, str]
    body: bytes


def hung_up(connection: socket.socket) -> bool:
    """Whether the client closed its end (or reset it) while its request waited."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class SlowProxy:
    """Forwards to Prometheus on ``127.0.0.1:upstream_port``; slow once armed."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay_s = 0.0
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def arm(self, delay_s: float) -> None:
        """Every request from now on waits ``delay_s`` before it is forwarded."""
        self.delay_s = delay_s

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def snapshot(self) -> dict[str, float]:
        """Requests so far: ``passed``, ``delayed`` and, of those, ``abandoned``."""
        with self._lock:
            return {k: float(v) for k, v in self.counts.items()}

    def held(self, connection: socket.socket) -> bool:
        """Hold a request for the armed delay; whether it is still to be answered (not
        when its client hung up meanwhile, or the bench is stopping)."""
        delay = self.delay_s
        self.count("delayed" if delay else "passed")
        if not delay:
            return True
        if self._stopping.wait(delay) or hung_up(connection):
            self.count("abandoned")
            return False
        return True

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        """The request sent to Prometheus; its answer."""
        upstream = http.client.HTTPConnection(
            "127.0.0.1", self.upstream_port, timeout=UPSTREAM_TIMEOUT_S
        )
        try:
            upstream.request(method, path, body=body or None, headers=headers)
            response = upstream.getresponse()
            kept = {k: v for k in ANSWERED_HEADERS if (v := response.getheader(k)) is not None}
            return Answer(response.status, kept, response.read())
        finally:
            upstream.close()

    @contextmanager
    def serve(self) -> Iterator[int]:
        """Listen on a free loopback port (yielded) until the context closes."""
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if not proxy.held(self.connection):
                    self.close_connection = True
                    return
                wanted = {k: v for k in FORWARDED_HEADERS if (v := self.headers.get(k))}
                answer = proxy.forward(self.command, self.path, wanted, body)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def do_GET(self) -> None:
                self.relay()

            def do_POST(self) -> None:
                self.relay()

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield int(server.server_address[1])
        finally:
            self._stopping.set()
            server.shutdown()
            server.server_close()
