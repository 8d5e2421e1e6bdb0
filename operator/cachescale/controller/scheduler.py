"""When each policy is evaluated: one asyncio task owns the due time of every policy.

Why: with a sleeping loop per policy, each policy comes due on its own, and each
evaluation sends its own Prometheus request, so the load grows with the number of
policies. Here the policies of one gather group (the handlers say which: one Prometheus,
credentials and window) come due together, so one job reads all of them with one
request per group (``gather/grouped.py``), and the cost grows with the number of groups. The
bookkeeping is a dict entry per policy, not a task (measurements: docs/decisions.md,
"Scheduling evaluations").

The due times of a group are the slots ``offset + k × interval`` of the wall clock: the
offset is a stable hash of the group, so groups are spread over the interval, the slots
survive a restart, and policies of one group with intervals of 30 s and 60 s meet every
60 s. A policy registered between two slots waits for the next one; its interval is
re-read each time its next slot is computed. Except in the scheduler's first interval
(a starting operator, as kopf lists the policies): a group's latest slot may have passed
while no process ran, so the policy is caught up after half the age of that slot, or at
its next slot if that comes first (``catch_up``). The slot just missed is caught up at
once and older ones, which the previous process more likely evaluated, later: the
catch-ups are spread over the first third of the interval in the order the slots
passed. Waiting for the next slot made a restart cost a missed interval to 500 of 1,000
policies; catching up only the slots after this scheduler was created, to 750 (the
restart's dead time is mostly before it); catching up every group at once made the
first round of 3,000 policies one burst that Prometheus answered past the deadline for
1,950 of them (bench/RESULTS.md).

A starting group's catch-ups go as one job: kopf registers the listed policies one after
another, each with its own ``now``, so their catch-up times differ; submitted as they
came due, a group of 250 went out as jobs of 1, 27, 136 and 86 policies, each waiting
for the one before (a job is one Prometheus request), and 86 policies missed an interval
(bench/RESULTS.md, 2026-12-03). So a group that had a policy join in the start-up within
the last ``SETTLE_S`` is not submitted yet, and once one of its members is due, the job
takes every member still waiting for its first start-up evaluation.

At each wake the due policies are collected per group and each group is submitted as one
job to the worker pool. A group whose previous job is still running is not submitted
again: its due policies wait for that job to end and start late, and every whole interval
they wait is a missed interval. So a slow Prometheus delays only its own group, and no
policy is ever evaluated twice at once by the scheduler. The wait from a due time to the
job's start is ``cachescale_evaluation_lateness_seconds``; missed intervals are counted
in ``cachescale_evaluation_missed_intervals``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)

PHASE_RANGE_MS = 1 << 32
"""Group offsets are spread over this many milliseconds (about 50 days): modulo any
interval, the offsets of distinct groups are spread evenly."""

SETTLE_S = 1.0
"""A starting group is held until no policy of it has joined for this long, or a
thirtieth of its interval if that is shorter: kopf's listing registers hundreds of
policies a second, so a pause this long means the list is through."""

log = logging.getLogger("cachescale.operator")


def phase_of(group: Hashable) -> float:
    """The group's slot offset in seconds: stable across processes and restarts."""
    digest = hashlib.sha256(repr(group).encode()).digest()
    return int.from_bytes(digest[:4], "big") % PHASE_RANGE_MS / 1000.0


def next_slot(offset: float, interval: float, after: float, inclusive: bool = False) -> float:
    """The first slot ``offset + k × interval`` after ``after`` (or at it, ``inclusive``)."""
    steps = (after - offset) / interval
    k = math.ceil(steps) if inclusive else math.floor(steps) + 1
    return offset + k * interval


@dataclass(frozen=True)
class Due(Generic[K]):
    """A policy submitted in a job: its key, the slot it was due at, its interval then."""

    key: K
    at: float
    interval: float


@dataclass
class _Entry:
    interval: Callable[[], float]
    group: Callable[[], Hashable]
    due: float
    catching_up: bool = False
    """Joined in the start-up and not evaluated yet: it rides along with its group's
    first job, whatever its own catch-up time."""


@dataclass
class Round(Generic[K]):
    """What one wake found: a job per group, and the intervals missed since last time."""

    jobs: dict[Hashable, list[Due[K]]] = field(default_factory=dict)
    missed: int = 0


def catch_up(latest: float, following: float, now: float) -> float:
    """When a starting scheduler evaluates a group whose latest slot passed at ``latest``
    (``following`` is its next slot): after half the slot's age, so the slot just missed
    comes first and the catch-ups are spread, or at the next slot if that is sooner."""
    return min(now + (now - latest) / 2, following)


def _following(offset: float, interval: float, due: float, now: float) -> float:
    """The slot after one taken at ``now`` that was due at ``due``: at least half an
    interval after ``due``, so a catch-up (due off its slots) is not followed by a slot
    moments later; for a slot taken on time, the next slot."""
    half_on = due + interval / 2
    if half_on > now:
        return next_slot(offset, interval, half_on, inclusive=True)
    return next_slot(offset, interval, now)


