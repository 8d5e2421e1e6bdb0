"""Whether this replica may act: kopf's peering rule, followed for the scheduler.

Several replicas of the operator share a kopf peering object (``--peering``); kopf pauses
every replica but the one with the highest priority among the live peers (and all of
them when two live peers share a priority). kopf stops its own daemons on a pause and
relists on resume, but it tells nothing to handlers, and the scheduler keeps no daemon
per policy (``controller/reconcile/scheduler.py``). So the operator reads the same peering
object itself, with a watch (no polling reads), and applies kopf's rule to its status with
the identity and priority it gave kopf: both replicas of a pair read the same records, so
exactly one acts.

:func:`standing` is the rule, pure; :class:`PeeringFollower` holds the last status of
each peering object (one per served namespace, or the cluster-wide one), settles the
standing on every change and when a blocking peer's record expires, and says when it
turns. The watches run in threads (``watch_peering``) and hand each status to the event
loop. Until the peering object has been seen the replica is not active, as kopf starts
paused under mandatory peering.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch

PEERING_GROUP = "kopf.dev"
PEERING_VERSION = "v1"
DEFAULT_LIFETIME_S = 60
"""A peer record's lifetime when it states none (kopf's default)."""
WATCH_TIMEOUT_S = 300
RETRY_S = 5.0
"""The pause before a failed peering watch is opened again."""

log = logging.getLogger("cachescale.operator")


@dataclass(frozen=True)
class Standing:
    """Whether this replica may act, by one peering object's records."""

    active: bool
    blockers: tuple[str, ...] = ()
    """The live peers that pause it (a higher or the same priority)."""
    recheck_at: datetime.datetime | None = None
    """When the first blocker's record expires, unless it is renewed before."""


def standing(
    status: Mapping[str, Any], identity: str, priority: int, now: datetime.datetime
) -> Standing:
    """kopf's rule on a peering object's status (``{identity: {priority, lifetime,
    lastseen}}``): paused while another live peer has a priority at or above ours; a
    record is dead once ``lastseen + lifetime`` has passed. Unreadable records are
    skipped, as they cannot be a live peer."""
    blockers: dict[str, datetime.datetime] = {}
    for peer, record in status.items():
        if peer == identity or not isinstance(record, Mapping):
            continue
        deadline = _deadline(record, now)
        if deadline is None or deadline <= now:
            continue
        if _priority(record) >= priority:
            blockers[peer] = deadline
    return Standing(
        active=not blockers,
        blockers=tuple(sorted(blockers)),
        recheck_at=min(blockers.values(), default=None),
    )


def _priority(record: Mapping[str, Any]) -> int:
    try:
        return int(record.get("priority", 0))
    except (TypeError, ValueError):
        return 0


def _deadline(record: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime | None:
    """When the record expires, or None when it cannot be read."""
    try:
        lifetime = int(record.get("lifetime", DEFAULT_LIFETIME_S))
        lastseen = record.get("lastseen")
        seen = now if lastseen is None else datetime.datetime.fromisoformat(str(lastseen))
    except (TypeError, ValueError):
        return None
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.UTC)
    return seen + datetime.timedelta(seconds=lifetime)


class PeeringFollower:
    """The standing of this replica over its peering objects, kept on the event loop:
    active only when every object has been seen and none has a blocker. ``on_turn`` is
    called with the new value each time it changes."""

    def __init__(
        self,
        objects: list[Hashable],
        identity: str,
        priority: int,
        on_turn: Callable[[bool], None],
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.identity = identity
        self.priority = priority
        self.active = False
        self._statuses: dict[Hashable, Mapping[str, Any] | None] = dict.fromkeys(objects)
        self._on_turn = on_turn
        self._now = now
        self._recheck: asyncio.TimerHandle | None = None

    def seen(self, key: Hashable, status: Mapping[str, Any] | None) -> None:
        """A peering object's status as the watch delivered it (None: it was deleted,
        which pauses, as kopf cannot keep its own record there either)."""
        self._statuses[key] = status
        self.settle()

    def settle(self) -> None:
        """Apply the rule to every object now; wake again when a blocker expires."""
        now = self._now()
        standings = [
            standing(status, self.identity, self.priority, now)
            for status in self._statuses.values()
            if status is not None
        ]
        seen_all = len(standings) == len(self._statuses)
        active = seen_all and all(s.active for s in standings)
        rechecks = [s.recheck_at for s in standings if s.recheck_at is not None]
        self._schedule_recheck(min(rechecks, default=None), now)
        if active != self.active:
            self.active = active
            blockers = sorted({peer for s in standings for peer in s.blockers})
            log.info(
                "peering: %s",
                "active" if active else f"paused in favour of {blockers or 'an unseen peer'}",
            )
            self._on_turn(active)

    def _schedule_recheck(self, at: datetime.datetime | None, now: datetime.datetime) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if at is not None:
            delay = (at - now).total_seconds() + 0.1  # strictly after the deadline
            self._recheck = asyncio.get_running_loop().call_later(delay, self.settle)

    def stop(self) -> None:
        """No more rechecks (the operator is stopping)."""
        if self._recheck is not None:
            self._recheck.cancel()


def peering_objects(name: str, namespaces: list[str]) -> list[tuple[str | None, str]]:
    """The peering objects kopf uses: the ClusterKopfPeering ``name`` when cluster-wide,
    else the KopfPeering ``name`` in each served namespace (``(namespace, name)``)."""
    if not namespaces:
        return [(None, name)]
    return [(namespace, name) for namespace in namespaces]


def watch_peering(
    api_client: client.ApiClient,
    key: tuple[str | None, str],
    deliver: Callable[[tuple[str | None, str], Mapping[str, Any] | None], None],
    stopping: threading.Event,
    on_request: Callable[[str], None] = lambda verb: None,
) -> None:
    """In a thread until ``stopping``: watch one peering object and ``deliver`` its status
    on every event. A watch opened without a resource version starts with the object as
    it is, so a reconnect needs no read; a failed watch is logged and opened again."""
    namespace, name = key
    custom = client.CustomObjectsApi(api_client)
    if namespace is None:
        lister: Callable[..., Any] = custom.list_cluster_custom_object
        where: tuple[str, ...] = (PEERING_GROUP, PEERING_VERSION, "clusterkopfpeerings")
    else:
        lister = custom.list_namespaced_custom_object
        where = (PEERING_GROUP, PEERING_VERSION, namespace, "kopfpeerings")
    while not stopping.is_set():
        try:
            on_request("watch")
            stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                lister,
                *where,
                field_selector=f"metadata.name={name}",
                timeout_seconds=WATCH_TIMEOUT_S,
                _request_timeout=WATCH_TIMEOUT_S + 30,  # a silent connection is not kept
            )
            for event in stream:
                if stopping.is_set():
                    return
                body = event.get("object")
                if event.get("type") == "DELETED":
                    deliver(key, None)
                elif isinstance(body, Mapping):
                    deliver(key, body.get("status") or {})
        except Exception as error:  # any failure: say it, wait, watch again
            log.warning("peering object %s: watch failed (%s); retrying", name, error)
            stopping.wait(RETRY_S)
