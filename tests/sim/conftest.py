"""Fixtures of the simulator's tests: the session's long closed-loop runs.

They are most of the suite's CPU, so they start as soon as the session knows a test will
read them (``pytest_collection_finish``), in the background: the pytest worker goes on with
other tests meanwhile, at a higher priority than the simulations (``NICENESS``), and a test
that reads ``loops`` waits for them. Under pytest-xdist every worker starts them, and the
file lock in ``shared_summaries`` lets one make them while the others wait to read them.
Not done: a session stopped early (``-x``) still waits for the runs in flight before it
exits (Ctrl-C stops them at once).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.sim.closed_loop import LoopSummary, run_all, shared_summaries, suite_runs

LOOPS_TIMEOUT_S = 3600
"""pytest-timeout's limit for a test that reads ``loops``: its setup waits for every
closed-loop run, which on two shared cores takes far longer than any single test."""

_background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="closed-loop")
_started: list[Future[dict[str, LoopSummary]]] = []


def _start(config: pytest.Config) -> None:
    """Start making the runs in the background (once). Under pytest-xdist the workers'
    temporary directories share a parent, where one worker leaves them for the others."""
    if _started:
        return
    if "PYTEST_XDIST_WORKER" in os.environ:
        folder = config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
        _started.append(_background.submit(shared_summaries, folder))
    else:  # one process: nobody to share with
        _started.append(_background.submit(run_all, suite_runs()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test that reads ``loops`` the closed-loop runs' own time limit."""
    for item in items:
        if "loops" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(LOOPS_TIMEOUT_S))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the runs as soon as a selected test will read them."""
    if session.config.option.collectonly:
        return
    if any("loops" in getattr(item, "fixturenames", ()) for item in session.items):
        _start(session.config)


@pytest.fixture(scope="session")
def loops(pytestconfig: pytest.Config) -> dict[str, LoopSummary]:
    """Every run of ``suite_runs()``, by name, made once per session."""
    _start(pytestconfig)
    return _started[0].result()
