"""Waiting for a condition: the one poll loop the test fixtures, the e2e harness and the
benchmark share (standard library only, so ``make envtest`` needs nothing else)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    every_s: float = 0.1,
    error: type[Exception] = AssertionError,
) -> T:
    """Call ``check`` every ``every_s`` until it returns something other than None, and
    return that; raise ``error`` (a test failure by default) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)
