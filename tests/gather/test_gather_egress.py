"""The ``--allowed-prometheus-url`` allow list and the one reading of a URL behind it:
prefixes that respect URL boundaries, ``re:`` regexes matched against the normalized URL,
and spellings refused whatever the list because an HTTP client would read them otherwise
(``tests/gather/test_url_differential.py`` tries many more)."""

from __future__ import annotations

import re

import pytest

from cachescale.gather.egress import (
    REACHED_CACHE_SIZE,
    AllowedUrls,
    UrlRefused,
    reached,
    reached_url,
    redact_url,
    strict,
)

ALLOWED = AllowedUrls.parse(
    [
        "http://prometheus.monitoring:9090",
        "https://thanos.example/prefix/",
        r"re:http://prom-[a-z]+\.monitoring\.svc:9090",
    ]
)
ISSUE_EXAMPLE = "http://127.0.0.1:18080\\@prom.monitoring:9090"
"""Passed ``urlsplit`` as host prom.monitoring; requests connected to 127.0.0.1:18080."""


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.monitoring:9090",
        "http://prometheus.monitoring:9090/",
        "http://PROMETHEUS.monitoring:9090/sub/path",
        "HTTP://prometheus.monitoring:09090",
        "https://thanos.example/prefix",
        "https://thanos.example:443/prefix/deeper",
        "http://prom-main.monitoring.svc:9090",
        "http://prom-main.monitoring.svc:9090/",  # the regex sees the normalized URL
    ],
)
def test_allowed(url: str) -> None:
    assert ALLOWED.allows(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.monitoring:9091",  # another port
        "http://prometheus.monitoring",  # port 80 is not 9090
        "https://prometheus.monitoring:9090",  # another scheme
        "http://prometheus.monitoring:9090.evil.example",  # not a port
        "http://prometheus.monitoring.evil.example:9090",  # another host
        "https://thanos.example/prefixed",  # the path continues without a /
        "https://thanos.example/prefix/../admin",  # climbs out of the prefix
        "https://thanos.example/prefix/%2e%2e/admin",
        "https://thanos.example/",
        "http://169.254.169.254/latest/meta-data",
        "http://prom-main.monitoring.svc:9090/x",  # a regex matches the whole URL only
        "file:///etc/passwd",
        "not a url",
        "",
    ],
)
def test_refused(url: str) -> None:
    assert not ALLOWED.allows(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (ISSUE_EXAMPLE, "a backslash"),
        ("http://prometheus.monitoring:9090\\", "a backslash"),
        ("http://127.0.0.1:18080@prometheus.monitoring:9090", "user info"),
        ("http://user:pw@prometheus.monitoring:9090", "user info"),
        ("http://prometheus.monitoring:9090@127.0.0.1:18080", "user info"),
        ("http://prometheus.monitoring%2e:9090", "percent-encoding"),
        ("http://prometheus.monitoring:9090?x=1", "a query"),
        ("http://prometheus.monitoring:9090#x", "a fragment"),
        ("http://127.0.0.1:18080#prometheus.monitoring:9090", "a fragment"),
        (" http://prometheus.monitoring:9090", "whitespace"),
        ("http://prometheus.monitoring:9090 ", "whitespace"),
        ("http://prometheus.monitoring:9090\t", "whitespace"),
        ("http://prometheus.monitoring:9090/\r\nHost: evil", "whitespace"),
        ("http://prometheus.monitoring:9090\x00", "control"),
        ("http://prometheus.monitoring:9090\x7f", "control"),
        ("http://prömetheus.monitoring:9090", "non-ASCII"),
        ("http://prometheus.monitoring\u3002:9090", "non-ASCII"),  # an ideographic full stop
        ("http://prometheus.monitoring:９０９０", "non-ASCII"),  # fullwidth digits
        ("http://prometheus.monitoring:9090;x", "host is not"),
        ("http://prometheus.monitoring:0", "port is not"),
        ("http://prometheus.monitoring:99999", "port is not"),
        ("http://:9090", "host is not"),
        ("http:///prometheus.monitoring:9090", "host is not"),
        ("http://[::1%25eth0]:9090", "percent-encoding"),
        ("http:prometheus.monitoring:9090", "not an http"),
        ("ftp://prometheus.monitoring:9090", "not an http"),
        ("http://prometheus.monitoring:9090/a/./b", ". or .."),
        ("http://prometheus.monitoring:9090/a|b", "path has a character"),
    ],
)
def test_spellings_refused_whatever_the_list(url: str, says: str) -> None:
    anything = AllowedUrls.parse(["re:.*"])
    with pytest.raises(UrlRefused, match=re.escape(says)):
        anything.admits(url)
    assert not anything.allows(url)


