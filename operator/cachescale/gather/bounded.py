"""Bounded reads of one HTTP answer: a byte cap, a deadline, and a cut when abandoned.

Why: the Prometheus a policy names may be any server, and one answer read whole (an
endless or huge body) cost the operator its memory, while a query abandoned at its
deadline kept its thread and connection reading a trickle forever. So an answer is read
in chunks, never whole (``read_body``): it stops when the bytes received, or the bytes
they decode to, pass the cap (a ``Content-Length`` above it is refused before anything
is read), and it stops before a chunk once the deadline has passed; each socket wait is
at most what remains. Bodies are decoded here, chunk by chunk with a bounded output, so
a small compressed answer cannot expand past the cap either.

A query's thread runs inside its ``Abandonable``; the connections made through a
``BoundedAdapter`` attach themselves to it while they serve it. Whoever stops waiting for
the query calls ``abandon``: the connection in use is shut down, so a read blocked on it
returns at once, the thread ends, and the connection is closed, never pooled again. A
connection is detached before it goes back to its pool, so abandoning one query can never
cut a connection another query has taken since.

Invariant: no answer holds more than the cap in memory, and no thread or connection made
for a query outlives its deadline, except for steps that cannot be interrupted: a DNS
lookup (bounded by the resolver) and a TLS handshake (each of its reads bounded by the
connect timeout).
"""

from __future__ import annotations

import socket
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, ReadTimeoutError
from urllib3.poolmanager import ProxyManager

from cachescale.gather.deadline import Deadline

READ_CHUNK_BYTES = 64 * 1024
"""The most read from the socket at once."""
ACCEPT_ENCODING = "gzip"
"""The only compression asked for (what Prometheus offers); ``read_body`` decodes it."""


class BodyTooLarge(Exception):  # noqa: N818 (a condition, not a programming error)
    """The answer, as received or as decoded, is over the cap."""


class BodyTimedOut(Exception):  # noqa: N818 (a condition, not a programming error)
    """The deadline passed before the answer was complete."""


class BodyUnreadable(Exception):  # noqa: N818 (a condition, not a programming error)
    """The answer broke off, or its encoding is corrupt or was not asked for; the message
    is fixed text, never the answer's."""


class Abandoned(Exception):  # noqa: N818 (a condition, not a programming error)
    """Raised in a query's thread that tries to use a connection after its query was
    abandoned: nobody waits for it any more."""


class Abandonable:
    """The connection one query's thread is using, and its socket, so that the query can
    be cut off. The socket is kept apart: a connection hands it to its response when the
    server will close it after the answer, and no longer holds it while that is read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: HTTPConnection | None = None
        self._socket: socket.socket | None = None
        self._abandoned = False

    @contextmanager
    def running(self) -> Iterator[None]:
        """Mark the calling thread as this query's while the block runs."""
        _current.query = self
        try:
            yield
        finally:
            _current.query = None

    def abandon(self) -> None:
        """Nobody waits for the query any more: shut down the connection it is using (a
        read blocked on it returns at once) and refuse it any other."""
        with self._lock:
            self._abandoned = True
            if self._socket is not None:
                _shut_down(self._socket)

    def attach(self, connection: HTTPConnection) -> None:
        """``connection`` now serves this query (``Abandoned`` if it was abandoned)."""
        with self._lock:
            if self._abandoned:
                raise Abandoned
            self._connection, self._socket = connection, connection.sock

    def connected(self, connection: HTTPConnection) -> None:
        """``connection`` of this query has just been made: its socket is the one to cut;
        ``Abandoned`` if the query was abandoned meanwhile (there was nothing to cut)."""
        with self._lock:
            if self._abandoned:
                raise Abandoned
            if self._connection is connection:
                self._socket = connection.sock

    def wait_at_most(self, seconds: float) -> None:
        """Bound the next socket wait of this query to ``seconds``."""
        with self._lock:
            if self._socket is not None:
                self._socket.settimeout(max(seconds, 0.001))

    def detach(self, connection: HTTPConnection) -> None:
        """``connection`` goes back to its pool: abandoning this query no longer cuts it."""
        with self._lock:
            if self._connection is connection:
                self._connection = self._socket = None


_current = threading.local()
"""The ``Abandonable`` of the query the current thread runs, if any (``query``)."""


def _running() -> Abandonable | None:
    query: Abandonable | None = getattr(_current, "query", None)
    return query


