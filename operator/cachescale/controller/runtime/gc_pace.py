"""How often, and over what, the running operator's cyclic garbage collector works.

CPython collects reference cycles in three generations; a *full* collection walks every
tracked object the process holds. An operator serving thousands of policies holds
millions (each policy's body, status, decision memory and indexed targets), and each
evaluation promotes more into the oldest generation (a batch's parsed Prometheus answer
outlives many young collections), so with the interpreter's default thresholds a full
collection came every few seconds and cost a large share of the CPU of an evaluation
(``bench/RESULTS.md``). Almost nothing the operator holds long forms cycles: freed by
reference counting, it never needs the collector.

``pace_collections`` keeps the young collections as they are (they find the cycles of
short-lived work: exceptions and their frames, finished tasks), and:

- considers a full collection only every ``FULL_AFTER_YOUNGER`` collections of the middle
  generation instead of every 10 (CPython also waits until a quarter of the oldest
  generation is new);
- freezes what survives a full collection (``gc.freeze``), so the next one walks only
  what was promoted since, not the whole heap again; an object frozen this way is still
  freed by reference counting when it is dropped;
- thaws the frozen objects every ``THAW_SECONDS``, so the full collection after that
  walks everything once and frees the cycles among them.

Cycles that reach the oldest generation wait that much longer to be freed (a frozen one
up to ``THAW_SECONDS``): memory, not correctness.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FULL_AFTER_YOUNGER = 100
"""Middle-generation collections between two full ones (CPython's default: 10)."""

THAW_SECONDS = 3600.0
"""The longest the survivors of full collections stay frozen: cyclic garbage among them
is freed by the first full collection after this."""


@dataclass
class Freezer:
    """A ``gc.callbacks`` entry: at the end of each full collection, freeze its survivors,
    or thaw everything frozen once ``thaw_seconds`` have passed since the last thaw."""

    thaw_seconds: float = THAW_SECONDS
    clock: Callable[[], float] = time.monotonic
    thawed_at: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.thawed_at < 0:
            self.thawed_at = self.clock()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """React to the end of a full collection (``gc.callbacks``' signature)."""
        if phase != "stop" or info["generation"] != 2:
            return
        now = self.clock()
        if now - self.thawed_at >= self.thaw_seconds:
            gc.unfreeze()
            self.thawed_at = now
        else:
            gc.freeze()


def pace_collections(freezer: Freezer | None = None) -> tuple[int, int, int]:
    """Set the thresholds for ``cachescale run`` and install ``freezer`` (a new
    :class:`Freezer` when None) unless one already is; the thresholds now in force."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_AFTER_YOUNGER)
    if not any(isinstance(callback, Freezer) for callback in gc.callbacks):
        gc.callbacks.append(freezer or Freezer())
    return gc.get_threshold()
