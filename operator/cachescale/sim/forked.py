"""Work finished in a forked child process, its result sent back pickled.

A simulation that leaves a shared fleet (:mod:`cachescale.sim.drive`) needs nothing more
from the process it left, so on a machine with a CPU to spare it can go on in a child
while the parent goes on with the rest. ``fork`` copies the whole interpreter as it is:
nothing is pickled on the way in, and the child runs the same code on the same state it
would have run on in the parent. Only its result crosses back, through a pipe.

Rules:

* **Only where forking is safe**: a process with one thread that runs Python code (a
  forked child inherits every lock another such thread held, held forever), on a
  platform with ``fork``. Anywhere else ``spare_cpus`` is 0 and callers do the work
  in-process: same result, one CPU.
* **Nothing of the work stays in the parent**: ``Forked`` keeps only the child's pid
  and the pipe's read end, so what the work refers to is the child's alone once the
  caller lets go of it.
* **Failures cross back**: an exception in the child is raised in the parent
  (``ForkedError``, with the child's traceback as text); a child that ends without a
  whole result (killed, out of memory) is one too, with how it ended.
* The child ends with ``os._exit``: it runs none of the parent's ``atexit`` hooks and
  flushes none of its buffers. ``cancel`` kills a child whose result is no longer wanted.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class ForkedError(RuntimeError):
    """Work done in a forked child failed, or the child ended without its result."""


def spare_cpus() -> int:
    """CPUs this process may use besides its own, where forking is safe; else 0."""
    if not hasattr(os, "fork") or _threads() > 1:
        return 0
    return len(os.sched_getaffinity(0)) - 1


def _threads() -> int:
    """The threads that run Python code: ``threading``'s and raw ``_thread`` ones (such as
    a test runner's I/O thread), which may hold the interpreter's locks at any moment. A
    library's native threads (OpenBLAS's, started by importing numpy) run no Python code
    and mend themselves across a fork."""
    return len(sys._current_frames())


class Forked(Generic[_T]):
    """``work()`` running in a forked child from construction on; ``result()`` waits for
    its return value (or raises what it raised)."""

    def __init__(self, work: Callable[[], _T]) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read)
            _child(work, write)
        os.close(write)
        self._pid: int | None = pid
        self._read = read

    def result(self) -> _T:
        """The child's return value, once it sent it all; the child is then reaped."""
        with os.fdopen(self._read, "rb") as pipe:
            sent = pipe.read()
        status = self._reap()
        try:
            failed, payload = pickle.loads(sent)
        except Exception:  # a cut-off result: the child failed
            raise ForkedError(f"a forked child ended without its result ({status})") from None
        if failed:
            raise ForkedError(f"a forked child failed:\n{payload}")
        value: _T = payload
        return value

    def cancel(self) -> None:
        """Kill the child and drop its result (nothing happens once ``result`` returned)."""
        if self._pid is None:
            return
        os.kill(self._pid, signal.SIGKILL)
        self._reap()
        os.close(self._read)

    def _reap(self) -> str:
        """Wait for the child to end; how it ended, in words."""
        assert self._pid is not None, "a child is reaped once"
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit code {os.waitstatus_to_exitcode(status)}"


def _child(work: Callable[[], object], write: int) -> None:
    """In the child: run ``work``, send ``(failed, result or traceback)``, and exit."""
    code = 1
    try:
        try:
            outcome: tuple[bool, object] = (False, work())
        except BaseException:  # every failure is the parent's to raise
            outcome = (True, traceback.format_exc())
        with os.fdopen(write, "wb") as pipe:
            pickle.dump(outcome, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    finally:
        os._exit(code)
