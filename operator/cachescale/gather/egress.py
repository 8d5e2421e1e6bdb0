"""Where the operator may connect: one reading of a Prometheus URL, and the allow list.

Why: a policy's ``spec.metrics.prometheusUrl`` is chosen by whoever may create a policy,
and the operator runs with its own network position and rights. Without a limit, a policy
author can make it fetch any in-cluster or cloud-metadata address (SSRF) and send it a
labelled bearer token. The cluster owner states the Prometheus endpoints policies may use
(``--allowed-prometheus-url``); a policy outside them is refused before anything is
fetched or any Secret is read (``docs/security.md``).

One reading for checking and connecting (``reached``). A URL is judged on the host and
port the HTTP client will connect to, not on what another parser makes of it: the
operator reads it with ``requests``' own preparation and ``urllib3``'s ``parse_url`` (what
``requests`` connects with), and only after it passed strict rules of its own, under which
both parsers agree. Refused, whatever the allow list: a scheme other than http(s), user
info (``@``), a backslash, whitespace, a control or non-ASCII character, percent-encoding,
a query or fragment, a host that is not a DNS name, IPv4 address or bracketed IPv6
address, a port outside 1..65535, and a ``.`` or ``..`` path segment. What passes is
rewritten as ``scheme://host:port/path`` (scheme and host lowercase, port always written,
no trailing ``/``): the operator connects to that normalized URL, and every status and
message names it, so what was checked is what is reached.

Allow-list syntax, one entry per flag (or chart list item):

* ``https://prometheus.monitoring:9090`` — a URL prefix (read by the same rules). A policy
  URL matches when its scheme, host and port equal the entry's (default ports made
  explicit, host case-insensitive) and its path equals the entry's path or continues it
  after a ``/``. So ``http://prom:9090`` does not admit ``http://prom:9090.evil.example``
  and ``http://prom:9090/api`` does not admit ``http://prom:9090/apix``.
* ``re:^https://prom-[a-z]+\\.monitoring\\.svc:9090$`` — a Python regular expression,
  matched (``re.fullmatch``) against the normalized URL of a policy URL that passed the
  rules above, never against the author's spelling.

An empty list allows no policy-chosen URL (the operator's own default Prometheus is still
read by policies that name none).

How a URL is shown lives here too (``redact_url``): without user info, query or fragment,
so no error, status or ``cachescale groups`` output carries a credential. It needs no HTTP
client, so the commands that run without the ``operator`` extra can use it; the strict
rules are plain Python for the same reason, and only ``reached`` imports the client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

REGEX_PREFIX = "re:"
"""Marks an allow-list entry as a regular expression instead of a URL prefix."""
DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOWS_ANY = re.compile(r"re:\^?\.[*+]\$?")
"""An entry that admits every URL (``re:.*``): allowed, and warned about at start."""
_SHAPE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/]*)(?P<path>/.*)?")
_AUTHORITY = re.compile(
    r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
)
_PATH = re.compile(r"(?:/[A-Za-z0-9\-._~!$&'()*+,;=:]*)*")
_REFUSED_CHARACTERS = (
    ("\\", "a backslash"),
    ("@", "user info (@)"),
    ("%", "percent-encoding (%)"),
    ("?", "a query (?)"),
    ("#", "a fragment (#)"),
)
_SHOWN_AUTHORITY = "[]:.-_~!$&'()*+,;="
_SHOWN_PATH = "/" + _SHOWN_AUTHORITY


class UrlRefused(ValueError):  # noqa: N818 (a refusal, not a failure)
    """A URL the operator never connects to, whatever the allow list; the message says
    why in a user's words (it never quotes the URL)."""


@dataclass(frozen=True)
class Reached:
    """Where a URL leads: scheme, host and port connected to, and the path asked for."""

    scheme: str
    host: str
    """Lowercase; an IPv6 address keeps its brackets."""
    port: int
    path: str
    """Empty or ``/``-separated segments, without a trailing ``/``."""

    @property
    def url(self) -> str:
        """The normalized URL: what the operator connects to, and names."""
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"


def strict(url: str) -> Reached:
    """``url`` read by the strict rules alone (no HTTP client needed); ``UrlRefused``
    when it breaks one. For a URL that passes, the HTTP client reads the same scheme,
    host, port and path (``reached`` checks it; ``tests/gather/test_url_differential.py``
    tries hostile spellings)."""
    for character in url:
        if not character.isascii():
            raise UrlRefused("it contains a non-ASCII character (write a host as xn--...)")
        if not " " < character < "\x7f":
            raise UrlRefused("it contains whitespace or a control character")
    for character, name in _REFUSED_CHARACTERS:
        if character in url:
            raise UrlRefused(f"it contains {name}")
    shape = _SHAPE.fullmatch(url)
    scheme = shape["scheme"].lower() if shape else ""
    if shape is None or scheme not in DEFAULT_PORTS:
        raise UrlRefused("it is not an http:// or https:// URL")
    authority = _AUTHORITY.fullmatch(shape["authority"])
    if authority is None:
        raise UrlRefused("its host is not a DNS name, an IPv4 address or an [IPv6] address")
    port = int(authority["port"]) if authority["port"] else DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise UrlRefused("its port is not within 1..65535")
    path = shape["path"] or ""
    if _PATH.fullmatch(path) is None:
        raise UrlRefused(
            "its path has a character other than letters, digits and -._~!$&'()*+,;=:/"
        )
    if any(segment in (".", "..") for segment in path.split("/")):
        raise UrlRefused("its path has a . or .. segment")
    return Reached(scheme, authority["host"].lower(), port, path.rstrip("/"))


