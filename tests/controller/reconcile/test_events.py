"""Events without flooding (``controller/reconcile/events.py``): an identical event is not repeated
within the repeat window, and the memory of recent events is pruned, but not on every
event (that cost time in the number remembered: quadratic over a first round of 10,000
policies)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from cachescale.controller.kube.client import KubeApi
from cachescale.controller.reconcile.events import (
    PRUNE_EVERY_S,
    REPEAT_AFTER_S,
    EventRecorder,
    PolicyRef,
)

NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


class Posts:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return body


def recorder() -> tuple[EventRecorder, Posts]:
    posts = Posts()
    return EventRecorder(cast(KubeApi, posts)), posts


def ref(number: int) -> PolicyRef:
    return PolicyRef("llm", f"p{number}", f"uid-{number}")


def test_an_identical_event_is_not_repeated_within_the_window() -> None:
    events, posts = recorder()
    assert events.record(ref(1), "Normal", "EnvelopeUpdated", "1..2", NOW)
    assert not events.record(
        ref(1), "Normal", "EnvelopeUpdated", "1..2", NOW + timedelta(minutes=59)
    )
    assert events.record(ref(1), "Normal", "EnvelopeUpdated", "1..3", NOW), "new numbers"
    assert events.record(ref(2), "Normal", "EnvelopeUpdated", "1..2", NOW), "another policy"
    later = NOW + timedelta(seconds=REPEAT_AFTER_S)
    assert events.record(ref(1), "Normal", "EnvelopeUpdated", "1..2", later)
    assert len(posts.bodies) == 4


def test_old_events_are_forgotten_at_most_every_prune_interval() -> None:
    events, _ = recorder()
    for number in range(5_000):
        events.record(ref(number), "Normal", "EnvelopeUpdated", "1..2", NOW)
    remembered = events.sent
    events.record(ref(0), "Warning", "OverBudget", "x", NOW + timedelta(seconds=PRUNE_EVERY_S / 2))
    assert events.sent is remembered, "pruned again within the prune interval"
    expired = NOW + timedelta(seconds=REPEAT_AFTER_S + PRUNE_EVERY_S)
    events.record(ref(0), "Warning", "OverBudget", "y", expired)
    assert list(events.sent) == [("uid-0", "Warning", "OverBudget", "y")]
