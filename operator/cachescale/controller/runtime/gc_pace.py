"""How often the running operator's cyclic garbage collector looks at everything it holds.

CPython collects reference cycles in three generations; a *full* collection walks every
tracked object the process holds. An operator serving thousands of policies holds
millions (each policy's body, status, decision memory and indexed targets), and each
evaluation promotes more into the oldest generation (a batch's parsed Prometheus answer
outlives many young collections), so with the interpreter's default thresholds a full
collection came every few seconds and cost a large share of the CPU of an evaluation
(``bench/RESULTS.md``). Almost nothing the operator holds long forms cycles: freed by
reference counting, it never needs the collector.

``pace_collections`` keeps the young collections as they are (they find the cycles of
short-lived work: exceptions and their frames, finished tasks) and considers a full one
only every ``FULL_AFTER_YOUNGER`` collections of the middle generation instead of every
10 (CPython also waits until a quarter of the oldest generation is new). Cycles that
reach the oldest generation wait that much longer to be freed: memory, not correctness.
"""

from __future__ import annotations

import gc

FULL_AFTER_YOUNGER = 100
"""Middle-generation collections between two full ones (CPython's default: 10)."""


def pace_collections() -> tuple[int, int, int]:
    """Set the thresholds for ``cachescale run``; the thresholds now in force."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_AFTER_YOUNGER)
    return gc.get_threshold()
