"""Hostile HTTP servers on loopback for the bounded-read tests: huge, endless, trickling.

Each serves every request with one ``Script`` (a function writing a raw HTTP answer to the
socket) and counts the connections it has accepted and not yet closed, so a test can tell
whether the client let go of them. A body is generated as it is written, never held: a
300 MB answer costs the server a few kilobytes.
"""

from __future__ import annotations

import gzip
import json
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO

Gone = Callable[[float], bool]
"""Waits up to that many seconds; True once the client has closed the connection (or the
server stops)."""
Script = Callable[[BinaryIO, Gone], None]
"""Writes an answer to the socket's file until done or until the client is gone."""

FILLER = b" " * 65536
"""JSON whitespace: any amount of it keeps an answer's start valid."""


def _read_request(rfile: BinaryIO) -> None:
    """Read a request's head and its form body (``Content-Length``)."""
    length = 0
    while line := rfile.readline(65537):
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    rfile.read(length)


def head(status: str = "200 OK", **headers: str) -> bytes:
    """A response's status line and headers (names with ``_`` for ``-``)."""
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def vector_body(pods: int = 1) -> bytes:
    """A valid instant-vector answer with ``pods`` series."""
    result = [{"metric": {"pod": f"p{n}"}, "value": [1700000000, "1"]} for n in range(pods)]
    return json.dumps({"status": "success", "data": {"result": result}}).encode()


def huge(total_bytes: int, *, declared: bool = False, status: str = "200 OK") -> Script:
    """``total_bytes`` of (valid) JSON, generated while written; with ``declared`` its
    ``Content-Length`` is sent, else the end is the connection's close."""
    prefix = b'{"status": "success", "data": {"result": []}'
    suffix = b"}"

    def script(out: BinaryIO, _gone: Gone) -> None:
        headers = {"Content_Length": str(total_bytes)} if declared else {"Connection": "close"}
        out.write(head(status, **headers) + prefix)
        left = total_bytes - len(prefix) - len(suffix)
        while left > 0:  # a client that is gone makes a write fail
            piece = FILLER[: min(left, len(FILLER))]
            out.write(piece)
            left -= len(piece)
        out.write(suffix)
        out.flush()

    return script


def trickle(piece_bytes: int, every_seconds: float, *, declared: bool = False) -> Script:
    """Headers, then ``piece_bytes`` of an endless body every ``every_seconds``; with
    ``declared``, a (never reached) ``Content-Length`` keeps the connection alive."""

    def script(out: BinaryIO, gone: Gone) -> None:
        headers = {"Content_Length": str(10**6)} if declared else {"Connection": "close"}
        out.write(head(**headers) + b'{"status": "success", "data": {"result": []')
        out.flush()
        while not gone(every_seconds):
            out.write(b" " * piece_bytes)
            out.flush()

    return script


def trickled_headers(every_seconds: float) -> Script:
    """The status line, then one byte of an endless header every ``every_seconds``."""

    def script(out: BinaryIO, gone: Gone) -> None:
        out.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        out.flush()
        while not gone(every_seconds):
            out.write(b"a")
            out.flush()

    return script


def declared_then_wait(total_bytes: int) -> Script:
    """A ``Content-Length`` of ``total_bytes``, then nothing until the server stops."""

    def script(out: BinaryIO, gone: Gone) -> None:
        out.write(head(Content_Length=str(total_bytes)))
        out.flush()
        gone(30)

    return script


def gzipped(body: bytes, *, encoding: str = "gzip") -> Script:
    """``body`` compressed with gzip, sent with ``Content-Encoding: encoding``."""
    packed = gzip.compress(body, compresslevel=9)
    return raw_body(packed, Content_Encoding=encoding)


def raw_body(body: bytes, **headers: str) -> Script:
    """``body`` as it is, with its length and ``headers``."""

    def script(out: BinaryIO, _gone: Gone) -> None:
        out.write(head(Content_Length=str(len(body)), **headers) + body)
        out.flush()

    return script


def chunked(body: bytes, piece_bytes: int) -> Script:
    """``body`` in ``Transfer-Encoding: chunked`` pieces of ``piece_bytes``."""

    def script(out: BinaryIO, _gone: Gone) -> None:
        out.write(head(Transfer_Encoding="chunked"))
        for start in range(0, len(body), piece_bytes):
            piece = body[start : start + piece_bytes]
            out.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        out.write(b"0\r\n\r\n")
        out.flush()

    return script


@dataclass
class HostileServer:
    """The running server: ``script`` answers every request."""

    url: str
    script: Script
    stop: threading.Event = field(default_factory=threading.Event)
    accepted: int = 0
    _open: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        """The loopback port it listens on."""
        return int(self.url.rsplit(":", 1)[1])

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed."""
        with self._lock:
            return self._open

    def opened(self) -> None:
        with self._lock:
            self._open += 1
            self.accepted += 1

    def closed(self) -> None:
        with self._lock:
            self._open -= 1

    def settle(self, count: int, within_seconds: float) -> int:
        """Wait until ``count`` connections are open, for at most ``within_seconds``;
        the number open then."""
        until = time.monotonic() + within_seconds
        while self.open_connections != count and time.monotonic() < until:
            time.sleep(0.02)
        return self.open_connections


@contextmanager
def hostile_server(script: Script) -> Iterator[HostileServer]:
    """Serve ``script`` on a free loopback port for the duration of the block."""
    holder: list[HostileServer] = []

    class Handler(socketserver.StreamRequestHandler):
        def gone(self, seconds: float) -> bool:
            readable, _, _ = select.select([self.connection], [], [], seconds)
            if holder[0].stop.is_set():
                return True
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)

        def handle(self) -> None:
            try:
                _read_request(self.rfile)  # type: ignore[arg-type]
                holder[0].script(self.wfile, self.gone)  # type: ignore[arg-type]
            except OSError:  # the client went away: what these tests want
                pass

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 64

        def process_request_thread(self, request: socket.socket, address: object) -> None:  # type: ignore[override]
            holder[0].opened()
            try:
                super().process_request_thread(request, address)
            finally:
                holder[0].closed()

    server = Server(("127.0.0.1", 0), Handler)
    holder.append(HostileServer(url=f"http://127.0.0.1:{server.server_address[1]}", script=script))
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield holder[0]
    finally:
        holder[0].stop.set()
        server.shutdown()
        server.server_close()
