"""kopf's ``ToggleSet.make_toggle`` and ``drop_toggle`` with the redundant wake-ups
removed (``controller/runtime/kopf_startup.py``): the same behaviour, without waking every waiter
each time an object's toggle is added or dropped while the set's state stays the same.
And kopf's session with bounded connections: a burst of requests shares them, with the
credentials kopf would send."""

from __future__ import annotations

import asyncio

import kopf
from aiohttp import web
from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet

from cachescale.controller.runtime.kopf_startup import (
    KOPF_REQUESTS,
    bounded_session,
    quiet_redundant_wakeups,
)

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


async def burst_through_bounded_session(requests: int, watches: int) -> tuple[int, int, set[str]]:
    """``requests`` PATCHes at once through ``bounded_session`` to a server that holds each
    for 50 ms: the connections opened, the most requests in flight at once, and the
    Authorization headers the server saw."""
    peers: set[object] = set()
    in_flight = most_in_flight = 0
    authorizations: set[str] = set()

    async def held(request: web.Request) -> web.Response:
        nonlocal in_flight, most_in_flight
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        authorizations.add(request.headers.get("Authorization", ""))
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_patch("/policy/{n}", held)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server = "http://{}:{}".format(*runner.addresses[0])
    info = kopf.ConnectionInfo(server=server, scheme="Bearer", token="t0k")
    session = bounded_session(info, watches).aiohttp_session

    async def patch(n: int) -> None:
        async with session.patch(f"{server}/policy/{n}") as response:
            response.raise_for_status()

    try:
        await asyncio.gather(*(patch(n) for n in range(requests)))
    finally:
        await session.close()
        await runner.cleanup()
    return len(peers), most_in_flight, authorizations


def test_kopfs_first_pass_shares_a_bounded_set_of_connections() -> None:
    """kopf's own session would open one connection per policy in its first pass; this
    one at most the watches and ``KOPF_REQUESTS``, all of them used, and every request
    carries kopf's credentials."""
    opened, most_in_flight, authorizations = asyncio.run(
        burst_through_bounded_session(300, watches=2)
    )
    assert opened <= 2 + KOPF_REQUESTS
    assert most_in_flight == 2 + KOPF_REQUESTS
    assert authorizations == {"Bearer t0k"}
