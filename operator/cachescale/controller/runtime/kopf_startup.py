"""kopf's start-up with many watched objects: its quadratic wake-ups removed, and its
connections to the API server bounded.

This is the one module that uses kopf's private API (``kopf._cogs``): the kopf fence keeps
it so. pyproject.toml bounds kopf's version and its import-linter contract lets no other
module import ``kopf._*``; ``tests/controller/runtime/test_kopf_fence.py`` fails when a
kopf internal patched or copied here changes, so this module is re-checked before the
bound is raised.

kopf holds every object's first event until all indexes are filled. For each new object
its watcher adds a "not indexed yet" toggle to the ``operator_indexed`` toggle set
(``ToggleSet.make_toggle``); the object's worker indexes it, drops that toggle
(``drop_toggle``) and waits on the set's condition until every toggle is gone. Both calls
wake every waiter, whether or not the set's state changed, so the N-th object wakes the
N - 1 workers waiting before it twice: about N² wake-ups, each a predicate check on the
event loop. kopf indexes the policies (the claims index, ``controller/runtime/handlers.py``),
so at thousands of policies the event loop would do little else for minutes after start
(the evidence: ``docs/design/operator-scale.md``).

:func:`quiet_redundant_wakeups` makes both wake the waiters only when the set's state
(``is_on``) changed. A waiter of the set waits for that state, and a toggle's own waiters
for the toggle's own state, which adding or dropping it does not change; so no waiter
could tell the difference, and only the wasted wake-ups go. Applied once, before kopf
starts (``controller/runtime/serve.py``); ``tests/controller/runtime/test_kopf_startup.py``
checks both the behaviour and the number of wake-ups.

kopf's own HTTP session has no limit on connections (``aiohttp.TCPConnector(limit=0)``),
so its first pass over a fleet (a finalizer and an annotation PATCH per policy, each from
the policy's own worker) would open one TLS connection per policy at once, each with its
own TLS read buffer, and the process would keep that memory. :func:`bounded_session` is
the session kopf would build from the same credentials, with at most ``KOPF_REQUESTS``
connections beside its watch streams (each holds one for its whole life); kopf's requests
beyond that wait for a free one. It is given to kopf by the operator's login handler
(``controller/runtime/serve.py``), traced: what the API server answers on it is what
``/readyz`` reads (``controller/runtime/health.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import aiohttp
import kopf
from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet

KOPF_REQUESTS = 16
"""kopf's own short requests (finalizers, its annotations, Events) in flight at once."""


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


def bounded_session(
    info: kopf.ConnectionInfo, watches: int, traces: Sequence[aiohttp.TraceConfig] = ()
) -> kopf.AiohttpSession:
    """kopf's session for ``info`` (its TLS checks, headers and credentials, as kopf builds
    them), with at most ``watches + KOPF_REQUESTS`` connections; ``traces`` hear every
    request's end (``controller/runtime/health.py``)."""
    with warnings.catch_warnings():  # as kopf: aiohttp warns of a BasicAuth it may pass
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="kopf")
        auth = info.as_aiohttp_basic_auth()
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=watches + KOPF_REQUESTS, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        auth=auth,
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        trace_configs=list(traces),
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )
