"""What ``/readyz`` means: the operator can serve policies now.

``/readyz`` answers 200 only while all of these hold (``serve.py`` asks :meth:`ApiHealth.
problem`, and answers 503 with the reason otherwise):

1. kopf's startup handlers have run (``handlers._startup``);
2. the API server answered within the last ``STALE_S`` (15) seconds. An answer is any HTTP
   response below 500 on kopf's session: to kopf's own requests, or to the probe,
   ``GET /version`` every ``PROBE_INTERVAL_S`` (5 s) with a ``PROBE_TIMEOUT_S`` (5 s)
   timeout, so an idle operator still hears from the server. A server that refuses,
   resets, hangs or answers only 5xx is unreachable: ``/readyz`` fails at most 15 s after
   its last answer (at once when kopf's policy watch is cut: rule 3);
3. while this replica acts (always when standalone; with ``--peering`` the one peer that
   acts), kopf's policy watch is open: its latest attempt to list or watch the policies in
   each served scope (every ``--namespace``, or cluster-wide) was answered 2xx. A watch
   not opened yet (starting, or no CRD to watch), refused (403) or cut and not reopened
   fails it; a paused peer has no policy watch, so only 1 and 2 count for it.

So ``/readyz`` is 200 again once the server answers and kopf's policy watch has opened
again (kopf retries it with its own backoff, up to 21 s between attempts).

The log says it once each way: one WARNING naming the server (host and port, never
credentials) when it has not answered for ``STALE_S``, one INFO when it answers again,
each from the first probe or ``/readyz`` that sees the change (so the WARNING comes at
most ``PROBE_INTERVAL_S + PROBE_TIMEOUT_S`` after ``/readyz`` started failing). kopf's own
"Request attempt ... failed" lines (will retry, escalating, or a session closed under a
request in retry) are dropped while the latest request on kopf's session got no answer at
all (:class:`QuietUnanswered`), as are urllib3's retry warnings (:func:`quiet_retries`),
unless ``--verbose``: one line per retry per watch said nothing the WARNING does not.
Every other line, cachescale's own errors and kopf's about answered requests (403, 5xx),
is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Final
from urllib.parse import urlsplit

import aiohttp

from cachescale.api.policy import GROUP, PLURAL, VERSION

PROBE_INTERVAL_S: Final = 5.0
"""Seconds between two probes of the API server (``GET /version``)."""
PROBE_TIMEOUT_S: Final = 5.0
"""How long a probe waits for its answer."""
STALE_S: Final = 15.0
"""Seconds without an answer after which the API server counts as unreachable."""
NO_ANSWER: Final = "no answer"

log = logging.getLogger("cachescale.operator")


def server_name(url: str) -> str:
    """``host:port`` of the API server's URL: what the log names (no scheme, path or
    credentials a URL may carry)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
    except ValueError:  # a malformed port: name the host alone
        return host
    return f"{host}:{port}"


def policy_watch_paths(namespaces: Iterable[str]) -> tuple[str, ...]:
    """The ends of the paths kopf lists and watches the policies on: one per served
    namespace, or the cluster-wide one (a server URL may add a prefix before them)."""
    served = tuple(namespaces)
    if not served:
        return (f"/apis/{GROUP}/{VERSION}/{PLURAL}",)
    return tuple(f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in served)


