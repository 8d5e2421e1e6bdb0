"""kopf's start-up with tens of thousands of watched objects: its quadratic wake-ups removed.

kopf (1.45) holds every object's first event until all indexes are filled. For each new
object its watcher adds a "not indexed yet" toggle to the ``operator_indexed`` toggle set
(``ToggleSet.make_toggle``); the object's worker indexes it, drops that toggle
(``drop_toggle``) and waits on the set's condition until every toggle is gone. Both calls
wake every waiter, whether or not the set's state changed, so the N-th object wakes the
N - 1 workers waiting before it twice: about N² wake-ups, each a predicate check on the
event loop. When kopf also indexed every target's Deployment, HPA and pods, 10,000
policies were about 40,000 objects and over a billion wake-ups: measured, no handler had
run six minutes after start (py-spy: the event loop busy in ``Condition.notify_all``
under ``make_toggle`` and ``drop_toggle``). The targets are now the operator's own
informers' (``controller/informer.py``), but kopf still indexes the policies (the claims
index, ``controller/handlers.py``): 10,000 policies are still 10⁸ wake-ups without this.

:func:`quiet_redundant_wakeups` makes both wake the waiters only when the set's state
(``is_on``) changed. A waiter of the set waits for that state, and a toggle's own waiters
for the toggle's own state, which adding or dropping it does not change; so no waiter
could tell the difference, and only the wasted wake-ups go. Applied once, before kopf
starts (``controller/serve.py``); ``tests/controller/test_kopf_startup.py`` checks both
the behaviour and the number of wake-ups.
"""

from __future__ import annotations

from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet


async def _make_toggle(self: ToggleSet, __val: bool = False, *, name: str | None = None) -> Toggle:
    """``ToggleSet.make_toggle``, waking the waiters only if the set's state changed."""
    toggle = Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: ToggleSet, toggle: Toggle) -> None:
    """``ToggleSet.drop_toggle``, waking the waiters only if the set's state changed."""
    async with self._condition:
        before = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != before:
            self._condition.notify_all()


def quiet_redundant_wakeups() -> None:
    """Install both as kopf's ``ToggleSet`` methods (idempotent)."""
    ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]
    ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