REACHED_CACHE_SIZE = 1024
"""URLs whose reading ``reached`` keeps: a fleet's policies name a few Prometheus URLs,
each read again at every evaluation."""


def reached(url: str) -> Reached:
    """Where the HTTP client connects for ``url``: ``requests`` prepares it and
    ``urllib3`` parses the result, as when a request is sent. ``UrlRefused`` when the
    strict rules refuse it or the client would read it otherwise (never expected: the
    rules exist so that both agree). A pure function of ``url``: the last
    ``REACHED_CACHE_SIZE`` readings are kept (a refusal is not, and is raised anew)."""
    return _reached(url)


@lru_cache(maxsize=REACHED_CACHE_SIZE)
def _reached(url: str) -> Reached:
    """``reached``, read afresh."""
    from requests.exceptions import RequestException
    from requests.models import PreparedRequest
    from urllib3.exceptions import LocationParseError
    from urllib3.util import parse_url

    own = strict(url)
    prepared = PreparedRequest()
    try:
        prepared.prepare_url(url, None)
        client = parse_url(prepared.url or "")
    except (RequestException, LocationParseError, ValueError) as error:
        raise UrlRefused("the HTTP client cannot read it") from error
    seen = Reached(
        client.scheme or "",
        (client.host or "").lower(),
        client.port or DEFAULT_PORTS.get(client.scheme or "", 0),
        (client.path or "").rstrip("/"),
    )
    if seen != own or client.auth or client.query is not None or client.fragment is not None:
        raise UrlRefused("the HTTP client would read it differently than it was checked")
    return seen


def reached_url(url: str) -> str:
    """The normalized URL the operator connects to for ``url`` (``UrlRefused``: none)."""
    return reached(url).url


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to print. A URL the strict
    rules accept is shown normalized; any other with the host and port an HTTP client
    would connect to (its authority ends at the first ``/``, ``\\``, ``?`` or ``#``, and
    user info ends at the last ``@``), escaped so that it is one printable line."""
    try:
        return strict(url).url
    except UrlRefused:
        pass
    shape = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(?://([^\\/?#]*))?([^?#]*)", url.strip())
    if shape is None:
        return quote(url.split("?")[0].split("#")[0], safe=_SHOWN_PATH)
    authority = (shape[2] or "").rpartition("@")[2]
    path = shape[3] if shape[3].startswith("/") or not shape[3] else f"/{shape[3]}"
    shown = quote(authority, safe=_SHOWN_AUTHORITY) + quote(path, safe=_SHOWN_PATH)
    return f"{shape[1].lower()}://{shown}"


@dataclass(frozen=True)
class AllowedUrls:
    """The parsed allow list. Empty ``entries``: no policy-chosen URL is allowed."""

    entries: tuple[str, ...]
    _prefixes: tuple[Reached, ...]
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
            try:
                prefixes.append(reached(entry))
            except UrlRefused as error:
                raise ValueError(
                    f"{entry!r} is neither an http(s) URL prefix nor {REGEX_PREFIX}<regex>: {error}"
                ) from error
        return cls(tuple(entries), tuple(prefixes), tuple(patterns))

    @property
    def patterns(self) -> tuple[str, ...]:
        """The ``re:`` entries, as given."""
        return tuple(e for e in self.entries if e.startswith(REGEX_PREFIX))

    def admits(self, url: str) -> str | None:
        """The normalized URL the operator may connect to for ``url`` (a policy's
        ``prometheusUrl``); None when no entry admits it, ``UrlRefused`` when the strict
        rules refuse it whatever the entries."""
        wanted = reached(url)
        if any(pattern.fullmatch(wanted.url) for pattern in self._patterns) or any(
            (wanted.scheme, wanted.host, wanted.port) == (p.scheme, p.host, p.port)
            and (wanted.path == p.path or wanted.path.startswith(f"{p.path}/"))
            for p in self._prefixes
        ):
            return wanted.url
        return None

    def allows(self, url: str) -> bool:
        """Whether the operator may connect to ``url`` (``admits`` as a yes or no)."""
        try:
            return self.admits(url) is not None
        except UrlRefused:
            return False
