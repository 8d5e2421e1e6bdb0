"""kopf's ``ToggleSet.drop_toggle`` with the redundant wake-ups removed
(``controller/kopf_startup.py``): the same behaviour, without waking every waiter each
time a toggle that is already gone is dropped again."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits.aiotoggles import ToggleSet

from cachescale.controller.kopf_startup import quiet_redundant_wakeups

WAITERS = 200


async def start_up() -> tuple[int, bool]:
    """kopf's start-up in small: ``WAITERS`` objects' workers each drop their kind's
    listing toggle and wait for the whole set, held by another kind still listing; then
    that kind finishes. How many times the waiters' predicate was checked, and whether
    they were all released."""
    indexed = ToggleSet(all)
    listing = await indexed.make_toggle(False, name="policies listing")
    other = await indexed.make_toggle(False, name="pods listing")
    checks = 0
    original = indexed.is_on

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return original()

    indexed.is_on = counted  # type: ignore[method-assign]

    async def worker() -> None:
        await indexed.drop_toggle(listing)
        await indexed.wait_for(True)

    workers = []
    for _ in range(WAITERS):
        workers.append(asyncio.create_task(worker()))
        await asyncio.sleep(0)  # it drops and starts waiting before the next arrives
    await other.turn_to(True)
    done, _ = await asyncio.wait(workers, timeout=5)
    return checks, len(done) == WAITERS


def test_dropping_a_gone_toggle_again_wakes_nobody() -> None:
    quiet_redundant_wakeups()
    checks, released = asyncio.run(start_up())
    assert released, "a waiter was never released"
    assert checks <= 3 * WAITERS, f"{checks} predicate checks for {WAITERS} waiters"


def test_the_set_still_releases_waiters_and_honours_a_remaining_toggle() -> None:
    quiet_redundant_wakeups()

    async def scenario() -> tuple[bool, bool]:
        indexed = ToggleSet(all)
        first = await indexed.make_toggle(False)
        second = await indexed.make_toggle(False)
        waiter = asyncio.create_task(indexed.wait_for(True))
        await indexed.drop_toggle(first)
        await indexed.drop_toggle(first)
        await asyncio.sleep(0.05)
        held = not waiter.done()
        await second.turn_to(True)
        await asyncio.wait_for(waiter, 5)
        return held, waiter.done()

    held, released = asyncio.run(scenario())
    assert held, "released while a toggle of the set was still off"
    assert released
