"""The learned state (``decide.learned``) and the human controls that move it: an
acknowledgement releases a hold, a rebaseline accepts the new hit rate, and the state
survives a JSON round trip (what a restart does to it)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cachescale.api.reasons import Diagnosis
from cachescale.decide import LearnedState, decide
from cachescale.snapshot import HumanRequests
from tests.decide.decide_builders import (
    INTERVAL,
    T0,
    collapse_run,
    run,
    signals,
    snapshot,
    spec,
)


def collapsed_memory() -> LearnedState:
    engine = signals(hit=0.04)
    return run(spec(), [snapshot(engine)] * 3)[-1].memory


def test_acknowledging_a_collapse_releases_the_hold_but_keeps_the_alert() -> None:
    memory = collapsed_memory()
    human = HumanRequests(acknowledge_at=T0 + 3 * INTERVAL)
    later = T0 + 4 * INTERVAL
    decision = decide(spec(), snapshot(signals(hit=0.04), human=human), memory, later)
    assert decision.alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert decision.alerts[0].acknowledged
    assert decision.envelope.max_replicas == 12  # the budget's, not the hold's 11
    assert "collapse acknowledged" in decision.notes[0]


def test_rebaseline_accepts_the_new_hit_rate() -> None:
    memory = collapsed_memory()
    human = HumanRequests(rebaseline_at=T0 + 3 * INTERVAL)
    later = T0 + 4 * INTERVAL
    decision = decide(spec(), snapshot(signals(hit=0.04), human=human), memory, later)
    assert not decision.alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert [c.reason for c in decision.cleared] == [Diagnosis.PREFIX_COLLAPSE]  # one Normal Event
    assert decision.memory.baseline.token_hit_rate == pytest.approx(0.04)
    again = decide(
        spec(), snapshot(signals(hit=0.04), human=human), decision.memory, later + INTERVAL
    )
    assert again.memory.baseline.evaluations == 2  # the same request is not handled twice


def test_memory_round_trips_through_json_exactly() -> None:
    memory = collapsed_memory()
    assert LearnedState.model_validate_json(memory.model_dump_json()) == memory
    wire = memory.to_wire()
    assert "streaks" in wire
    assert LearnedState.model_validate(wire) == memory


# --- baseline learning -------------------------------------------------------------------


def test_baseline_is_frozen_while_unhealthy() -> None:
    # 0.5 is under the clearing threshold (0.6375): not learned, even before a collapse.
    decisions = collapse_run([0.5, 0.04, 0.04, 0.04])
    assert {d.memory.baseline.token_hit_rate for d in decisions} == {0.85}


def test_a_slow_decline_is_caught_not_learned() -> None:
    # 0.85 → 0.04 over 40 minutes: the baseline barely moves, the collapse is raised.
    hits = [0.85 - (0.81 * i / 80) for i in range(80)] + [0.04] * 4
    decisions = collapse_run(hits)
    assert decisions[-1].alert_active(Diagnosis.PREFIX_COLLAPSE)
    assert decisions[-1].memory.baseline.token_hit_rate > 0.8


def test_the_first_hour_is_a_plain_mean() -> None:
    memory = LearnedState(data_since=T0 - timedelta(hours=1))
    decisions = run(spec(), [snapshot(signals(hit=h)) for h in (0.8, 0.9)], memory)
    assert decisions[-1].memory.baseline.token_hit_rate == pytest.approx(0.85)
