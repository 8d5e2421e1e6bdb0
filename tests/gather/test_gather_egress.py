"""The ``--allowed-prometheus-url`` allow list: prefixes that respect URL boundaries, and
``re:`` regexes matched against the whole URL."""

from __future__ import annotations

import re

import pytest

from cachescale.gather.egress import AllowedUrls

ALLOWED = AllowedUrls.parse(
    [
        "http://prometheus.monitoring:9090",
        "https://thanos.example/prefix/",
        r"re:http://prom-[a-z]+\.monitoring\.svc:9090",
    ]
)


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.monitoring:9090",
        "http://prometheus.monitoring:9090/",
        "http://PROMETHEUS.monitoring:9090/sub/path",
        "https://thanos.example/prefix",
        "https://thanos.example:443/prefix/deeper",
        "http://prom-main.monitoring.svc:9090",
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
    ],
)
def test_refused(url: str) -> None:
    assert not ALLOWED.allows(url)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("prometheus:9090", "neither an http(s) URL prefix nor re:<regex>"),
        ("ftp://prometheus", "neither"),
        ("http://prometheus:99999", "neither"),
        ("re:(", "not a valid regular expression"),
    ],
)
def test_invalid_entries_are_rejected(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        AllowedUrls.parse([entry])
