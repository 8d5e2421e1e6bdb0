"""The schedule (``controller/reconcile/schedule.py``), driven with explicit times:
aligned due times per group on stable slots, one job per group with every due member, a
busy group's members waiting and missing intervals, unregistering, interval edits, and the
start-up catch-up (after half the latest slot's age; a starting group in one job).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Hashable

import pytest

from cachescale.controller.reconcile.schedule import (
    SETTLE_S,
    Due,
    Schedule,
    next_slot,
    phase_of,
)

INTERVAL = 30.0


def constant(value: float | Hashable) -> Callable[[], object]:
    return lambda: value


def schedule_of(**groups: str) -> Schedule[str]:
    """Policies by key → group, every 30 s, registered at t=1000."""
    schedule: Schedule[str] = Schedule()
    for key, group in groups.items():
        schedule.add(key, lambda: INTERVAL, constant(group), 1000.0)
    return schedule


def on_slots(t: float, group: str, interval: float) -> bool:
    """Whether ``t`` is one of ``group``'s slots for ``interval``."""
    steps = (t - phase_of(group)) / interval
    return abs(steps - round(steps)) < 1e-6


def test_a_groups_policies_come_due_together_on_its_own_stable_slots() -> None:
    schedule: Schedule[str] = Schedule()
    schedule.add("a", lambda: INTERVAL, constant("g"), 1000.0)
    due = schedule.due_at("a")
    assert 1000.0 <= due < 1000.0 + INTERVAL
    assert on_slots(due, "g", INTERVAL)
    schedule.add("b", lambda: INTERVAL, constant("g"), due - 0.5 * INTERVAL)  # later: same slot
    schedule.add("c", lambda: 2 * INTERVAL, constant("g"), due - 0.5 * INTERVAL)
    schedule.add("d", lambda: INTERVAL, constant("h"), 1000.0)
    assert schedule.due_at("b") == due
    assert schedule.due_at("c") in (due, due + INTERVAL)  # every other slot of g
    assert on_slots(schedule.due_at("d"), "h", INTERVAL)
    assert schedule.due_at("d") != due  # another group: another phase
    assert next_slot(5.0, 30.0, 35.0) == 65.0
    assert next_slot(5.0, 30.0, 35.0, inclusive=True) == 35.0


PHASE_IN_A_PROCESS = (
    "import sys; from cachescale.controller.reconcile.schedule import phase_of; "
    "print(repr(phase_of((sys.argv[1], 300.0))))"
)


