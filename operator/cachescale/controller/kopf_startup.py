"""kopf's start-up with tens of thousands of watched objects: one quadratic wake-up removed.

kopf (1.45) holds every object's first event until all indexes are filled: each object's
worker drops its resource kind's "still listing" toggle from the ``operator_indexed``
toggle set and then waits on that set's condition. ``ToggleSet.drop_toggle`` wakes every
waiter each time, even when the toggle is already gone, so the N-th object wakes the N - 1
workers waiting before it: N²/2 wake-ups, each a predicate check on the event loop. The
operator indexes every target's Deployment, HPA and pods beside the policies, so 10,000
policies are about 40,000 objects and 800 million wake-ups: measured, no handler had run
six minutes after start (py-spy: the loop busy in ``Condition.notify`` and
``_call_soon`` under ``process_resource_event``).

:func:`quiet_redundant_wakeups` makes ``drop_toggle`` wake the waiters only when the set
changed. No waiter's condition can change otherwise (it reads only the set's toggles), so
what kopf does is unchanged; only the wasted wake-ups go. Applied once, before kopf starts
(``controller/serve.py``); ``tests/controller/test_kopf_startup.py`` checks both the
behaviour and the wake-ups.
"""

from __future__ import annotations

from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet


async def _drop_toggle(self: ToggleSet, toggle: Toggle) -> None:
    """``ToggleSet.drop_toggle``, waking the waiters only if ``toggle`` was in the set."""
    async with self._condition:
        if toggle in self._toggles:
            self._toggles.discard(toggle)
            self._condition.notify_all()


def quiet_redundant_wakeups() -> None:
    """Install :func:`_drop_toggle` as kopf's ``ToggleSet.drop_toggle`` (idempotent)."""
    ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
