"""One HTTP ``/metrics`` server per emulated pod, as each engine process has its own.

Each server is prometheus_client's WSGI app and threaded WSGI server over a private
registry, so compression and the text format are the library's, as in a real vLLM or
SGLang server. Two departures, both deliberate:

- It always answers in the classic text format (0.0.4), ignoring ``Accept``. When a
  scraper asks for OpenMetrics without an ``escaping`` parameter, as Prometheus 2.x does,
  prometheus_client (≤ 0.26 at least) writes sample names with ``:`` turned into ``_``
  while HELP/TYPE keep the colon (prometheus/client_python#1177), so ``vllm:`` series
  would land in Prometheus as ``vllm_``. The text format keeps the engines' real names.
- It is assembled here rather than through ``start_http_server`` to poll for shutdown
  every 50 ms instead of 500 ms: pods stop while the real-time loop waits on them.

The collector reads live engine state on every scrape; :class:`LockedCollector` takes the
emulator's lock around that read so a scrape never sees an engine halfway through a
simulation step, and the serving threads never run the simulation themselves. Under the
same lock hold it tells the emulator a scrape was served, so the ground truth can record
exactly the state that scrape exported. One path is not metrics: ``/v1/completions``
goes to the pod's completions handler (``completions``) when one is given. A port that
cannot be bound is named in the error (:class:`PortUnavailableError`).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

LOOPBACK = "127.0.0.1"
COMPLETIONS_PATH = "/v1/completions"
SHUTDOWN_POLL_S = 0.05


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: a line per scrape would drown the emulator's own output."""


class LockedCollector(Collector):
    """Collects ``inner`` while holding ``lock`` (one consistent snapshot per scrape)."""

    def __init__(
        self, inner: Collector, lock: threading.Lock, on_scrape: Callable[[], None]
    ) -> None:
        self._inner = inner
        self._lock = lock
        self._on_scrape = on_scrape

    def collect(self) -> Iterator[Metric]:
        """The inner collector's families, all built before the lock is released; then
        ``on_scrape`` runs, still under the lock, seeing the state just exported."""
        with self._lock:
            families = list(self._inner.collect())
            self._on_scrape()
        return iter(families)


def text_format_only(app: WSGIApplication) -> WSGIApplication:
    """``app`` with the request's ``Accept`` header dropped (see the module docstring)."""

    def serve_text(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        environ.pop("HTTP_ACCEPT", None)
        return app(environ, start_response)

    return serve_text


@dataclass
class PodEndpoint:
    """A running ``/metrics`` server for one pod."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The port the server listens on (the OS picks it when asked for 0)."""
        return int(self.server.server_address[1])

    @property
    def address(self) -> str:
        """``host:port``, as a scrape target."""
        return f"{LOOPBACK}:{self.port}"

    def stop(self) -> None:
        """Stop serving and release the port (in-flight scrapes finish first)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class PortUnavailableError(OSError):
    """A pod's port cannot be bound; the message names it: ``port 8080 is already in
    use``, or the system's reason for another failure."""

    def __init__(self, port: int, error: OSError) -> None:
        if error.errno == errno.EADDRINUSE:
            super().__init__(f"port {port} is already in use")
        else:
            reason = os.strerror(error.errno) if error.errno else str(error)
            super().__init__(f"port {port}: {reason}")


def with_completions(metrics: WSGIApplication, completions: WSGIApplication) -> WSGIApplication:
    """``metrics`` on every path, as before, except :data:`COMPLETIONS_PATH`."""

    def route(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        app = completions if environ.get("PATH_INFO") == COMPLETIONS_PATH else metrics
        return app(environ, start_response)

    return route


def serve(
    collector: Collector,
    lock: threading.Lock,
    port: int,
    on_scrape: Callable[[], None],
    completions: WSGIApplication | None = None,
) -> PodEndpoint:
    """Start serving ``collector`` on loopback ``port`` (0: any free port); ``on_scrape``
    runs under ``lock`` after every collection; ``completions`` (if any) answers
    :data:`COMPLETIONS_PATH`.

    Raises :class:`PortUnavailableError` when the port is taken.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LockedCollector(collector, lock, on_scrape))
    app = text_format_only(make_wsgi_app(registry))
    if completions is not None:
        app = with_completions(app, completions)
    try:
        server = make_server(LOOPBACK, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    except OSError as error:
        raise PortUnavailableError(port, error) from None
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True
    )
    thread.start()
    return PodEndpoint(server, thread)
