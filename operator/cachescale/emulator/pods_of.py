"""Real pods' names for the emulated replicas: the emulator standing in for a Deployment.

An operator selects a Deployment's pods through the Deployment's selector and reads their
series by the ``pod`` label; emulated replicas named ``<deployment>-engine-N`` match no
real pod. With ``cachescale emulate --pods-of``, each served replica is instead scraped
as one of the real Deployment's pods, so what the operator reads from Prometheus names
the pods it reads from the Kubernetes API.

The names follow the pods as they come and go: :class:`PodFollower` lists them again on
a thread of its own every ``every_s`` wall seconds (the listing is the caller's, see
``commands/emulate_pods.py``), and the emulator re-assigns them at every step with
:func:`assign`:

- a served replica keeps its pod for as long as both exist;
- a replica without one takes the oldest pod not yet taken, lowest replica first;
- a replica left without a pod (more replicas than pods) is not served, so Prometheus
  sees no series for a pod that does not exist; a pod left without a replica (more pods
  than replicas) has no series.

When a listing fails the last names are kept, and the failure is reported once (and the
recovery once), never per attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence

FOLLOW_EVERY_S = 1.0
"""Wall seconds between two listings of the Deployment's pods."""
STOP_WAIT_S = 2.0
"""Wall seconds :meth:`PodFollower.stop` waits for a listing under way (the thread is a
daemon: a listing stuck on an unreachable API server does not hold the exit)."""


class PodListError(Exception):
    """The pods could not be listed; the message says why, in one line."""


def assign(
    current: Mapping[int, str], served: Sequence[int], pods: Sequence[str]
) -> dict[int, str]:
    """Replica → pod for the ``served`` replicas (ids, in any order), from ``pods`` (the
    real pods' names, oldest first), keeping each of ``current`` whose replica is still
    served and whose pod still exists."""
    still = set(pods)
    kept = {replica: pod for replica, pod in current.items() if replica in served and pod in still}
    taken = set(kept.values())
    free = iter(pod for pod in pods if pod not in taken)
    for replica in sorted(served):
        if replica not in kept:
            pod = next(free, None)
            if pod is None:
                break
            kept[replica] = pod
    return kept


class PodFollower:
    """The latest listing of a Deployment's pods, refreshed on a daemon thread."""

    def __init__(
        self,
        list_pods: Callable[[], list[str]],
        first: Collection[str],
        on_report: Callable[[str], None],
        every_s: float = FOLLOW_EVERY_S,
    ) -> None:
        """``list_pods`` lists the names (oldest first) or raises :class:`PodListError`;
        ``first`` is the listing taken at start; ``on_report`` is told, in one line, when
        listing starts failing and when it works again."""
        self._list = list_pods
        self._names = tuple(first)
        self._report = on_report
        self._every_s = every_s
        self._failing: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pods-of", daemon=True)

    def names(self) -> tuple[str, ...]:
        """The pods' names at the last listing that worked, oldest first."""
        return self._names

    def start(self) -> None:
        """List again every ``every_s`` until :meth:`stop`."""
        self._thread.start()

    def stop(self) -> None:
        """Stop listing (waits up to :data:`STOP_WAIT_S` for a listing under way)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)

    def refresh(self) -> None:
        """List once now: keep the names, or keep the last ones and report a failure."""
        try:
            names = tuple(self._list())
        except PodListError as error:
            if self._failing is None:
                self._report(f"{error}; serving the last pods listed until it works again")
            self._failing = str(error)
            return
        if self._failing is not None:
            self._report("listing the pods works again")
            self._failing = None
        self._names = names

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            self.refresh()
