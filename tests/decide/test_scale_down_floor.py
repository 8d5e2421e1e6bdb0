"""The floor learned from a scale-down that broke the SLO (``slo_floors.scale_down_floor``):
an HPA that scales down into saturation, breaches, and scales back up is held one above
the count it breached at, for an hour after the last breach, and twice as long as the
last time when it is learned again within an hour of its release."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from cachescale.decide import Decision
from cachescale.decide.learned import LearnedState
from cachescale.decide.thresholds import SCALE_DOWN_FLOOR_HOLD_SECONDS
from tests.decide.decide_builders import INTERVAL, run_applied, signals, snapshot, spec, workload

COMFORTABLE, BREACHING = 0.4, 1.5
"""TTFT p95 against the builders' 1 s SLO: under 70% of it, and over it."""


def loop(
    steps: list[tuple[int, float]],
    on_collapse: str = "Hold",
    hpa_metric: str = "vllm:num_requests_running",
) -> list[Decision]:
    """Healthy signals at ``(replicas, TTFT p95)`` per evaluation, each reading the HPA's
    minReplicas as the evaluation before left it (the user's own is 4)."""
    states = []
    for replicas, p95 in steps:
        fleet = workload(replicas=replicas, hpa=(4, 40, 24.0))
        fleet = replace(fleet, hpa=replace(fleet.hpa, metric_name=hpa_metric))
        states.append(snapshot(signals(ttft_p95_seconds=p95), fleet))
    return run_applied(spec(cache={"onCollapse": on_collapse}), states)


def minima(decisions: list[Decision]) -> list[int]:
    return [d.envelope.min_replicas for d in decisions]


# Ten comfortable evaluations at 6 replicas; the HPA scales down to 4, where the windowed
# TTFT still reads the 6-pod minutes for two evaluations, then breaches.
SCALED_DOWN_INTO_A_BREACH = [(6, COMFORTABLE)] * 10 + [(4, COMFORTABLE)] * 2 + [(4, BREACHING)] * 2


def test_a_breach_after_a_scale_down_holds_min_replicas_one_above_the_count_it_breached_at() -> (
    None
):
    decisions = loop(SCALED_DOWN_INTO_A_BREACH)
    # The first breaching evaluation is not yet a breach (SLO_BREACH_EVALUATIONS = 2).
    assert minima(decisions) == [4] * 13 + [5]
    assert (
        "minReplicas 5, one above the fewest replicas the HPA had scaled down to when TTFT "
        "breached the SLO, held until 60 min after the last breach" in decisions[-1].message
    )


def test_the_floor_is_held_an_hour_after_the_last_breach_then_released_in_steps() -> None:
    hold = int(SCALE_DOWN_FLOOR_HOLD_SECONDS / INTERVAL.total_seconds())
    breach_more = [(5, BREACHING)] * 3  # the breach goes on at the floor: the hold restarts
    calm = [(5, COMFORTABLE)] * (hold + 3)
    decisions = loop(SCALED_DOWN_INTO_A_BREACH + breach_more + calm)
    start = len(SCALED_DOWN_INTO_A_BREACH) + len(breach_more)
    # One breaching evaluation at the floor's own count is not a new scale-down breach.
    assert minima(decisions)[start - 1] == 5
    held = minima(decisions)[start : start + hold]
    assert held == [5] * hold
    # An hour after the last breach, the floor comes down a step per evaluation.
    assert minima(decisions)[start + hold :] == [4, 4, 4]


def test_a_breach_without_a_scale_down_learns_no_floor() -> None:
    # Demand outgrowing 6 replicas: the slo estimate's business, not this floor's.
    decisions = loop([(6, COMFORTABLE)] * 10 + [(6, BREACHING)] * 3)
    assert minima(decisions) == [4] * 13


def test_a_breach_at_the_floor_after_a_scale_down_raises_it_one() -> None:
    # Held at 5; the HPA went up to 7 for more than a window (comfortable) and back down
    # to the floor, and breached again: 5 did not hold the SLO either.
    calm_at_7 = [(7, COMFORTABLE)] * 12
    back_to_5 = [(5, COMFORTABLE), (5, BREACHING), (5, BREACHING)]
    decisions = loop(SCALED_DOWN_INTO_A_BREACH + calm_at_7 + back_to_5)
    assert minima(decisions)[-1] == 6


def test_cap_at_budget_learns_no_scale_down_floor() -> None:
    decisions = loop(SCALED_DOWN_INTO_A_BREACH, on_collapse="CapAtBudget")
    assert minima(decisions) == [4] * 14


def test_a_floor_coming_down_holds_where_it_is_while_ttft_breaches_again() -> None:
    hold = int(SCALE_DOWN_FLOOR_HOLD_SECONDS / INTERVAL.total_seconds())
    # Comfortable at 12, down to 8, breaching there: the floor is 9, held the hour.
    learned_at_9 = [(12, COMFORTABLE)] * 10 + [(8, COMFORTABLE)] * 2 + [(8, BREACHING)] * 2
    # The fleet stays at 9 through the hour and the first two steps down (9 → 8 → 7).
    calm = [(9, COMFORTABLE)] * (hold + 2)
    # Then TTFT breaches at the count the fleet held all along: no scale-down to learn
    # from, and no estimate; the floor stops where the breach is confirmed.
    breaching = [(9, BREACHING)] * 4
    decisions = loop(learned_at_9 + calm + breaching)
    start = len(learned_at_9) + len(calm)
    assert minima(decisions)[start - 2 : start] == [8, 7]
    # The first breaching evaluation is not yet a breach; from the second, no step down.
    assert minima(decisions)[start:] == [6, 6, 6, 6]
    assert "minReplicas 6, held while TTFT breaches the SLO" in decisions[-1].message


