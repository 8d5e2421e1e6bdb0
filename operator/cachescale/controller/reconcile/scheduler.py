"""When each policy is evaluated: one asyncio task owns the due time of every policy.

With a sleeping loop per policy, each policy would come due on its own and send its own
Prometheus request, so the load would grow with the number of policies. Here the policies
of one gather group (the handlers say which: one Prometheus, credentials and window) come
due together, so one job reads all of them with one request per group
(``gather/grouped.py``), and the cost grows with the number of groups. The bookkeeping is
a dict entry per policy, not a task (the evidence: ``docs/design/operator-scale.md``).

The parts: ``schedule.py`` keeps the due times (each group's slots, the start-up
catch-up, one job per group at a time); ``fairness.py`` says which due group's job may
start, so that one namespace's slow Prometheus delays no other namespace; this module is
the task that wakes when something is due, submits each group's job to the worker pool
and reports how punctual the evaluations were.

The wait from a due time to the job's start is ``cachescale_evaluation_lateness_seconds``;
missed intervals, for a busy group or one held back by the fairness rule, are counted in
``cachescale_evaluation_missed_intervals``; the groups due and held back, by which limit,
are ``cachescale_evaluation_jobs_waiting`` (``controller/reconcile/metrics.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Executor
from typing import Generic, Protocol, TypeVar

from cachescale.controller.reconcile.schedule import Due, Schedule

K = TypeVar("K", bound=Hashable)

log = logging.getLogger("cachescale.operator")


Job = Callable[[], None]
"""One group's evaluations, run in a worker thread."""
MakeJob = Callable[[list[Due[K]]], Job]
"""Builds a group's job on the event loop (where kopf's objects may be read)."""


class Punctuality(Protocol):
    """Where lateness and missed intervals go (``controller/reconcile/metrics.py``)."""

    def started_late(self, seconds: float) -> None:
        """A policy's evaluation started ``seconds`` after its due time."""

    def missed_intervals(self, count: int) -> None:
        """``count`` more whole intervals passed without a policy's evaluation starting."""

    def jobs_waiting(self, by_limit: Mapping[str, int]) -> None:
        """The groups due now and held back, by limit (``fairness.NAMESPACE_LIMIT``,
        ``fairness.WORKER_LIMIT``; a limit absent holds back none)."""


class Scheduler(Generic[K]):
    """Runs ``Schedule``: wakes when something is due, submits each group's job to
    ``executor``, and reports lateness, missed intervals and waiting jobs to ``observe``.
    ``workers`` is the executor's number of threads (None: jobs queue in the executor),
    ``per_namespace`` the jobs one namespace may run at once (None: no limit)."""

    def __init__(
        self,
        make_job: MakeJob[K],
        executor: Executor,
        observe: Punctuality,
        clock: Callable[[], float] = time.time,
        *,
        workers: int | None = None,
        per_namespace: int | None = None,
    ) -> None:
        self.schedule: Schedule[K] = Schedule(workers, per_namespace)
        self._make_job = make_job
        self._executor = executor
        self._observe = observe
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._created_at = clock()

    def register(
        self,
        key: K,
        interval: Callable[[], float],
        group: Callable[[], Hashable],
        namespace: str | None = None,
    ) -> None:
        """Evaluate ``key`` every ``interval()`` seconds with the other members of its
        ``group()``, its jobs charged to ``namespace``; caught up in the scheduler's first
        interval (``schedule.py``)."""
        now = self._clock()
        starting = now - self._created_at < interval()
        self.schedule.add(key, interval, group, now, catching_up=starting, namespace=namespace)
        self._wake.set()

    def unregister(self, key: K) -> None:
        """Stop evaluating ``key`` (a job already submitted still runs: the job checks)."""
        self.schedule.remove(key)

    def start(self) -> None:
        """Run in the current event loop until ``stop``."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name="scheduler")

    def stop(self) -> None:
        """Stop submitting jobs (jobs already submitted run to their end)."""
        if self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        """Wake, submit what is due, sleep until the next due time or a change."""
        while True:
            self._wake.clear()
            now = self._clock()
            found = self.schedule.take(now)
            if found.missed:
                self._observe.missed_intervals(found.missed)
            self._observe.jobs_waiting(found.waiting)
            for group, members in found.jobs.items():
                self._submit(group, members)
            wake = self.schedule.next_wake(now)
            timeout = None if wake is None else max(0.0, wake - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _submit(self, group: Hashable, members: list[Due[K]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            job = self._make_job(members)
        except Exception:  # a bug must not stop the scheduler, nor keep the group busy
            log.exception("preparing the evaluations of %d policies failed", len(members))
            self.schedule.done(group)
            return
        future = loop.run_in_executor(self._executor, self._timed, members, job)
        future.add_done_callback(lambda ended: self._ended(group, ended))

    def _timed(self, members: list[Due[K]], job: Job) -> None:
        """In the worker: record how late each policy starts, then run the job."""
        started = self._clock()
        for member in members:
            late = max(0.0, started - member.at)
            self._observe.started_late(late)
            if late >= member.interval:  # it waited for a worker past its next slot
                self._observe.missed_intervals(math.floor(late / member.interval))
        job()

    def _ended(self, group: Hashable, ended: asyncio.Future[None]) -> None:
        self.schedule.done(group)
        self._wake.set()
        if not ended.cancelled() and ended.exception() is not None:
            log.error("a group's evaluations failed", exc_info=ended.exception())
