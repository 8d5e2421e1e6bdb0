"""Where the operator may connect: the ``--allowed-prometheus-url`` allow list.

Why: a policy's ``spec.metrics.prometheusUrl`` is chosen by whoever may create a policy,
and the operator runs with its own network position and rights. Without a limit, a policy
author can make it fetch any in-cluster or cloud-metadata address (SSRF). The operator's
administrator states the Prometheus endpoints it may use; a policy outside them is
refused before anything is fetched or any Secret is read (``docs/security.md``).

Syntax, one entry per flag (or chart list item):

* ``https://prometheus.monitoring:9090`` — a URL prefix. A policy URL matches when its
  scheme, host and port equal the entry's (default ports made explicit, host
  case-insensitive) and its path equals the entry's path or continues it after a ``/``.
  So ``http://prom:9090`` does not admit ``http://prom:9090.evil.example`` and
  ``http://prom:9090/api`` does not admit ``http://prom:9090/apix``. A policy path with a
  ``.`` or ``..`` segment (also percent-encoded) never matches a prefix.
* ``re:^https://prom-[a-z]+\\.monitoring\\.svc:9090$`` — a Python regular expression,
  matched against the whole policy URL (``re.fullmatch``).

How a URL is shown lives here too (``redact_url``): without user info, query or fragment,
so no error, status or ``cachescale groups`` output carries a credential. It needs no HTTP
client, so the commands that run without the ``operator`` extra can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

REGEX_PREFIX = "re:"
"""Marks an allow-list entry as a regular expression instead of a URL prefix."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int
    path: str


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to print."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _origin(url: str) -> _Origin | None:
    """Scheme, host, port and path of an http(s) URL; None when it is not one."""
    try:
        parts: SplitResult = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return _Origin(
        scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme], parts.path.rstrip("/")
    )


def _has_dot_segment(path: str) -> bool:
    return any(segment in (".", "..") for segment in unquote(path).split("/"))


@dataclass(frozen=True)
class AllowedUrls:
    """The parsed allow list; empty ``entries`` is never built (no flag: no limit)."""

    entries: tuple[str, ...]
    _prefixes: tuple[_Origin, ...]
    _patterns: tuple[re.Pattern[str], ...]

    @classmethod
    def parse(cls, entries: list[str]) -> AllowedUrls:
        """Parse flag values; ``ValueError`` names the first entry that is not valid."""
        prefixes, patterns = [], []
        for entry in entries:
            if entry.startswith(REGEX_PREFIX):
                try:
                    patterns.append(re.compile(entry[len(REGEX_PREFIX) :]))
                except re.error as error:
                    message = f"{entry!r} is not a valid regular expression: {error}"
                    raise ValueError(message) from error
                continue
            origin = _origin(entry)
            if origin is None:
                raise ValueError(
                    f"{entry!r} is neither an http(s) URL prefix nor {REGEX_PREFIX}<regex>"
                )
            prefixes.append(origin)
        return cls(tuple(entries), tuple(prefixes), tuple(patterns))

    def allows(self, url: str) -> bool:
        """Whether the operator may connect to ``url`` (a policy's ``prometheusUrl``)."""
        if any(pattern.fullmatch(url) for pattern in self._patterns):
            return True
        wanted = _origin(url)
        if wanted is None or _has_dot_segment(wanted.path):
            return False
        return any(
            (wanted.scheme, wanted.host, wanted.port) == (p.scheme, p.host, p.port)
            and (wanted.path == p.path or wanted.path.startswith(f"{p.path}/"))
            for p in self._prefixes
        )