def _shut_down(sock: socket.socket | None) -> None:
    """Shut ``sock`` down both ways; it is closed by the thread that uses it."""
    if sock is not None:
        with suppress(OSError):  # already closed, or not connected yet
            sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTPConnection(HTTPConnection):
    """A connection that attaches itself to the query its thread runs, per request."""

    query: Abandonable | None = None

    def request(self, *args: Any, **kwargs: Any) -> None:
        self.query = _running()
        if self.query is not None:
            self.query.attach(self)
        super().request(*args, **kwargs)

    def connect(self) -> None:
        super().connect()
        if self.query is not None:
            self.query.connected(self)


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    """``_WatchedHTTPConnection`` over TLS (its methods come first in the MRO, then
    ``HTTPSConnection``'s)."""


def _detach(connection: object) -> None:
    """Before ``connection`` goes back to its pool: no query may cut it any more."""
    if not isinstance(connection, _WatchedHTTPConnection | _WatchedHTTPSConnection):
        return
    if connection.query is not None:
        connection.query.detach(connection)
        connection.query = None


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection

    def _put_conn(self, conn: Any) -> None:
        _detach(conn)
        super()._put_conn(conn)


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection

    def _put_conn(self, conn: Any) -> None:
        _detach(conn)
        super()._put_conn(conn)


_WATCHED_POOLS: dict[str, type[HTTPConnectionPool]] = {
    "http": _WatchedHTTPPool,
    "https": _WatchedHTTPSPool,
}


class BoundedAdapter(HTTPAdapter):
    """requests' adapter whose connections can be cut off by ``Abandonable.abandon``
    (direct, or through an HTTP(S) proxy; a SOCKS proxy's are not watched)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """requests' pool manager, making watched connections."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _WATCHED_POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """requests' proxy manager for ``proxy``, making watched connections (not SOCKS)."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):
            manager.pool_classes_by_scheme = _WATCHED_POOLS
        return manager


class _Decoder:
    """The body's ``Content-Encoding`` undone chunk by chunk, with a bounded output."""

    def __init__(self, encoding: str | None) -> None:
        name = (encoding or "identity").strip().lower()
        self._zlib: Any = None
        if name in ("gzip", "x-gzip", "deflate"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 32)  # a gzip or zlib header
        elif name != "identity":
            raise BodyUnreadable("the answer is in a content encoding that was not asked for")

    def feed(self, data: bytes, room: int) -> bytes:
        """``data`` decoded: at most ``room + 1`` bytes, so more than ``room`` means the
        rest would not fit (it is never decoded)."""
        if self._zlib is None:
            return data
        try:
            decoded: bytes = self._zlib.decompress(data, room + 1)
        except zlib.error as error:
            raise BodyUnreadable("the compressed answer is corrupt") from error
        return decoded

    def finish(self) -> None:
        """The body ended: a compressed one must have ended with its stream."""
        if self._zlib is not None and not self._zlib.eof:
            raise BodyUnreadable("the compressed answer is incomplete")


def _wait_at_most(seconds: float) -> None:
    """Bound the next socket wait of the query the current thread runs to ``seconds``."""
    query = _running()
    if query is not None:
        query.wait_at_most(seconds)


def read_body(response: requests.Response, limit: int, deadline: Deadline) -> bytes:
    """The decoded body of a streamed ``response`` (``stream=True``), at most ``limit``
    bytes received and decoded, within ``deadline``: ``BodyTooLarge``, ``BodyTimedOut``
    or ``BodyUnreadable`` otherwise. The caller closes the response. Each socket wait is
    bounded by what remains when the request runs in an ``Abandonable``."""
    length = response.headers.get("Content-Length", "").strip()
    if length.isdecimal() and int(length) > limit:
        raise BodyTooLarge
    decoder = _Decoder(response.headers.get("Content-Encoding"))
    parts: list[bytes] = []
    received = decoded = 0
    while True:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise BodyTimedOut
        _wait_at_most(remaining)
        try:
            chunk = response.raw.read1(READ_CHUNK_BYTES, decode_content=False)
        except ReadTimeoutError as error:
            raise BodyTimedOut from error
        except (HTTPError, OSError) as error:
            raise BodyUnreadable("the answer broke off") from error
        if not chunk:
            break
        received += len(chunk)
        part = decoder.feed(chunk, limit - decoded)
        decoded += len(part)
        if received > limit or decoded > limit:
            raise BodyTooLarge
        parts.append(part)
    decoder.finish()
    return b"".join(parts)
