"""The SLO guard's floors on minReplicas: raised while TTFT breaches, released in steps.

A raised maxReplicas only lets the HPA add replicas; an HPA whose own metric reads under
its target adds none. So, except under ``CapAtBudget``, minReplicas is floored:

- at the pods that serve the arrivals while the breach lasts (``slo_floor``);
- one above the count a scale-down broke the SLO at, for a hold after the last breach that
  doubles each time its release breaks the SLO again (``scale_down_floor``);
- after the breach, coming down in steps (``released_floor``), stopped while TTFT breaches
  again, and no lower than the breach's pods while a collapse alert lasts
  (``collapse_floor``).

``envelope`` picks the highest of them (``docs/decisions.md``, "The SLO guard"); the
words for each are ``MinFloor``'s in ``messages``. The rules read the learned state and
return it updated, never a clock: ``now`` is an argument. The evidence for each floor (and
what was tried instead) is ``docs/design/slo-floors.md``.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec, CollapseAction
from cachescale.decide.demand import demand
from cachescale.decide.hpa_metric import on_running_batch
from cachescale.decide.learned import LearnedFloor, LearnedState, ReplicaCount
from cachescale.decide.thresholds import (
    MIN_RELEASE_STEP,
    SCALE_DOWN_FLOOR_HOLD_SECONDS,
    SCALE_DOWN_FLOOR_MAX_HOLD_SECONDS,
    SLO_BREACH_EVALUATIONS,
    SLO_COMFORTABLE_SHARE,
    SLO_NEEDED_UTILISATION,
)
from cachescale.snapshot import Snapshot


class MinFloor(StrEnum):
    """Why minReplicas is above the user's own (the words of ``messages``)."""

    SLO_NEED = "SLONeed"
    """The pods that serve the arrivals at the current rate per pod (``slo_floor``)."""
    AFTER_SCALE_DOWN = "AfterScaleDown"
    """One above a scale-down that broke the SLO (``scale_down_floor``)."""
    RELEASING = "Releasing"
    """Coming down after the breach, a step per evaluation (``released_floor``)."""
    RELEASING_PER_WINDOW = "ReleasingPerWindow"
    """Coming down after the breach, a step per window: the HPA's metric is not the
    running batch, so it does not catch the fleet on the way down (``released_floor``)."""
    HELD_IN_BREACH = "HeldInBreach"
    """Coming down, and stopped while TTFT breaches again (``released_floor``)."""
    HELD_IN_COLLAPSE = "HeldInCollapse"
    """Coming down, and stopped at the pods that serve the arrivals at the rate per pod
    the breach measured while the PrefixCollapse alert lasts (``collapse_floor``)."""


def slo_floor(
    spec: CacheScalingPolicySpec, learned: LearnedState, slo_needed: int | None
) -> int | None:
    """The least minReplicas may be while TTFT breaches the SLO (not under
    ``CapAtBudget``): the pods that serve what arrives at the rate each serves now,
    ``slo_needed`` without its headroom (which is maxReplicas', for the HPA's own metric).

    A raised maxReplicas only lets the HPA add replicas; an HPA whose own metric is under
    its target (a running-batch metric while requests wait for prefill) adds none, and
    the queue grows. The floor makes the HPA add them now."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None
    if slo_needed is None or learned.streaks.slo_breach < SLO_BREACH_EVALUATIONS:
        return None
    return _without_headroom(slo_needed)


def _without_headroom(slo_needed: int) -> int:
    """The pods that serve the arrivals at the measured rate per pod: the SLO estimate
    without its headroom, ``ceil(slo_needed × SLO_NEEDED_UTILISATION)``."""
    return math.ceil(slo_needed * SLO_NEEDED_UTILISATION - 1e-9)


def collapse_floor(
    spec: CacheScalingPolicySpec, learned: LearnedState, slo_needed: int | None
) -> int | None:
    """The least a floor coming down after the breach may reach while the PrefixCollapse
    alert lasts (not under ``CapAtBudget``): ``slo_floor``'s pods, the remembered
    estimate scaled by the demand since, ``ceil(slo_needed × SLO_NEEDED_UTILISATION)``.

    With the cache collapsed, each request carries several times the prefill its slot in
    the running batch shows: an HPA on that batch reads the fleet as half idle and scales
    down into a queue (one on the queue asks for its minimum while nothing waits). The
    floor keeps the pods the breach measured until the alert clears.

    Only under a collapse alert: over budget without one (a dearer cache at a tight
    budget) lasts for hours, and a floor held for all of it keeps more replicas than a
    latency already within the SLO needs."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET or slo_needed is None:
        return None
    if learned.alert(Diagnosis.PREFIX_COLLAPSE) is None:
        return None
    return _without_headroom(slo_needed)


