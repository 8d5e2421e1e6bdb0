"""The cyclic garbage collector, paused while a simulation runs.

A simulation holds millions of objects the collector tracks (requests, their block-hash
lists, sequences, the engines' queues) and makes almost no reference cycles: what it drops
is freed by reference counting. With the interpreter's default thresholds the collector
still walks everything it holds hundreds of times per run, which costs CPU of its own and
evicts the engines' working set from the CPU caches. ``paused_collection`` turns automatic
collection off for a block and restores the previous state after it; the few cycles a run
makes wait for the first collection after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_collection() -> Iterator[None]:
    """Automatic cyclic collection off inside the block, as it was before after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
