"""When each policy is due: the slots of its gather group, the start-up catch-up, and one
job per group at a time.

:class:`Schedule` is the scheduler's bookkeeping (``scheduler.py`` runs it), without I/O or
a clock of its own: every call is given ``now``.

The due times of a group are the slots ``offset + k × interval`` of the wall clock: the
offset is a stable hash of the group, so groups are spread over the interval, the slots
survive a restart, and policies of one group with intervals of 30 s and 60 s meet every
60 s. A policy registered between two slots waits for the next one; its interval is
re-read each time its next slot is computed. Except in the scheduler's first interval
(a starting operator, as kopf lists the policies): a group's latest slot may have passed
while no process ran, so the policy is caught up after half the age of that slot, or at
its next slot if that comes first (:func:`catch_up`). The slot just missed is caught up at
once and older ones, which the previous process more likely evaluated, later: the
catch-ups are spread over the first third of the interval in the order the slots
passed. Waiting for the next slot instead would cost most policies of a restarted
operator a missed interval, and catching up every group at once would send the whole
first round to Prometheus as one burst (the evidence: ``docs/design/operator-scale.md``).

A starting group's catch-ups go as one job: kopf registers the listed policies one after
another, each with its own ``now``, so their catch-up times differ; submitted as they
came due, they would go out as a trickle of small jobs, each waiting for the one before
(a job is one Prometheus request), and the last ones would miss an interval. So a group
that had a policy join in the start-up within the last ``SETTLE_S`` is not submitted yet,
and once one of its members is due, the job takes every member still waiting for its
first start-up evaluation.

At each wake the due policies are collected per group, and each group that may start
(``fairness.py``) is submitted as one job. A group whose previous job is still running is
not submitted again: its due policies wait for that job to end and start late, and every
whole interval they wait is a missed interval. So a slow Prometheus delays only its own
group, and no policy is ever evaluated twice at once by the scheduler.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cachescale.controller.reconcile.fairness import Pool

K = TypeVar("K", bound=Hashable)

PHASE_RANGE_MS = 1 << 32
"""Group offsets are spread over this many milliseconds (about 50 days): modulo any
interval, the offsets of distinct groups are spread evenly."""

SETTLE_S = 1.0
"""A starting group is held until no policy of it has joined for this long, or a
thirtieth of its interval if that is shorter: kopf's listing registers hundreds of
policies a second, so a pause this long means the list is through."""


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


@dataclass
class Round(Generic[K]):
    """What one wake found: a job per group, the intervals missed since last time, and
    how many due groups wait, by the limit that holds them back
    (``fairness.NAMESPACE_LIMIT``, ``fairness.WORKER_LIMIT``)."""

    jobs: dict[Hashable, list[Due[K]]] = field(default_factory=dict)
    missed: int = 0
    waiting: Counter[str] = field(default_factory=Counter)


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
    ``workers`` and ``per_namespace`` bound the jobs running (``fairness.Pool``; None: no
    bound)."""

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
        """The due groups that start now, in the pool's order (``fairness.py``), each
        charged to its namespaces and busy from now on; ``found.waiting`` counts the
        others."""
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
        """Which group of those that may start goes first: the lowest (``fairness.py``,
        "order")."""
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
