"""Duration strings as users write them in a policy (``30s``, ``5m``, ``1h30m``).

The API stores durations as strings on the wire, like Kubernetes and Prometheus do, and
the models parse them with this module. The accepted grammar is the subset that Go's
``time.ParseDuration`` (and so the API server's CEL ``duration()``), Prometheus range
selectors and this parser all agree on: one or more ``<integer><unit>`` groups with units
``h``, ``m``, ``s``, ``ms`` in that order, no sign, no spaces, no fractions. Keeping the
three in agreement is what lets the CRD reject the same strings pydantic rejects. Go counts
a duration in int64 nanoseconds, so anything past about 2,562,047 hours fails there; it
fails here too, with the same limit, rather than parsing to a number no other part agrees
with.
"""

from __future__ import annotations

import re
from functools import lru_cache

DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$"
"""OpenAPI ``pattern`` for a duration; the empty string is rejected separately."""

_DURATION_RE = re.compile(DURATION_PATTERN)
_UNIT_SECONDS = (3600.0, 60.0, 1.0, 0.001)
MAX_DURATION_SECONDS = (2**63 - 1) / 1e9
"""The longest duration Go (and so the API server's CEL) can represent: int64 nanoseconds."""


PARSED_CACHE_SIZE = 256
"""Duration strings whose seconds are kept: policies write a few (``30s``, ``5m``), read
again at every evaluation."""


def parse_duration_seconds(text: str) -> float:
    """Return the number of seconds in ``text`` or raise ``ValueError`` saying why (the
    last ``PARSED_CACHE_SIZE`` parsed are kept; a string refused is parsed anew)."""
    return _parsed(text)


@lru_cache(maxsize=PARSED_CACHE_SIZE)
def _parsed(text: str) -> float:
    """``parse_duration_seconds``, parsed afresh."""
    match = _DURATION_RE.fullmatch(text)
    if not text or match is None:
        raise ValueError(
            f"{text!r} is not a duration; write it like 30s, 5m or 1h30m "
            "(integer amounts, units h, m, s, ms, largest first)"
        )
    seconds = 0.0
    for group, unit_seconds in zip(match.groups(), _UNIT_SECONDS, strict=True):
        if group is not None:
            seconds += int(group.rstrip("hms")) * unit_seconds
    if seconds <= 0:
        raise ValueError(f"{text!r} is zero; a duration must be positive")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{text!r} is too long to be a duration (at most about 2562047h)")
    return seconds
