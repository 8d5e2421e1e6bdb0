"""The operator's reading of kopf's peering rule (``controller/kube/peering.py``): the same
verdict as kopf's own on the same records, and a follower that turns on time.

The watch itself, and two replicas of which exactly one acts, are proven on the real API
server: e2e/test_operator_peering.py.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any, cast

import kopf
from hypothesis import given, settings
from hypothesis import strategies as st
from kopf._cogs.aiokits.aiotoggles import Toggle
from kopf._core.engines.peering import process_peering_event

from cachescale.controller.kube.peering import PeeringFollower, peering_objects, standing

NOW = datetime.datetime(2026, 12, 2, 2, 0, tzinfo=datetime.UTC)
ME, PRIORITY = "me", 100


def record(priority: int, seconds_ago: float, lifetime: int = 60) -> dict[str, Any]:
    lastseen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": lastseen.isoformat()}


def test_alone_or_with_lower_or_dead_peers_it_acts() -> None:
    assert standing({}, ME, PRIORITY, NOW).active
    assert standing({ME: record(PRIORITY, 0)}, ME, PRIORITY, NOW).active
    assert standing({"low": record(PRIORITY - 1, 0)}, ME, PRIORITY, NOW).active
    assert standing({"dead": record(PRIORITY + 1, 61)}, ME, PRIORITY, NOW).active


def test_a_live_peer_at_or_above_its_priority_pauses_it_until_its_record_expires() -> None:
    for priority in (PRIORITY, PRIORITY + 1):
        paused = standing({"peer": record(priority, 20)}, ME, PRIORITY, NOW)
        assert not paused.active
        assert paused.blockers == ("peer",)
        assert paused.recheck_at == NOW + datetime.timedelta(seconds=40)


def test_unreadable_records_are_not_live_peers() -> None:
    status = {
        "not-a-record": "x",
        "bad-time": {"priority": 900, "lastseen": "yesterday"},
        "bad-lifetime": {"priority": 900, "lifetime": "long", "lastseen": NOW.isoformat()},
    }
    assert standing(status, ME, PRIORITY, NOW).active
    assert not standing(
        {"zulu": {"priority": 900, "lastseen": "2026-12-02T01:59:59Z"}}, ME, PRIORITY, NOW
    ).active


async def kopf_pauses(status: dict[str, Any]) -> bool:
    """kopf's own verdict on a peering object with this status."""
    conflicts = Toggle(False)
    pressure = asyncio.Event()
    pressure.set()  # kopf's wait for the next expiry returns at once
    body = {"metadata": {"name": "peering"}, "status": status}
    operator_settings = kopf.OperatorSettings()
    operator_settings.peering.name = "peering"
    operator_settings.peering.priority = PRIORITY
    await process_peering_event(
        raw_event=cast(kopf.RawEvent, {"type": "MODIFIED", "object": body}),
        namespace=None,
        resource=cast(Any, None),
        identity=cast(Any, ME),
        settings=operator_settings,
        autoclean=False,
        stream_pressure=pressure,
        conflicts_found=conflicts,
    )
    return conflicts.is_on()


PEERS = st.dictionaries(
    st.sampled_from(["a", "b", "c", ME]),
    st.tuples(
        st.integers(PRIORITY - 2, PRIORITY + 2),
        st.integers(-5, 120),  # seconds since last seen (negative: a clock ahead)
        st.sampled_from([30, 60]),
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(PEERS)
def test_the_verdict_is_kopfs_own(peers: dict[str, tuple[int, int, int]]) -> None:
    """kopf reads the records with the wall clock: they are built from it here."""
    now = datetime.datetime.now(datetime.UTC)
    status = {
        peer: {
            "priority": priority,
            "lifetime": lifetime,
            "lastseen": (now - datetime.timedelta(seconds=ago)).isoformat(),
        }
        for peer, (priority, ago, lifetime) in peers.items()
        if abs(lifetime - ago) > 2  # not at the edge of expiry while the two verdicts run
    }
    ours = standing(status, ME, PRIORITY, datetime.datetime.now(datetime.UTC))
    assert (not ours.active) == asyncio.run(kopf_pauses(status)), status


def test_the_follower_waits_for_every_object_then_turns_when_a_blocker_expires() -> None:
    turns: list[bool] = []
    clock = [NOW]
    objects = peering_objects("cachescale", ["a", "b"])
    assert objects == [("a", "cachescale"), ("b", "cachescale")]

    async def scenario() -> None:
        follower = PeeringFollower(list(objects), ME, PRIORITY, turns.append, lambda: clock[0])
        follower.seen(objects[0], {})
        assert turns == [], "one object not seen yet: not active"
        follower.seen(objects[1], {"peer": record(PRIORITY + 1, 59.8)})
        assert turns == []
        clock[0] = NOW + datetime.timedelta(seconds=1)  # the peer's record expired
        await asyncio.sleep(0.5)  # the recheck at its deadline
        assert turns == [True]
        follower.seen(objects[1], {"peer": record(PRIORITY + 1, -1)})  # it came back
        assert turns == [True, False]
        follower.seen(objects[1], None)  # the object was deleted
        assert turns == [True, False]
        follower.stop()

    asyncio.run(scenario())


def test_cluster_wide_there_is_one_peering_object() -> None:
    assert peering_objects("cachescale", []) == [(None, "cachescale")]
