"""Prometheus HTTP access for the gather layer: instant queries POSTed as a form.

Why a wrapper: every failure leaves this module as one of the typed errors of
``gather.prometheus_errors``, one line naming the URL without credentials, never a
traceback, a token or the answer's body. Transport policy lives here: TLS verified by
default (optionally against a CA bundle), a bearer token
from the caller, a connect timeout, and bounded retries with exponential backoff on
connection failures and on 429/5xx answers — never on a read timeout, since repeating a
query that Prometheus is too slow to answer only adds load.

Time is one budget, not a timeout per query (``gather/deadline.py``): every request made
for one evaluation — retries and their pauses included — gets only what remains of that
evaluation's ``Deadline``, and Prometheus is told the same as the query's own timeout.
When it runs out, the queries still in flight are abandoned: their threads are not waited
for, and their connections are shut down, so each thread ends then too, however slowly the
server trickles its answer (only a DNS lookup or a TLS handshake in progress cannot be cut,
and ends by its own timeout). The error (``DeadlineReached``) gives the budget and the time
actually spent.

Memory is bounded too: an answer is streamed, never read whole, and its body may not
exceed ``max_response_bytes``, as received or as decoded (a ``Content-Length`` above it is
refused before anything is read; gzip is decoded here, so a small compressed answer cannot
expand past it). Over the cap the read fails (``PrometheusResponseTooLarge``, naming the
cap and where it is set) and its connection is closed. So whatever server a policy names,
one read costs at most the cap in memory and nothing after its deadline
(``gather/bounded.py``).

Redirects are never followed (a 3xx is a bad response): a Prometheus that answers
with one is misconfigured, and following it could lead the bearer token or the request to
another host.

An evaluation's queries (or a group's) are one request (``query_many``): ``combine``
tags each query's series and joins them with ``or``, and the answer is split back by
tag. So the cost to Prometheus, and to anyone who meters its API by request, grows with
the number of groups, not with the number of signals; the queries are evaluated at one
timestamp, so the signals they yield describe one instant. The query goes in the POST
body, not the URL: a group's batch carries its members' label values many times over and
would exceed what proxies in front of Prometheus accept in a URL (``prometheus-api-client``
always sends it in the URL, so it is not used).

An answer is decoded and checked in one pass (``msgspec``, into ``gather.answer``'s
``Answer``); why, and how a combined query's series are handed back by tag, that module
says.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Self, TypeVar

import msgspec
import requests
from urllib3.util.retry import Retry

from cachescale.api.spec import Engine
from cachescale.gather.answer import Answer, Sample, by_tag, series_of
from cachescale.gather.answer import Series as Series
from cachescale.gather.bounded import (
    ACCEPT_ENCODING,
    Abandonable,
    BodyTimedOut,
    BodyTooLarge,
    BodyUnreadable,
    BoundedAdapter,
    read_body,
)
from cachescale.gather.deadline import Deadline
from cachescale.gather.detection import Detection, detect_profile, detection_query
from cachescale.gather.egress import redact_url as redact_url
from cachescale.gather.prometheus_errors import (
    DeadlineReached,
    PrometheusBadResponse,
    PrometheusError,
    PrometheusResponseTooLarge,
    PrometheusUnreachable,
    short_cause,
    status_error,
)
from cachescale.gather.promql import combine
from cachescale.gather.selector import QUERY_TAG_LABEL, QueryScope, Selector

_K = TypeVar("_K", bound=Hashable)


_DECODER = msgspec.json.Decoder(Answer)

LARGE_BODY_BYTES = 1 << 20
"""Bodies of at least this many bytes are parsed one at a time (``_LARGE_PARSE``)."""
_LARGE_PARSE = threading.Lock()

POOL_CONNECTIONS = 64
"""Kept-alive connections per client: the groups and evaluations that share it query at
once (urllib3's default of 10 would churn)."""
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""The default cap on one answer's body (``PrometheusConfig.max_response_bytes``)."""
ERROR_BODY_BYTES = 64 * 1024
"""The most of an error answer's body read, for its ``errorType`` only."""
MAX_RESPONSE_SETTING = (
    "operator flag --prometheus-max-response-bytes, chart value prometheus.maxResponseBytes"
)
"""Where the cap is set, as an error over it says."""


@dataclass(frozen=True)
class PrometheusConfig:
    """Where Prometheus is and how to talk to it."""

    url: str
    """Base URL of the HTTP API, e.g. ``http://prometheus.monitoring:9090``."""
    timeout_seconds: float = 10.0
    """The budget of one evaluation's reads: one deadline for all its queries, retries
    included (what remains of it is also sent to Prometheus as a query's own timeout)."""
    connect_timeout_seconds: float = 3.0
    retries: int = 2
    """Retries after the first attempt, on connection errors and retryable statuses."""
    backoff_seconds: float = 0.5
    """Exponential backoff factor between retries: no pause before the first retry, then
    ``backoff_seconds × 2^(n-1)`` before the n-th (urllib3's schedule)."""
    bearer_token: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer``; never printed."""
    ca_file: str | None = None
    """PEM bundle to verify the server certificate against (default: system CAs)."""
    verify_tls: bool = True
    max_response_bytes: int = MAX_RESPONSE_BYTES
    """The most bytes one answer may have, as received and as decoded; over it the read
    fails (``PrometheusResponseTooLarge``) without reading further."""


def _duration(seconds: float) -> str:
    """``seconds`` as a Prometheus duration, in whole milliseconds (at least one)."""
    return f"{max(1, int(seconds * 1000))}ms"


class PrometheusClient:
    """Instant queries against one Prometheus, with typed errors. Use as a context manager.

    Without a deadline (``until``), each ``query`` and ``query_many`` call starts its own,
    of ``timeout_seconds`` on ``clock``."""

    def __init__(
        self, config: PrometheusConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._clock = clock
        self._deadline: Deadline | None = None
        self._url = config.url.rstrip("/")
        self._query_url = f"{self._url}/api/v1/query"
        session = requests.Session()
        session.verify = config.ca_file or config.verify_tls
        if config.bearer_token is not None:
            session.headers["Authorization"] = f"Bearer {config.bearer_token}"
        session.headers["Accept-Encoding"] = ACCEPT_ENCODING  # decoded in ``read_body``
        # Retries are made in ``query``, where the deadline is known: none in urllib3.
        no_retry = Retry(total=0, read=False)  # read=False: a read timeout stays one
        adapter = BoundedAdapter(max_retries=no_retry, pool_maxsize=POOL_CONNECTIONS)
        for scheme in ("http://", "https://"):  # every request this session makes
            session.mount(scheme, adapter)
        self._session = session

    def deadline(self) -> Deadline:
        """A deadline of ``timeout_seconds`` starting now on the client's clock."""
        return Deadline.start(self._config.timeout_seconds, self._clock)

    def until(self, deadline: Deadline) -> Self:
        """This client with every request bounded by ``deadline`` (it shares the
        connections: close the client, not the view)."""
        view = copy.copy(self)
        view._deadline = deadline
        return view

    def _pause(self, retry: int) -> float:
        """The pause before the ``retry``-th retry (1-based)."""
        return 0.0 if retry <= 1 else self._config.backoff_seconds * 2 ** (retry - 1)

    def query(self, promql: str, at: datetime) -> list[Series]:
        """Evaluate ``promql`` at ``at``; an instant vector, or a typed ``PrometheusError``
        (``DeadlineReached`` when the deadline runs out first).

        The deadline bounds the wait for Prometheus's answer and its transfer, not its
        parsing here: a group's answer is megabytes of JSON, and on a busy operator parsing
        it under the deadline turned the operator's own CPU contention into "Prometheus
        timed out"."""
        body = self._awaited(promql, at, self._deadline or self.deadline())
        return self._vector(self._result(body))

    def _retried(self, promql: str, at: datetime, deadline: Deadline) -> bytes:
        """``promql`` with retries, each attempt and pause within ``deadline``."""
        retry = 0
        while True:
            try:
                return self._attempt(promql, at, deadline)
            except PrometheusError as error:
                if not error.retryable or retry >= self._config.retries:
                    raise
                retry += 1
                pause = self._pause(retry)
                if pause >= deadline.remaining():
                    raise  # no time for another attempt: the last failure is the cause
                time.sleep(pause)

    def _attempt(self, promql: str, at: datetime, deadline: Deadline) -> bytes:
        """One request, given only what remains of ``deadline``: the answer's body."""
        remaining = deadline.remaining()
        if remaining <= 0:
            raise DeadlineReached(self._url, deadline.reached())
        connect = min(self._config.connect_timeout_seconds, remaining)
        form = {"query": promql, "time": f"{at.timestamp():.3f}", "timeout": _duration(remaining)}
        try:
            response = self._session.post(
                self._query_url,
                data=form,
                timeout=(connect, remaining),
                verify=self._session.verify,  # or requests lets REQUESTS_CA_BUNDLE win
                allow_redirects=False,  # a 3xx is a bad response (``status_error``)
                stream=True,  # read by ``_body``, within the cap and the deadline
            )
        except requests.exceptions.ReadTimeout as error:
            raise DeadlineReached(self._url, deadline.reached()) from error
        except requests.exceptions.SSLError as error:
            raise PrometheusUnreachable(
                self._url, f"TLS verification failed ({short_cause(error)}); pass the CA bundle"
            ) from error
        except requests.exceptions.ConnectTimeout as error:
            if connect < self._config.connect_timeout_seconds:
                raise DeadlineReached(self._url, deadline.reached()) from error
            raise PrometheusUnreachable(
                self._url,
                f"no connection within {self._config.connect_timeout_seconds:g}s",
                retryable=True,
            ) from error
        except requests.exceptions.ConnectionError as error:
            raise PrometheusUnreachable(self._url, short_cause(error), retryable=True) from error
        except requests.exceptions.RequestException as error:
            raise PrometheusBadResponse(self._url, type(error).__name__) from error
        try:
            if response.status_code != 200:
                raise status_error(
                    self._url, response.status_code, self._error_body(response, deadline)
                )
            return self._body(response, deadline)
        finally:
            response.close()  # a connection not read to its end is closed, never pooled

    def _body(self, response: requests.Response, deadline: Deadline) -> bytes:
        """A 200 answer's body, within the cap and ``deadline``."""
        limit = self._config.max_response_bytes
        try:
            return read_body(response, limit, deadline)
        except BodyTooLarge:
            raise PrometheusResponseTooLarge(
                self._url, f"more than {limit} bytes ({MAX_RESPONSE_SETTING})"
            ) from None
        except BodyTimedOut:
            raise DeadlineReached(self._url, deadline.reached()) from None
        except BodyUnreadable as error:
            raise PrometheusBadResponse(self._url, str(error)) from error

    def _error_body(self, response: requests.Response, deadline: Deadline) -> bytes | None:
        """The start of an error answer's body, for its ``errorType``: None when it is
        longer than that, or cannot be read in time (the status says enough)."""
        limit = min(ERROR_BODY_BYTES, self._config.max_response_bytes)
        try:
            return read_body(response, limit, deadline)
        except (BodyTooLarge, BodyTimedOut, BodyUnreadable):
            return None

    def _result(self, body: bytes) -> list[Sample]:
        """``data.result`` of an answer's body, checked to be an instant vector. A large
        body is decoded one at a time in the process (``LARGE_BODY_BYTES``): decoding
        holds the GIL anyway, and it costs many times its bytes, so several at once could
        pass the pod's memory limit where each alone is within the byte cap."""
        try:
            if len(body) < LARGE_BODY_BYTES:
                return _DECODER.decode(body).data.result
            with _LARGE_PARSE:
                return _DECODER.decode(body).data.result
        except msgspec.ValidationError as error:
            raise PrometheusBadResponse(
                self._url, "data.result is not an instant vector of samples"
            ) from error
        except msgspec.DecodeError as error:
            raise PrometheusBadResponse(self._url, "the body is not JSON") from error

    def _vector(self, result: list[Sample]) -> list[Series]:
        """Each sample's labels and value (NaN and ±Inf allowed)."""
        try:
            return series_of(result)
        except ValueError as error:
            raise PrometheusBadResponse(
                self._url, "data.result holds a sample whose value is not a number"
            ) from error

    def query_many(self, queries: Mapping[_K, str], at: datetime) -> dict[_K, list[Series]]:
        """Evaluate every query at ``at`` in one request (``combine``), within one
        deadline; each query's series come back under its key."""
        if not queries:
            return {}
        keys = list(queries)
        tagged = by_tag(self.query(combine([queries[key] for key in keys]), at), keys)
        if tagged is None:
            raise PrometheusBadResponse(
                self._url, f"a series of a combined query has no valid {QUERY_TAG_LABEL}"
            )
        return tagged

    def _awaited(self, promql: str, at: datetime, deadline: Deadline) -> bytes:
        """Run ``promql`` (with its retries) on a worker thread and wait for its answer
        until ``deadline`` at most: a query still in flight then is abandoned, so the caller
        returns on time, and its connection is cut, so its thread ends with it however the
        server paces its bytes (``gather/bounded.py``). The thread is a daemon, not a
        ``ThreadPoolExecutor``'s, whose threads the interpreter joins at exit: an abandoned
        query must not hold up the process."""
        future: Future[bytes] = Future()
        query = Abandonable()

        def run() -> None:
            future.set_running_or_notify_cancel()
            try:
                with query.running():
                    result = self._retried(promql, at, deadline)
            except Exception as error:  # handed to the waiting caller
                future.set_exception(error)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="promql", daemon=True).start()
        wait([future], timeout=deadline.remaining())
        if not future.done():
            query.abandon()  # its connection is cut: the thread ends now, not at EOF
            raise DeadlineReached(self._url, deadline.reached())
        return future.result()

    def detect(self, engine: Engine, selector: Selector, at: datetime) -> Detection:
        """Which engine profile the series matching ``selector`` belong to."""
        series = self.query(detection_query(engine, QueryScope.for_selector(selector)), at)
        return detect_profile(engine, selector, series)

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