def scale_down_floor(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, now: datetime
) -> tuple[int | None, LearnedState]:
    """minReplicas one above the count the HPA scaled down to before TTFT breached the SLO
    (not under ``CapAtBudget``).

    An HPA whose metric does not grow with the load it cannot serve (a running batch held
    at the KV pool's limit while requests wait) scales down to a count that saturates;
    the queue takes TTFT over the SLO, the HPA scales back up, and so on. When a breach
    starts within a window of a comfortable evaluation at more replicas, the fewest
    replicas of that window did not hold the SLO: the floor is one above them, or where
    it already was if that is higher (the floor itself breached), and stays until its
    hold (``SCALE_DOWN_FLOOR_HOLD_SECONDS``) after the last breaching evaluation.

    A floor learned again within ``SCALE_DOWN_FLOOR_HOLD_SECONDS`` of its release is held
    twice as long as the last time (``_next_hold``): its release is what broke the SLO,
    so a workload that keeps breaking it at the same count is held for hours, not
    released into a breach every hour."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None, learned
    workload = snapshot.workload
    horizon = spec.metrics.window_seconds + spec.metrics.interval_seconds
    known = demand(snapshot).per_second is not None
    p95 = snapshot.signals.ttft_p95_seconds.value
    recent = [m for m in learned.recent_replicas if (now - m.at).total_seconds() <= horizon]
    comfortable = [
        m for m in learned.comfortable_replicas if (now - m.at).total_seconds() <= horizon
    ]
    if known:
        mark = ReplicaCount(replicas=workload.replicas, at=now)
        recent.append(mark)
        ready = workload.ready_replicas >= workload.replicas > 0
        if ready and p95 is not None and p95 < SLO_COMFORTABLE_SHARE * spec.slo.ttft_p95_seconds:
            comfortable.append(mark)
    floor = learned.scale_down_floor
    held = floor if floor is not None and floor.released_at is None else None
    breach = learned.streaks.slo_breach
    if breach == SLO_BREACH_EVALUATIONS and recent and known:
        fewest = min(m.replicas for m in recent)
        if any(m.replicas > fewest for m in comfortable):
            level = fewest + 1 if held is None else max(fewest + 1, held.replicas)
            floor = LearnedFloor(replicas=level, at=now, hold_seconds=_next_hold(floor))
    elif breach >= SLO_BREACH_EVALUATIONS and held is not None:
        floor = held.model_copy(update={"at": now})
    floor = _released(floor, now)
    update = {"recent_replicas": recent, "comfortable_replicas": comfortable}
    learned = learned.model_copy(update=update | {"scale_down_floor": floor})
    if floor is None or floor.released_at is not None:
        return None, learned
    return floor.replicas, learned


def _next_hold(previous: LearnedFloor | None) -> float:
    """The hold of a floor learned now: the held one's own; twice a released one's (it
    is remembered only within ``SCALE_DOWN_FLOOR_HOLD_SECONDS`` of its release), at most
    ``SCALE_DOWN_FLOOR_MAX_HOLD_SECONDS``; else ``SCALE_DOWN_FLOOR_HOLD_SECONDS``."""
    if previous is None:
        return SCALE_DOWN_FLOOR_HOLD_SECONDS
    if previous.released_at is None:
        return previous.hold_seconds
    return min(2 * previous.hold_seconds, SCALE_DOWN_FLOOR_MAX_HOLD_SECONDS)


def _released(floor: LearnedFloor | None, now: datetime) -> LearnedFloor | None:
    """``floor`` released once its hold is over, and forgotten
    ``SCALE_DOWN_FLOOR_HOLD_SECONDS`` after its release."""
    if floor is None:
        return None
    if floor.released_at is None:
        if (now - floor.at).total_seconds() > floor.hold_seconds:
            return floor.model_copy(update={"released_at": now})
        return floor
    forgotten = (now - floor.released_at).total_seconds() > SCALE_DOWN_FLOOR_HOLD_SECONDS
    return None if forgotten else floor


def released_floor(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, now: datetime
) -> tuple[int, MinFloor] | None:
    """After the breach, a floor found on the HPA comes down by ``MIN_RELEASE_STEP`` per
    evaluation. Dropped at once, it lets the HPA fall to what its metric read on the
    oversized fleet, far below what the fleet serves with; in steps, the HPA's own metric
    catches the fleet on the way down.

    Only a metric that reads the load on the pods (the running batch) catches it. On the
    queue (KEDA's trigger) the HPA asks for its minimum while nothing waits, so the fleet
    is the floor, and the queue shows a count too few only once TTFT has breached there.
    For such an HPA the floor steps once the fleet has run a whole window at it, so the
    windowed TTFT judges each count before the next.

    It stops where it is while TTFT breaches the SLO again: stepping down under a breach
    that no lever sizes (no estimate, no scale-down to learn from) hands the HPA the
    count it is breaching at."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None
    current = snapshot.workload.hpa.min_replicas
    if learned.streaks.slo_breach >= SLO_BREACH_EVALUATIONS:
        return current, MinFloor.HELD_IN_BREACH
    step = current - max(1, math.floor(MIN_RELEASE_STEP * current))
    if on_running_batch(snapshot):
        return step, MinFloor.RELEASING
    paced = step if _ran_a_window_at(current, spec, learned, now) else current
    return paced, MinFloor.RELEASING_PER_WINDOW


def _ran_a_window_at(
    replicas: int, spec: CacheScalingPolicySpec, learned: LearnedState, now: datetime
) -> bool:
    """The fleet ran at ``replicas`` or fewer for the whole last window (so the windowed
    TTFT is that count's)."""
    window = spec.metrics.window_seconds
    ages = [((now - m.at).total_seconds(), m.replicas) for m in learned.recent_replicas]
    covered = any(age >= window for age, _ in ages)
    return covered and all(count <= replicas for age, count in ages if age < window)
