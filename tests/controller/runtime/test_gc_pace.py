"""``cachescale run`` paces full garbage collections and freezes their survivors; the young
ones stay as they were, and a thaw lets cycles among the frozen be freed."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cachescale.controller.runtime.gc_pace import FULL_AFTER_YOUNGER, Freezer, pace_collections


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before, callbacks = gc.get_threshold(), list(gc.callbacks)
    yield before
    gc.set_threshold(*before)
    gc.callbacks[:] = callbacks
    gc.unfreeze()


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


class Ticks:
    """A clock moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_full_collection_freezes_its_survivors_once_installed(
    thresholds: tuple[int, int, int],
) -> None:
    pace_collections(Freezer(clock=Ticks()))
    pace_collections()  # installing again adds no second freezer
    assert sum(isinstance(c, Freezer) for c in gc.callbacks) == 1
    kept = [[i] for i in range(1000)]
    gc.collect()
    assert gc.get_freeze_count() >= len(kept), "the survivors are frozen"
    assert all(not any(o is k for o in gc.get_objects(2)) for k in kept[:5])


def test_a_cycle_among_frozen_objects_is_freed_after_the_thaw(
    thresholds: tuple[int, int, int],
) -> None:
    ticks = Ticks()
    pace_collections(Freezer(thaw_seconds=60.0, clock=ticks))
    freed: list[str] = []

    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            freed.append("node")

    node = Node()
    gc.collect()  # survives, and is frozen
    del node
    gc.collect()
    assert not freed, "a frozen cycle waits for the thaw"
    ticks.now = 60.0
    gc.collect()  # thaws at its end
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert freed == ["node"]
