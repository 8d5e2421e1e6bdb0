"""``/metrics``: the operator's series over HTTP, as ``prometheus_client``'s server serves them.

A GET is answered with :meth:`OperatorMetrics.exposition` (the per-policy series rendered
without the library's family objects) in the format the library's ``choose_encoder`` picks
from the ``Accept`` header, gzipped (at ``GZIP_LEVEL``) when ``Accept-Encoding`` allows
gzip; ``?name[]=`` filters as the library's ``restricted_registry`` does. Anything else
(OPTIONS, another method, ``/favicon.ico``) is the library's own app's answer. The server
is the library's kind: a thread per request, in a daemon thread, so it never holds the
process up at exit.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted

from cachescale.controller.reconcile.metrics import OperatorMetrics

GZIP_LEVEL = 1
"""gzip's fastest level, not the library's 9: at thousands of policies a scrape is
megabytes of text, and level 9 costs more CPU than rendering it, for few fewer bytes."""


def scrape(
    metrics: OperatorMetrics, accept: str | None, accept_encoding: str | None, query: str = ""
) -> tuple[list[tuple[str, str]], bytes]:
    """The headers and body of one GET of ``/metrics``."""
    encoder, content_type = choose_encoder(accept or "")
    names = parse_qs(query).get("name[]")
    body = (
        encoder(metrics.registry.restricted_registry(names))
        if names
        else metrics.exposition(encoder)
    )
    headers = [("Content-Type", content_type)]
    if gzip_accepted(accept_encoding or ""):
        body = gzip.compress(body, GZIP_LEVEL)
        headers.append(("Content-Encoding", "gzip"))
    return headers, body


def metrics_app(metrics: OperatorMetrics) -> WSGIApplication:
    """The WSGI app serving ``metrics``."""
    library = make_wsgi_app(metrics.registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] != "GET" or environ["PATH_INFO"] == "/favicon.ico":
            answer: Iterable[bytes] = library(environ, start_response)
            return answer
        headers, body = scrape(
            metrics,
            environ.get("HTTP_ACCEPT"),
            environ.get("HTTP_ACCEPT_ENCODING"),
            environ.get("QUERY_STRING", ""),
        )
        start_response("200 OK", headers)
        return [body]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request, none of them waited for at exit."""

    daemon_threads = True
    address_family = socket.AF_INET


class _QuietHandler(WSGIRequestHandler):
    """Logs no request."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


def start_metrics_server(
    port: int, metrics: OperatorMetrics, address: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``metrics`` on ``address:port`` from a daemon thread (``OSError`` when the
    port cannot be bound)."""
    server = make_server(address, port, metrics_app(metrics), _Server, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
