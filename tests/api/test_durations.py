"""Duration strings: the grammar the models, Prometheus and CEL's duration() all accept."""

from __future__ import annotations

import pytest

from cachescale.api.durations import PARSED_CACHE_SIZE, parse_duration_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h30m", 5400), ("2h", 7200), ("1m30s", 90), ("500ms", 0.5)],
)
def test_parses(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 m", "1.5h", "-5m", "5M", "30s5m", "0s", "0h0m"])
def test_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|zero"):
        parse_duration_seconds(text)


def test_parsed_strings_are_kept_within_a_bound_and_refusals_raised_anew() -> None:
    kept = parse_duration_seconds("17m")
    assert parse_duration_seconds("17m") is kept  # kept, not parsed again
    for n in range(1, PARSED_CACHE_SIZE + 1):
        parse_duration_seconds(f"{n}ms")
    again = parse_duration_seconds("17m")
    assert again == kept
    assert again is not kept  # pushed out by as many others
    for _ in range(2):
        with pytest.raises(ValueError, match="is zero"):
            parse_duration_seconds("0s")
