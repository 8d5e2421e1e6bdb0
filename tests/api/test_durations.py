"""Duration strings: the grammar the models, Prometheus and CEL's duration() all accept."""

from __future__ import annotations

import pytest

from cachescale.api.durations import parse_duration_seconds


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