def test_on_a_queue_trigger_the_floor_comes_down_a_step_per_window() -> None:
    hold = int(SCALE_DOWN_FLOOR_HOLD_SECONDS / INTERVAL.total_seconds())
    window = int(spec().metrics.window_seconds / INTERVAL.total_seconds())
    learned_at_9 = [(12, COMFORTABLE)] * 10 + [(8, COMFORTABLE)] * 2 + [(8, BREACHING)] * 2
    # With nothing waiting the HPA asks for its minimum: the fleet is the floor, 9 and
    # then, from the evaluation after the first step, 8.
    calm = [(9, COMFORTABLE)] * (hold + 1) + [(8, COMFORTABLE)] * (window + 1)
    queue = loop(learned_at_9 + calm, hpa_metric="vllm:num_requests_waiting")
    start = len(learned_at_9) + hold
    # The first step is due (the fleet ran the window at 9); the next once it has run a
    # whole window at 8, not at the next evaluation.
    assert minima(queue)[start : start + window + 2] == [8] * window + [7, 7]
    assert (
        "minReplicas 8, coming down 10% per metrics window after the SLO breach"
        in queue[start].message
    )
    # On the running batch the HPA's metric catches the fleet: a step per evaluation.
    batch = loop(learned_at_9 + calm)
    assert minima(batch)[start : start + 3] == [8, 7, 6]


HOLD = int(SCALE_DOWN_FLOOR_HOLD_SECONDS / INTERVAL.total_seconds())
"""The evaluations of a first hold (an hour)."""
SCALED_DOWN_AGAIN = [(4, COMFORTABLE)] * 2 + [(4, BREACHING)] * 2
"""From 5 comfortable pods, the HPA scales down to 4 and breaches again."""


def held_for(decisions: list[Decision], learned_at: int) -> int:
    """How many evaluations after ``learned_at`` minReplicas stayed at its floor there."""
    floor = decisions[learned_at].envelope.min_replicas
    after = minima(decisions)[learned_at + 1 :]
    return next((n for n, level in enumerate(after) if level < floor), len(after))


def test_a_floor_learned_again_soon_after_its_release_is_held_twice_as_long() -> None:
    # Learned at 5, held the hour, released; within the hour after, the HPA scales down
    # to 4 and breaches again: learned at 5 again, held two hours.
    first = SCALED_DOWN_INTO_A_BREACH + [(5, COMFORTABLE)] * (HOLD + 1) + SCALED_DOWN_AGAIN
    decisions = loop(first + [(5, COMFORTABLE)] * (2 * HOLD + 2))
    assert held_for(decisions, len(SCALED_DOWN_INTO_A_BREACH) - 1) == HOLD
    again = len(first) - 1
    assert minima(decisions)[again] == 5
    assert held_for(decisions, again) == 2 * HOLD
    assert (
        "held until 120 min after the last breach (its last release broke the SLO again)"
        in decisions[again].message
    )


def test_the_hold_doubles_up_to_four_hours_and_is_forgotten_an_hour_after_a_release() -> None:
    steps = list(SCALED_DOWN_INTO_A_BREACH)
    learned = [len(steps) - 1]
    for hold in (HOLD, 2 * HOLD, 4 * HOLD):
        steps += [(5, COMFORTABLE)] * (hold + 1) + SCALED_DOWN_AGAIN
        learned.append(len(steps) - 1)
    # After the fourth release, more than an hour passes before the next breach.
    steps += [(5, COMFORTABLE)] * (4 * HOLD + 1) + [(5, COMFORTABLE)] * (HOLD + 1)
    steps += SCALED_DOWN_AGAIN
    learned.append(len(steps) - 1)
    decisions = loop(steps + [(5, COMFORTABLE)] * (HOLD + 2))
    holds = [held_for(decisions, at) for at in learned]
    assert holds == [HOLD, 2 * HOLD, 4 * HOLD, 4 * HOLD, HOLD]
    assert "held until 60 min after the last breach;" in decisions[learned[-1]].message + ";"


def test_a_floor_remembered_by_an_earlier_operator_is_held_the_hour() -> None:
    # LearnedState written before floors had a hold and a release: read after an upgrade, the
    # floor is held, for the hour it was learned with.
    learned_at = datetime(2026, 12, 1, tzinfo=UTC)
    memory = LearnedState.model_validate(
        {"scaleDownFloor": {"replicas": 5, "at": learned_at.isoformat()}}
    )
    floor = memory.scale_down_floor
    assert floor is not None
    assert (floor.replicas, floor.hold_seconds, floor.released_at) == (
        5,
        SCALE_DOWN_FLOOR_HOLD_SECONDS,
        None,
    )
