"""How reading Prometheus fails: five typed errors, each in one line without secrets.

The decision layer must tell "Prometheus is down" from "it answered with garbage" from
"our query was rejected", and a CLI user must get one clear line, never a traceback or a
token. So every failure of ``gather.prometheus`` is one of ``PrometheusUnreachable``,
``PrometheusTimeout`` (``DeadlineReached`` when the evaluation's budget ran out),
``PrometheusBadResponse``, ``PrometheusResponseTooLarge`` or ``PrometheusQueryError``,
each naming the URL without credentials and carrying the ``FetchFailure`` the snapshot
records.

What an error says is fixed text, never the answer's body: the URL may be chosen by a
policy author who cannot reach it, so anything echoed into a status or an Event would be a
way to read an internal address (``docs/security.md``). An error names the HTTP status
code, Prometheus' ``errorType`` when it is one of the documented few, and a short fixed
reason.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import ClassVar

from cachescale.gather.egress import redact_url
from cachescale.snapshot import FetchFailure

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers worth retrying: overload and gateway errors."""
PROMETHEUS_ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found"}
)
"""The ``errorType`` values of Prometheus' HTTP API: the only part of an error body shown."""


class PrometheusError(Exception):
    """Prometheus could not be read; ``failure`` says how, the message says where."""

    failure: ClassVar[FetchFailure]
    _template: ClassVar[str]

    def __init__(self, url: str, detail: str, *, retryable: bool = False) -> None:
        self.url = redact_url(url)
        self.detail = detail
        self.retryable = retryable
        """A connection failure or a 429/5xx answer: worth another attempt."""
        super().__init__(self._template.format(url=self.url, detail=detail))


class PrometheusUnreachable(PrometheusError):  # noqa: N818 (public names, kept)
    """No connection could be made (refused, DNS, TLS, connect timeout)."""

    failure = FetchFailure.UNREACHABLE
    _template = "Prometheus is unreachable at {url}: {detail}"


class PrometheusTimeout(PrometheusError):  # noqa: N818 (public names, kept)
    """Connected, but no answer in time (or Prometheus' own query timeout fired)."""

    failure = FetchFailure.TIMEOUT
    _template = "Prometheus at {url} timed out: {detail}"


class DeadlineReached(PrometheusTimeout):
    """The evaluation's deadline ran out with queries unanswered (``Deadline.reached``):
    nothing of the evaluation is to be trusted as complete, so it fails as a whole."""


class PrometheusBadResponse(PrometheusError):  # noqa: N818 (public names, kept)
    """An answer that is not a Prometheus API result (5xx, auth failure, not JSON...)."""

    failure = FetchFailure.BAD_RESPONSE
    _template = "Prometheus at {url} sent a bad response: {detail}"


class PrometheusResponseTooLarge(PrometheusBadResponse):
    """An answer over ``max_response_bytes``: not read further, and not retried (it would
    be as large again)."""

    failure = FetchFailure.TOO_LARGE
    _template = "Prometheus at {url} sent a response over the size limit: {detail}"


class PrometheusQueryError(PrometheusError):
    """Prometheus rejected or failed to evaluate a query (HTTP 400/422)."""

    failure = FetchFailure.QUERY_ERROR
    _template = "Prometheus at {url} rejected a query: {detail}"


_ERRNO_RE = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def short_cause(error: BaseException) -> str:
    """The OS-level reason inside a requests error, without URLs or pool internals."""
    found = _ERRNO_RE.search(str(error))
    return found.group(1).strip() if found else type(error).__name__


def _api_error(code: int, body: bytes | None) -> str:
    """``HTTP <code> <standard phrase>``, then Prometheus' ``errorType`` when the body
    names a documented one: fixed words only, never the body's (or the server's) text."""
    try:
        detail = f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        detail = f"HTTP {code}"
    try:
        error_type = json.loads(body or b"")["errorType"]
    except (ValueError, KeyError, TypeError):
        return detail
    return f"{detail} ({error_type})" if error_type in PROMETHEUS_ERROR_TYPES else detail


def status_error(url: str, code: int, body: bytes | None) -> PrometheusError:
    """The typed error of a non-200 answer from ``url`` (``retryable`` for 429/5xx: the
    client tries again while the deadline allows); ``body`` is read for its ``errorType``."""
    detail = _api_error(code, body)
    if 300 <= code < 400:
        return PrometheusBadResponse(url, f"{detail}: redirects are not followed")
    if code in (400, 422):
        return PrometheusQueryError(url, detail)
    if detail.endswith("(timeout)"):  # Prometheus gave up: like a read timeout, final
        return PrometheusTimeout(url, detail)
    if code in (401, 403):
        detail += " (check the bearer token)"
    return PrometheusBadResponse(url, detail, retryable=code in RETRY_STATUSES)
