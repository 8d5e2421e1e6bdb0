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

At each wake the due policies are collected per group, and each group that may start
(below) is submitted as one job to the worker pool. A group whose previous job is still
running is not submitted again: its due policies wait for that job to end and start late,
and every whole interval they wait is a missed interval. So a slow Prometheus delays only
its own group, and no policy is ever evaluated twice at once by the scheduler.

Fair scheduling: a policy author is untrusted, so one namespace's slow or failing
Prometheus must not delay another namespace's policies. The scheduler, not the executor,
decides when a job starts: it never submits more jobs than the pool has workers, so no job
waits in the executor's queue behind another namespace's. A job's namespaces are those of
the policies in it; it is charged to each of them while it runs. The rule for starting a
due group's job (``Pool``):

- *per-namespace limit*: it may start while at least one of its namespaces runs fewer
  than ``per_namespace`` jobs (``--max-concurrent-per-namespace``). A group spanning
  namespaces (policies of several namespaces reading one Prometheus without credentials,
  e.g. the operator's default one) is every one of its namespaces' evaluation: any of them
  entitled to a worker lets it start, so a namespace at its limit cannot hold back another
  namespace's policies by sharing a group with them, and charging it to all of them means
  a namespace gains no more jobs through shared groups than the others it shares with;
- *reserve*: the last ``reserved`` workers (a quarter of the pool, at least one) go only
  to jobs of which a namespace has no job running, so neither one namespace nor several
  at their limits take the whole pool;
- *order*: among the groups that may start, those whose least busy namespace runs the
  fewest jobs go first, then those of the namespace that started a job longest ago (round
  robin over the namespaces waiting), then the longest waiting (per namespace, first due
  first served): a namespace at its limit is throttled, never starved, and its policies
  are each evaluated in turn.

The invariants: a namespace never runs more than ``per_namespace`` jobs of its own
policies alone; a job of a namespace already running one starts only while more than
``reserved`` workers are free, so at most ``workers - reserved`` running jobs were started
that way; and a job of a namespace running none waits for a worker only while every
worker is busy, at least ``reserved`` of them with jobs started for namespaces that were
running none. Whatever other namespaces' Prometheus does, that is all a victim waits for.
A job that overruns keeps its worker (a thread cannot be stopped) but counts only against
its own namespaces: the evaluation's deadline ends its reads (``gather/prometheus.py``),
and until then it delays nothing outside them. There is no bound per Prometheus endpoint:
the namespace limit already bounds a tenant however many URLs it may name (the allow list
decides which), and a bound per endpoint would let one tenant's slow jobs on a shared
Prometheus hold back another tenant's.

The wait from a due time to the job's start is ``cachescale_evaluation_lateness_seconds``;
missed intervals, for a busy group or one held back by the rule above, are counted in
``cachescale_evaluation_missed_intervals``; the groups due and held back, by which limit,
are ``cachescale_evaluation_jobs_waiting`` (``controller/reconcile/metrics.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping
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

DEFAULT_PER_NAMESPACE = 4
"""Jobs of one namespace running at once (``--max-concurrent-per-namespace``)."""

RESERVED_SHARE = 4
"""A pool of ``n`` workers keeps ``n // RESERVED_SHARE`` of them (at least one) for jobs
of which a namespace has no job running (module doc)."""

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
    namespace: str | None = None
    """The policy's namespace: its group's jobs are charged to it (None: to none)."""


NAMESPACE_LIMIT = "namespace"
"""A group held back because each of its namespaces runs ``per_namespace`` jobs."""
WORKER_LIMIT = "workers"
"""A group held back because no worker is free for it (the pool is full, or only its
reserve is left)."""


@dataclass
class Round(Generic[K]):
    """What one wake found: a job per group, the intervals missed since last time, and
    how many due groups wait, by the limit that holds them back."""

    jobs: dict[Hashable, list[Due[K]]] = field(default_factory=dict)
    missed: int = 0
    waiting: Counter[str] = field(default_factory=Counter)


@dataclass
class Pool:
    """Which job may start now (module doc, "Fair scheduling"): the jobs running, in
    all and per namespace, against the per-namespace limit and the reserve. None for
    ``workers`` or ``per_namespace``: no such limit."""

    workers: int | None = None
    per_namespace: int | None = None
    running: int = 0
    by_namespace: Counter[str] = field(default_factory=Counter)
    served: dict[str, int] = field(default_factory=dict)
    """Per namespace, the number of the latest job started for it (a later job: a
    higher number; a namespace never served has none)."""
    _starts: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def reserved(self) -> int:
        """Workers only a job of which a namespace has no job running may take."""
        return 0 if self.workers is None else max(1, self.workers // RESERVED_SHARE)

    def holds_back(self, namespaces: Collection[str]) -> str | None:
        """Why a job of ``namespaces`` may not start now (``NAMESPACE_LIMIT`` or
        ``WORKER_LIMIT``), or None: it may."""
        least = self.rank(namespaces)
        if self.per_namespace is not None and namespaces and least >= self.per_namespace:
            return NAMESPACE_LIMIT
        if self.workers is None:
            return None
        free = self.workers - self.running
        if free <= 0 or (least > 0 and free <= self.reserved):
            return WORKER_LIMIT
        return None

    def rank(self, namespaces: Collection[str]) -> int:
        """Jobs running of the least busy of ``namespaces`` (0 for none)."""
        return min((self.by_namespace[ns] for ns in namespaces), default=0)

    def turn(self, namespaces: Collection[str]) -> int:
        """When the least recently served of ``namespaces`` last started a job (-1 for
        never, or no namespace): the lower, the sooner its turn."""
        return min((self.served.get(ns, -1) for ns in namespaces), default=-1)

    def start(self, namespaces: Collection[str]) -> None:
        """A job of ``namespaces`` started: charged to each."""
        self.running += 1
        self.by_namespace.update(namespaces)
        number = next(self._starts)
        self.served.update((ns, number) for ns in namespaces)

    def end(self, namespaces: Collection[str]) -> None:
        """A job of ``namespaces`` ended."""
        self.running -= 1
        self.by_namespace.subtract(namespaces)
        for namespace in namespaces:
            if self.by_namespace[namespace] <= 0:
                del self.by_namespace[namespace]


def catch_up(latest: float, following: float, now: float) -> float:
    """When a starting scheduler evaluates a group whose latest slot passed at ``latest``
    (``following`` is its next slot): after half the slot's age, so the slot just missed
    comes first and the catch-ups are spread, or at the next slot if that is sooner."""
    return min(now + (now - latest) / 2, following)


def _wait(entry: _Entry, now: float) -> int:
    """A due policy, before it starts or waits: moved to the latest slot that passed, and
    the number of slots that passed since its due time (each a missed interval)."""
    interval = entry.interval()
    passed = math.floor((now - entry.due) / interval)
    if entry.due + (passed + 1) * interval <= now:  # a slot at ``now``, lost to rounding
        passed += 1
    entry.due += passed * interval
    return passed


def _following(offset: float, interval: float, due: float, now: float) -> float:
    """The slot after one taken at ``now`` that was due at ``due``: at least half an
    interval after ``due``, so a catch-up (due off its slots) is not followed by a slot
    moments later; for a slot taken on time, the next slot."""
    half_on = due + interval / 2
    if half_on > now:
        return next_slot(offset, interval, half_on, inclusive=True)
    return next_slot(offset, interval, now)


class Schedule(Generic[K]):
    """The bookkeeping, without I/O or a clock of its own: every call is given ``now``.
    ``workers`` and ``per_namespace`` bound the jobs running (``Pool``; None: no bound)."""

    def __init__(self, workers: int | None = None, per_namespace: int | None = None) -> None:
        self._entries: dict[K, _Entry] = {}
        self._busy: dict[Hashable, frozenset[str]] = {}
        """Per group with a job running: the namespaces it is charged to."""
        self._pool = Pool(workers, per_namespace)
        self._queued: dict[Hashable, float] = {}
        """Per due group held back: since when it waits (its earliest due time then)."""
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
        namespace: str | None = None,
    ) -> None:
        """Schedule ``key`` from its group's next slot, or, ``catching_up``, from
        ``catch_up`` of its latest slot; then on its slots (``interval`` and ``group`` are
        asked again each time they matter: spec edits take effect). Its group's jobs are
        charged to ``namespace``."""
        every = interval()
        due = next_slot(phase_of(group()), every, now, inclusive=True)
        if catching_up:
            due = catch_up(due if due <= now else due - every, due, now)
            self._settling[group()] = now + min(SETTLE_S, every / 30)
        self._entries[key] = _Entry(interval, group, due, catching_up, namespace)

    def remove(self, key: K) -> None:
        """Never submit ``key`` again (a job already submitted is not recalled)."""
        self._entries.pop(key, None)

    def due_at(self, key: K) -> float:
        """When ``key`` is due next."""
        return self._entries[key].due

    def take(self, now: float) -> Round[K]:
        """Every due policy of a group with no job running that may start (``Pool``), one
        job per group, with the group's members still waiting for their start-up
        catch-up; the groups submitted are busy until ``done``. Due policies of a busy
        group, or of one held back by the pool, wait, and each slot that passes meanwhile
        is a missed interval; a settling group waits (module doc)."""
        self._settling = {g: until for g, until in self._settling.items() if until > now}
        found: Round[K] = Round()
        due: dict[Hashable, list[tuple[K, _Entry]]] = {}
        riders: list[tuple[K, _Entry, Hashable]] = []
        for key, entry in self._entries.items():
            if entry.due > now:
                if entry.catching_up:
                    riders.append((key, entry, entry.group()))
                continue
            found.missed += _wait(entry, now)
            group = entry.group()
            if group not in self._busy and group not in self._settling:
                due.setdefault(group, []).append((key, entry))
        for key, entry, group in riders:
            if group in due:
                due[group].append((key, entry))
        self._queued = {
            group: self._queued.get(group, min(entry.due for _, entry in members))
            for group, members in due.items()
        }
        for group in self._admit(due, found):
            for key, entry in due.pop(group):
                self._submit(found, key, entry, group, now)
        return found

    def _admit(
        self, due: dict[Hashable, list[tuple[K, _Entry]]], found: Round[K]
    ) -> list[Hashable]:
        """The due groups that start now, in the pool's order (module doc), each charged
        to its namespaces and busy from now on; ``found.waiting`` counts the others."""
        waiting = {
            group: frozenset(e.namespace for _, e in members if e.namespace is not None)
            for group, members in due.items()
        }
        started: list[Hashable] = []
        while waiting:
            if self._pool.workers is None and self._pool.per_namespace is None:
                chosen = list(waiting)  # no limit: every group at once
            else:
                may = [g for g, spaces in waiting.items() if self._pool.holds_back(spaces) is None]
                if not may:
                    break
                chosen = [min(may, key=lambda g: self._order(waiting[g], self._queued[g]))]
            for group in chosen:
                self._busy[group] = spaces = waiting.pop(group)
                self._pool.start(spaces)
                self._queued.pop(group)
                started.append(group)
        found.waiting.update(
            limit
            for spaces in waiting.values()
            if (limit := self._pool.holds_back(spaces)) is not None
        )
        return started

    @staticmethod
    def _submit(found: Round[K], key: K, entry: _Entry, group: Hashable, now: float) -> None:
        """Put ``key`` in its group's job (a rider is due now) and move it to the slot
        after."""
        interval, at = entry.interval(), min(entry.due, now)
        found.jobs.setdefault(group, []).append(Due(key, at, interval))
        entry.due = _following(phase_of(group), interval, at, now)
        entry.catching_up = False

    def _order(self, spaces: frozenset[str], queued: float) -> tuple[int, int, float]:
        """Which group of those that may start goes first: the lowest (module doc)."""
        return self._pool.rank(spaces), self._pool.turn(spaces), queued

    def done(self, group: Hashable) -> None:
        """The group's job ended: its due policies may be submitted again, and its
        namespaces have one job fewer running."""
        spaces = self._busy.pop(group, None)
        if spaces is not None:
            self._pool.end(spaces)

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
    """Where lateness and missed intervals go (``controller/reconcile/metrics.py``)."""

    def started_late(self, seconds: float) -> None:
        """A policy's evaluation started ``seconds`` after its due time."""

    def missed_intervals(self, count: int) -> None:
        """``count`` more whole intervals passed without a policy's evaluation starting."""

    def jobs_waiting(self, by_limit: Mapping[str, int]) -> None:
        """The groups due now and held back, by limit (``NAMESPACE_LIMIT``,
        ``WORKER_LIMIT``; a limit absent holds back none)."""


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
        interval (module doc)."""
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
