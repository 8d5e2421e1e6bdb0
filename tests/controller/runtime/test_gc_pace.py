"""``cachescale run`` paces full garbage collections; the young ones stay as they were."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cachescale.controller.runtime.gc_pace import FULL_AFTER_YOUNGER, pace_collections


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_full_collections_are_paced_and_young_ones_untouched(
    thresholds: tuple[int, int, int],
) -> None:
    young, middle, full = pace_collections()
    assert (young, middle) == thresholds[:2]
    assert full == FULL_AFTER_YOUNGER > thresholds[2]


def test_short_lived_cycles_are_still_freed_by_young_collections(
    thresholds: tuple[int, int, int],
) -> None:
    """Cycles of short-lived work (an exception and its frame) are found by the automatic
    young collections, which pacing leaves alone."""
    pace_collections()
    collected: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] < 2:
            collected.append(info["collected"])

    gc.callbacks.append(seen)
    try:
        for _ in range(20 * thresholds[0]):
            a: list[object] = []
            a.append(a)  # a cycle, unreachable at the next turn
    finally:
        gc.callbacks.remove(seen)
    assert sum(collected) >= 10 * thresholds[0], "young collections freed the cycles"
