"""kopf's ``ToggleSet.make_toggle`` and ``drop_toggle`` with the redundant wake-ups
removed (``controller/kopf_startup.py``): the same behaviour, without waking every waiter
each time an object's toggle is added or dropped while the set's state stays the same."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet

from cachescale.controller.kopf_startup import quiet_redundant_wakeups

WAITERS = 200


async def start_up() -> tuple[int, bool]:
    """kopf's start-up in small: for each of ``WAITERS`` objects a toggle is added (its
    watcher), then its worker drops it and the kind's listing toggle and waits for the
    whole set, held by another kind still listing; then that kind finishes. How many times
    the waiters were all woken, and whether they were all released."""
    indexed = ToggleSet(all)
    listing = await indexed.make_toggle(False, name="policies listing")
    other = await indexed.make_toggle(False, name="pods listing")
    wakeups = 0
    notify_all = indexed._condition.notify_all

    def counted() -> None:
        nonlocal wakeups
        wakeups += 1
        notify_all()

    indexed._condition.notify_all = counted  # type: ignore[method-assign]

    async def worker(own: Toggle) -> None:
        await indexed.drop_toggle(own)
        await indexed.drop_toggle(listing)
        await indexed.wait_for(True)

    workers = []
    for number in range(WAITERS):
        own = await indexed.make_toggle(name=f"object {number}")
        workers.append(asyncio.create_task(worker(own)))
        await asyncio.sleep(0)  # it drops and starts waiting before the next arrives
    await other.turn_to(True)
    done, _ = await asyncio.wait(workers, timeout=5)
    return wakeups, len(done) == WAITERS


def test_adding_and_dropping_toggles_that_change_nothing_wakes_nobody() -> None:
    quiet_redundant_wakeups()
    wakeups, released = asyncio.run(start_up())
    assert released, "a waiter was never released"
    assert wakeups <= 2, f"every waiter woken {wakeups} times for {WAITERS} objects"


def test_the_set_still_releases_waiters_and_honours_a_remaining_toggle() -> None:
    quiet_redundant_wakeups()

    async def scenario() -> tuple[bool, bool]:
        indexed = ToggleSet(all)
        first = await indexed.make_toggle(False)
        second = await indexed.make_toggle(False)
        waiter = asyncio.create_task(indexed.wait_for(True))
        await indexed.drop_toggle(first)
        await indexed.drop_toggle(first)
        await indexed.make_toggle(True)
        await asyncio.sleep(0.05)
        held = not waiter.done()
        await second.turn_to(True)
        await asyncio.wait_for(waiter, 5)
        return held, waiter.done()

    held, released = asyncio.run(scenario())
    assert held, "released while a toggle of the set was still off"
    assert released