class ApiHealth:
    """What the operator last heard from the API server, from kopf's session (traced,
    :meth:`trace`) and the probe; whether that makes it ready (the module's rule)."""

    def __init__(
        self,
        server: str,
        watch_paths: tuple[str, ...],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        """``host:port``, for the log and ``/readyz``."""
        self._watch_paths = watch_paths
        self._clock = clock
        self._started = clock()
        self._answered: float | None = None
        self._watches: dict[str, str | None] = {}
        """Per served scope: None when kopf's latest list or watch there was answered 2xx,
        else what went wrong; absent until kopf has tried."""
        self._told_unreachable = False
        self.unanswered = False
        """Whether the latest request on kopf's session got no answer at all."""
        self._session: aiohttp.ClientSession | None = None
        self._version_url = ""
        self.trace = aiohttp.TraceConfig()
        """Given to kopf's session (``kopf_startup.bounded_session``): every request's end."""
        self.trace.on_request_end.append(self._on_end)
        self.trace.on_request_exception.append(self._on_exception)

    def follow(self, session: aiohttp.ClientSession, server_url: str) -> None:
        """Probe through kopf's session (a new one after each kopf login)."""
        self._session = session
        self._version_url = server_url.rstrip("/") + "/version"

    def answered(self, method: str, path: str, status: int) -> None:
        """A request got an HTTP answer."""
        self.unanswered = False
        if status < 500:
            self._answered = self._clock()
        self._saw_watch(method, path, None if status < 300 else f"HTTP {status}")

    def not_answered(self, method: str, path: str) -> None:
        """A request got no HTTP answer (refused, reset, timed out)."""
        self.unanswered = True
        self._saw_watch(method, path, NO_ANSWER)

    def _saw_watch(self, method: str, path: str, failure: str | None) -> None:
        if method.upper() != "GET":
            return
        for scope in self._watch_paths:
            if path.endswith(scope):
                self._watches[scope] = failure

    def problem(self, acting: bool) -> str | None:
        """Why the operator is not ready (rules 2 and 3 of the module), or None."""
        unreachable = self.unreachable()
        if unreachable is not None or not acting:
            return unreachable
        for scope in self._watch_paths:
            if scope not in self._watches:
                return f"the policy watch ({scope}) is not open yet"
            failure = self._watches[scope]
            if failure is not None:
                return f"the policy watch ({scope}) is down: {failure}"
        return None

    def unreachable(self) -> str | None:
        """Why the API server counts as unreachable (rule 2), or None; the first call that
        sees it change logs the change."""
        last = self._started if self._answered is None else self._answered
        silent = self._clock() - last
        self._tell(silent > STALE_S, silent)
        if self._answered is None:
            return f"the API server {self.server} has not answered yet ({silent:.0f} s)"
        if silent > STALE_S:
            return f"the API server {self.server} has not answered for {silent:.0f} s"
        return None

    def _tell(self, unreachable: bool, silent: float) -> None:
        if unreachable == self._told_unreachable:
            return
        self._told_unreachable = unreachable
        if unreachable:
            log.warning(
                "the API server %s has not answered for %.0f s: /readyz fails until it does",
                self.server,
                silent,
            )
        else:
            log.info("the API server %s answers again", self.server)

    async def probe_forever(self) -> None:
        """``GET /version`` every ``PROBE_INTERVAL_S`` on kopf's session (its answer is
        heard through the trace), then log any change; until cancelled."""
        while True:
            if self._session is not None and not self._session.closed:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
                    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
                    async with self._session.get(self._version_url, timeout=timeout) as answer:
                        await answer.read()
            self.unreachable()
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _on_end(
        self, _: aiohttp.ClientSession, __: SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        self.answered(params.method, params.url.path, params.response.status)

    async def _on_exception(
        self,
        _: aiohttp.ClientSession,
        __: SimpleNamespace,
        params: aiohttp.TraceRequestExceptionParams,
    ) -> None:
        if isinstance(params.exception, (aiohttp.ClientError, TimeoutError, OSError)):
            self.not_answered(params.method, params.url.path)


class QuietUnanswered(logging.Filter):
    """Drops kopf's "Request attempt ... failed" lines while the latest request on kopf's
    session got no answer (:attr:`ApiHealth.unanswered`, set by the trace just before kopf
    logs about that request)."""

    def __init__(self, health: ApiHealth) -> None:
        super().__init__()
        self._health = health

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record but those."""
        return not (
            record.name.startswith("kopf")
            and str(record.msg).startswith("Request attempt")
            and self._health.unanswered
        )


def quiet_retries(health: ApiHealth, verbose: bool) -> None:
    """Unless ``verbose``: urllib3's retry warnings off (the Kubernetes client's threads
    report their failures themselves), and :class:`QuietUnanswered` on every handler of
    the root logger (kopf's, installed by ``kopf.configure``)."""
    if verbose:
        return
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    for handler in logging.getLogger().handlers:
        handler.addFilter(QuietUnanswered(health))