def test_the_issue_example_is_refused_even_when_its_text_names_the_allowed_host() -> None:
    allowed = AllowedUrls.parse(["http://prom.monitoring:9090", r"re:http://127\.0\.0\.1:.*"])
    assert not allowed.allows(ISSUE_EXAMPLE)
    # Shown as an HTTP client reads it: the host it would connect to, not the allowed one.
    assert redact_url(ISSUE_EXAMPLE).startswith("http://127.0.0.1:18080/")


@pytest.mark.parametrize(
    ("url", "normalized"),
    [
        ("http://prometheus.monitoring:9090", "http://prometheus.monitoring:9090"),
        ("HTTP://Prometheus.Monitoring:9090/", "http://prometheus.monitoring:9090"),
        ("http://prometheus.monitoring", "http://prometheus.monitoring:80"),
        ("https://thanos.example/prefix//", "https://thanos.example:443/prefix"),
        ("http://[::1]:9090/api", "http://[::1]:9090/api"),
        ("http://[::FFFF:7f00:1]:9090", "http://[::ffff:7f00:1]:9090"),
        ("http://10.0.0.1:09090/a;b=c", "http://10.0.0.1:9090/a;b=c"),
    ],
)
def test_a_url_is_normalized_to_what_is_reached(url: str, normalized: str) -> None:
    assert reached_url(url) == normalized
    assert strict(url).url == normalized
    assert redact_url(url) == normalized
    assert AllowedUrls.parse(["re:.*"]).admits(url) == normalized


def test_an_empty_list_admits_nothing() -> None:
    nothing = AllowedUrls.parse([])
    assert nothing.entries == ()
    assert nothing.admits("http://prometheus.monitoring:9090") is None
    assert not nothing.allows("http://prometheus.monitoring:9090")


def test_a_regex_sees_the_normalized_url_never_the_authors_spelling() -> None:
    allowed = AllowedUrls.parse([r"re:http://prom\.monitoring:9090(/api/prom)?"])
    assert allowed.admits("HTTP://PROM.monitoring:9090/api/prom/") == (
        "http://prom.monitoring:9090/api/prom"
    )
    assert not allowed.allows("http://prom.monitoring")  # port 80 written out
    assert allowed.patterns == (r"re:http://prom\.monitoring:9090(/api/prom)?",)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("prometheus:9090", "neither an http(s) URL prefix nor re:<regex>"),
        ("ftp://prometheus", "neither"),
        ("http://prometheus:99999", "port is not within"),
        ("http://user@prometheus:9090", "user info"),
        ("http://prometheus:9090?x=1", "a query"),
        ("re:(", "not a valid regular expression"),
    ],
)
def test_invalid_entries_are_rejected(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        AllowedUrls.parse([entry])


def test_redacting_never_shows_credentials_or_control_characters() -> None:
    assert redact_url("https://user:pw@prom.example:9090/prefix?x=1") == (
        "https://prom.example:9090/prefix"
    )
    shown = redact_url("http://prom.example:9090/a\r\nb c#frag")
    assert shown == "http://prom.example:9090/a%0D%0Ab%20c"
    assert redact_url("http://a@b@c:1/") == "http://c:1/"  # user info ends at the last @


def test_readings_are_kept_within_a_bound_and_refusals_raised_anew() -> None:
    kept = reached("http://kept.monitoring:9090/")
    assert reached("http://kept.monitoring:9090/") is kept  # kept, not read again
    for n in range(REACHED_CACHE_SIZE):
        reached(f"http://other-{n}.monitoring:9090")
    again = reached("http://kept.monitoring:9090/")
    assert again == kept
    assert again is not kept  # pushed out by as many others
    for _ in range(2):
        with pytest.raises(UrlRefused, match="user info"):
            reached("http://user@kept.monitoring:9090")