class Schedule(Generic[K]):
    """The bookkeeping, without I/O or a clock of its own: every call is given ``now``."""

    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}
        self._busy: set[Hashable] = set()
        self._settling: dict[Hashable, float] = {}
        """Per starting group: until when it is held (``SETTLE_S`` after its latest join)."""

    def add(
        self,
        key: K,
        interval: Callable[[], float],
        group: Callable[[], Hashable],
        now: float,
        *,
        catching_up: bool = False,
    ) -> None:
        """Schedule ``key`` from its group's next slot, or, ``catching_up``, from
        ``catch_up`` of its latest slot; then on its slots (``interval`` and ``group`` are
        asked again each time they matter: spec edits take effect)."""
        every = interval()
        due = next_slot(phase_of(group()), every, now, inclusive=True)
        if catching_up:
            due = catch_up(due if due <= now else due - every, due, now)
            self._settling[group()] = now + min(SETTLE_S, every / 30)
        self._entries[key] = _Entry(interval, group, due, catching_up)

    def remove(self, key: K) -> None:
        """Never submit ``key`` again (a job already submitted is not recalled)."""
        self._entries.pop(key, None)

    def due_at(self, key: K) -> float:
        """When ``key`` is due next."""
        return self._entries[key].due

    def take(self, now: float) -> Round[K]:
        """Every due policy of a group with no job running, one job per group, with the
        group's members still waiting for their start-up catch-up; the groups submitted
        are busy until ``done``. Due policies of a busy group wait, and each slot that
        passes meanwhile is a missed interval; a settling group waits (module doc)."""
        self._settling = {g: until for g, until in self._settling.items() if until > now}
        found: Round[K] = Round()
        riders: list[tuple[K, _Entry, Hashable]] = []
        for key, entry in self._entries.items():
            if entry.due > now:
                if entry.catching_up:
                    riders.append((key, entry, entry.group()))
                continue
            group, interval = entry.group(), entry.interval()
            if group in self._busy:
                passed = math.floor((now - entry.due) / interval)
                found.missed += passed
                entry.due += passed * interval
                continue
            if group in self._settling:
                continue
            self._submit(found, key, entry, group, now)
        for key, entry, group in riders:
            if group in found.jobs:
                self._submit(found, key, entry, group, now)
        self._busy.update(found.jobs)
        return found

    @staticmethod
    def _submit(found: Round[K], key: K, entry: _Entry, group: Hashable, now: float) -> None:
        """Put ``key`` in its group's job (a rider is due now) and move it to the slot
        after."""
        interval, at = entry.interval(), min(entry.due, now)
        found.jobs.setdefault(group, []).append(Due(key, at, interval))
        entry.due = _following(phase_of(group), interval, at, now)
        entry.catching_up = False

    def done(self, group: Hashable) -> None:
        """The group's job ended: its due policies may be submitted again."""
        self._busy.discard(group)

    def next_wake(self, now: float) -> float | None:
        """When something may next be due, or missed (None: nothing is scheduled). Right
        after ``take``, a policy still due belongs to a busy group: its next event is the
        end of the interval it is waiting in (or its group's job ending, which wakes the
        scheduler anyway)."""
        wakes = (e.due if e.due > now else e.due + e.interval() for e in self._entries.values())
        return min(itertools.chain(wakes, self._settling.values()), default=None)


Job = Callable[[], None]
"""One group's evaluations, run in a worker thread."""
MakeJob = Callable[[list[Due[K]]], Job]
"""Builds a group's job on the event loop (where kopf's objects may be read)."""


class Punctuality(Protocol):
    """Where lateness and missed intervals go (``controller/metrics.py``)."""

    def started_late(self, seconds: float) -> None:
        """A policy's evaluation started ``seconds`` after its due time."""

    def missed_intervals(self, count: int) -> None:
        """``count`` more whole intervals passed without a policy's evaluation starting."""


class Scheduler(Generic[K]):
    """Runs ``Schedule``: wakes when something is due, submits each group's job to
    ``executor``, and reports lateness and missed intervals to ``observe``."""

    def __init__(
        self,
        make_job: MakeJob[K],
        executor: Executor,
        observe: Punctuality,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.schedule: Schedule[K] = Schedule()
        self._make_job = make_job
        self._executor = executor
        self._observe = observe
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._created_at = clock()

    def register(
        self, key: K, interval: Callable[[], float], group: Callable[[], Hashable]
    ) -> None:
        """Evaluate ``key`` every ``interval()`` seconds with the other members of its
        ``group()``; caught up in the scheduler's first interval (module doc)."""
        now = self._clock()
        starting = now - self._created_at < interval()
        self.schedule.add(key, interval, group, now, catching_up=starting)
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
