"""The scheduler task (``controller/reconcile/scheduler.py``): on the real clock with
short intervals and a real thread pool, a slow group delays only itself and never runs
twice at once; with an injected clock, only its first interval catches up.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from cachescale.controller.reconcile.schedule import Due, catch_up, next_slot, phase_of
from cachescale.controller.reconcile.scheduler import Job, Scheduler
from tests.controller.reconcile.test_schedule import INTERVAL, constant


@dataclass
class Punctual:
    late: list[float] = field(default_factory=list)
    missed: int = 0
    waiting: list[dict[str, int]] = field(default_factory=list)

    def started_late(self, seconds: float) -> None:
        self.late.append(seconds)

    def missed_intervals(self, count: int) -> None:
        self.missed += count

    def jobs_waiting(self, by_limit: Mapping[str, int]) -> None:
        self.waiting.append(dict(by_limit))


def test_a_slow_group_delays_only_itself_and_never_runs_twice_at_once() -> None:
    """Group "slow" hangs in its first job; group "fast" keeps its slots meanwhile."""
    interval = 0.25
    release = threading.Event()
    running: dict[str, int] = {"slow": 0, "fast": 0}
    starts: dict[str, list[float]] = {"slow": [], "fast": []}
    overlap: list[str] = []
    lock = threading.Lock()
    punctual = Punctual()

    def make_job(due: list[Due[str]]) -> Job:
        group = due[0].key.split("-")[0]

        def job() -> None:
            with lock:
                running[group] += 1
                if running[group] > 1:
                    overlap.append(group)
                starts[group].append(time.time())
            if group == "slow":
                release.wait(10)
            with lock:
                running[group] -= 1

        return job

    async def scenario() -> None:
        with ThreadPoolExecutor(4) as pool:
            scheduler: Scheduler[str] = Scheduler(make_job, pool, punctual)
            scheduler.start()
            for key in ("slow-1", "slow-2", "fast-1", "fast-2"):
                group = key.split("-")[0]
                scheduler.register(key, lambda: interval, constant(group))
            await asyncio.sleep(8 * interval)
            scheduler.unregister("fast-1")
            scheduler.unregister("fast-2")
            ended = len(starts["fast"])
            await asyncio.sleep(2 * interval)
            assert len(starts["fast"]) == ended  # unregistered: no more jobs
            release.set()
            scheduler.stop()

    asyncio.run(scenario())
    assert overlap == []
    assert len(starts["slow"]) == 1, "the slow group was submitted again while it ran"
    assert len(starts["fast"]) >= 6, starts["fast"]  # about 8 slots in 8 intervals
    gaps = [b - a for a, b in itertools.pairwise(starts["fast"])]
    assert all(0.5 * interval < gap < 1.5 * interval for gap in gaps), gaps
    assert punctual.missed >= 4  # the slow group's members, every slot they waited
    assert sorted(punctual.late)[len(punctual.late) // 2] < 0.1


def test_only_the_first_interval_of_a_scheduler_catches_up() -> None:
    clock = [5000.0]
    scheduler: Scheduler[str] = Scheduler(
        lambda _: lambda: None, ThreadPoolExecutor(1), Punctual(), clock=lambda: clock[0]
    )
    clock[0] += INTERVAL - 0.001
    scheduler.register("at start", lambda: INTERVAL, constant("g"))
    latest = next_slot(phase_of("g"), INTERVAL, clock[0], inclusive=True) - INTERVAL
    expected = catch_up(latest, latest + INTERVAL, clock[0])
    clock[0] += 0.002  # past the first interval: a new policy waits for its slot
    scheduler.register("later", lambda: INTERVAL, constant("g"))
    assert scheduler.schedule.due_at("at start") == pytest.approx(expected)
    assert scheduler.schedule.due_at("later") == pytest.approx(latest + INTERVAL)