@pytest.mark.parametrize("hash_seed", ["1", "2"])
def test_a_groups_phase_is_the_same_in_every_process(hash_seed: str) -> None:
    """The offset is a digest of the group, not Python's per-process string hash: another
    process, with another ``PYTHONHASHSEED``, puts the group on the same slots."""
    group = ("http://prometheus.monitoring:9090", 300.0)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    ran = subprocess.run(
        [sys.executable, "-c", PHASE_IN_A_PROCESS, group[0]],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert float(ran.stdout) == phase_of(group)


def test_one_job_per_group_with_every_due_member() -> None:
    schedule = schedule_of(a="g", b="g", c="g", d="h")
    late = max(schedule.due_at(k) for k in "abcd")
    found = schedule.take(late)
    assert {group: [d.key for d in dues] for group, dues in found.jobs.items()} == {
        "g": ["a", "b", "c"],
        "h": ["d"],
    }
    assert found.missed == 0
    assert all(isinstance(d, Due) and d.interval == INTERVAL for d in found.jobs["g"])
    assert schedule.take(late).jobs == {}  # nothing due twice


def test_a_busy_group_is_not_submitted_again_and_its_members_miss_intervals() -> None:
    schedule = schedule_of(a="g", b="h")
    first = schedule.due_at("a")
    assert list(schedule.take(first).jobs) == ["g"]
    # g's job is still running at a's next slot and 2.5 intervals later: a waits, and
    # each whole interval that passes is missed; h is submitted on each of its slots.
    found = schedule.take(first + INTERVAL)
    assert list(found.jobs) == ["h"]  # h's slot came in between
    schedule.done("h")
    h_due = schedule.due_at("b")
    found = schedule.take(first + 3.5 * INTERVAL)
    assert list(found.jobs) == ["h"]
    schedule.done("h")
    # a's slots at +2 and +3 intervals (the one at +1 is pending), and the slots of h that
    # passed with no round taken (h starts on its latest: never late by an interval).
    h_skipped = math.floor((first + 3.5 * INTERVAL - h_due) / INTERVAL)
    assert found.missed == 2 + h_skipped
    assert first + 2.5 * INTERVAL <= found.jobs["h"][0].at <= first + 3.5 * INTERVAL
    wake = schedule.next_wake(first + 3.5 * INTERVAL)
    assert wake is not None
    assert wake <= first + 4 * INTERVAL
    schedule.done("g")  # the job ended: a starts at once, late
    resumed = schedule.take(first + 3.6 * INTERVAL)
    assert [d.key for d in resumed.jobs["g"]] == ["a"]
    assert resumed.jobs["g"][0].at == first + 3 * INTERVAL
    assert schedule.due_at("a") == first + 4 * INTERVAL  # back on its slots


def test_an_unregistered_policy_is_never_submitted_again() -> None:
    schedule = schedule_of(a="g", b="g")
    schedule.remove("a")
    found = schedule.take(schedule.due_at("b"))
    assert [d.key for d in found.jobs["g"]] == ["b"]
    schedule.remove("b")
    assert schedule.next_wake(0.0) is None


def test_the_interval_is_read_again_for_each_next_slot() -> None:
    interval = [INTERVAL]
    schedule: Schedule[str] = Schedule()
    schedule.add("a", lambda: interval[0], constant("g"), 1000.0)
    first = schedule.due_at("a")
    interval[0] = 60.0  # edited after it was scheduled
    [due] = schedule.take(first).jobs["g"]
    assert due.interval == 60.0
    following = schedule.due_at("a")
    assert first < following <= first + 60.0
    assert on_slots(following, "g", 60.0)


@pytest.mark.parametrize(
    ("age", "caught_up_after"),
    [(1.0, 0.5), (4.0, 2.0), (18.0, 9.0), (20.0, 10.0), (25.0, 5.0)],
)
def test_a_starting_scheduler_catches_up_the_latest_slot_after_half_its_age(
    age: float, caught_up_after: float
) -> None:
    """The slot just missed at once; older ones (more likely evaluated by the previous
    process) later, spread over the first third of the interval; one 25 s old at its
    next slot, 5 s on, which comes sooner."""
    latest = next_slot(phase_of("g"), INTERVAL, 1000.0) - INTERVAL  # g's latest before 1000
    now = latest + age
    schedule: Schedule[str] = Schedule()
    schedule.add("p", lambda: INTERVAL, constant("g"), now, catching_up=True)
    assert schedule.due_at("p") == pytest.approx(now + caught_up_after)
    waiting: Schedule[str] = Schedule()
    waiting.add("p", lambda: INTERVAL, constant("g"), now)
    assert waiting.due_at("p") == pytest.approx(latest + INTERVAL)  # not starting: next slot
    taken = now + max(caught_up_after, SETTLE_S)  # the group settles first
    [due] = schedule.take(taken).jobs["g"]
    assert due.at == pytest.approx(now + caught_up_after)
    # Then on its slots, the first at least half an interval on (never twice in a row).
    following = next_slot(phase_of("g"), INTERVAL, now + caught_up_after + 15.0, inclusive=True)
    assert schedule.due_at("p") == pytest.approx(following)


def jobs_of_a_start(slot_passed_s: float) -> list[list[str]]:
    """A starting operator as kopf lists 250 policies of group "g" (one every 10 ms, the
    pace of kopf's listing), whose slot passed ``slot_passed_s`` before the first;
    the loop takes after each registration, and each job runs 2 s (one Prometheus
    request under load). Returns the keys of each job, in order, over one interval."""
    latest = next_slot(phase_of("g"), INTERVAL, 1000.0) - INTERVAL
    start, step = latest + slot_passed_s, 0.01
    schedule: Schedule[str] = Schedule()
    jobs: list[list[str]] = []
    running_until = None
    for tick in range(int(INTERVAL / step)):
        now = start + tick * step
        if tick < 250:
            schedule.add(f"p{tick}", lambda: INTERVAL, constant("g"), now, catching_up=True)
        if running_until is not None and now >= running_until:
            schedule.done("g")
            running_until = None
        found = schedule.take(now)
        if "g" in found.jobs:
            jobs.append([d.key for d in found.jobs["g"]])
            running_until = now + 2.0
    return jobs


@pytest.mark.parametrize("slot_passed_s", [0.5, 1.0, 6.0, 20.0])
def test_a_starting_group_is_caught_up_in_one_job(slot_passed_s: float) -> None:
    """Registered one by one, each policy's catch-up time is its own; the group is held
    while its policies join, and its first job takes all of them, not a trickle of small
    jobs each waiting for the one before."""
    jobs = jobs_of_a_start(slot_passed_s)
    assert sorted(jobs[0]) == sorted(f"p{k}" for k in range(250))
    assert all(len(job) == 250 for job in jobs)  # then on their slots, together


def test_a_slot_that_comes_while_the_group_joins_takes_the_whole_group() -> None:
    """The group's slot falls 1 s into the listing: the members registered before it are
    due at the slot, those after catch it up; all go in one job once the group settled."""
    jobs = jobs_of_a_start(INTERVAL - 1.0)
    assert sorted(jobs[0]) == sorted(f"p{k}" for k in range(250))
