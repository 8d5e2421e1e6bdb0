"""Numbers as messages quote them (``decide.words``), as a table of cases."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cachescale.decide import words
from cachescale.snapshot import Measured, Unit

UNKNOWN = Measured.unknown("series absent", Unit.SECONDS)
BEYOND = Measured.quantile(400.0, Unit.SECONDS, lower_bound=True)
WIDE = Measured.quantile(1.3, Unit.SECONDS, bucket=(1.0, 2.5))
PLAIN = Measured.quantile(0.578, Unit.SECONDS)


@pytest.mark.parametrize(
    ("say", "value", "expected"),
    [
        (words.ratio, 0.854, "0.85"),
        (words.tokens, 9800.4, "9,800"),
        (words.rate, 32.4, "32"),
        (words.rate, 0.4234, "0.42"),
        (words.seconds, 0.578, "0.58 s"),
        (words.seconds, 2368.4, "2,368 s"),
        (words.cost, 1142.4, "1,142"),
        (words.latency, PLAIN, "0.58 s"),
        (words.latency, BEYOND, "> 400 s"),
        (words.latency, WIDE, "1.30 s (bucket 1–2.5 s)"),
        (words.latency, UNKNOWN, "unknown"),
        (words.latency_cell, BEYOND, ">400s"),
        (words.latency_cell, WIDE, "1.30s(1–2.5s)"),
    ],
)
def test_words(say: Callable[[object], str], value: object, expected: str) -> None:
    assert say(value) == expected


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (31.0, 33.0, "32 ± 1"),
        # A half-width of 0.2 still reads ± 1 from 10 up, never ± 0.
        (31.8, 32.2, "32 ± 1"),
        (28.0, 36.0, "32 ± 4"),
        (0.4, 0.6, "0.5 ± 0.1"),
    ],
)
def test_spread(low: float, high: float, expected: str) -> None:
    assert words.spread(low, high) == expected
