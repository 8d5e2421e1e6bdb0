"""The HPA envelope: min/max replicas and the queue target the HPA scales inside.

cachescale does not replace the HPA; it reshapes the box the HPA moves in. The box is
always inside ``budget.minReplicas..maxReplicas`` (the hard cap) and otherwise never above
what the GPU-s/1k budget allows at the demand while requests cost more than they did;
while they cost what they did, maxReplicas keeps room over the current replicas for the
HPA to follow rising demand (``demand_headroom``), since the budget's windowed allowance
trails every rise. On a confirmed prefix collapse with
``Hold`` maxReplicas is pinned at the pre-collapse level (scaled by any demand growth
since), unless TTFT breaches the SLO, in which case the SLO guard lets the HPA use the
budget. Two floors come first (``docs/decisions.md``, "Precedence"): never below what the
demand needs at the baseline cost (every policy), and, except under ``CapAtBudget``, never
below what the SLO needs while an incident lasts (``slo_guard``; the floors it puts on
minReplicas are ``slo_floors``).

Against flapping:

- maxReplicas is lowered only to the highest recommendation of the last
  ``STABILIZATION_SECONDS`` (as the HPA's own scale-down stabilization);
- after a change in one direction, a change in the other waits out the same window;
- a confirmed collapse hold is exempt from both: it has already waited
  ``collapseWindows`` evaluations, and every minute of delay buys replicas it exists to
  prevent; so is releasing a hold (the SLO guard, an acknowledgement, recovery): a hold
  is a deliberate state, and leaving it is not a flap; so is a raise to what the SLO
  needs (its estimate waited for a confirmed breach, ``slo_guard.estimate_confirmed``);
- once the SLO guard has released a hold, the hold returns only after a whole window of
  comfortable latency (not on the first evaluation without a breach), so hold and
  release cannot alternate;
- the target moves in 20% steps, down at most every second breaching evaluation, and
  back up only after each full window of comfortable latency.

On unknown data nothing here lowers anything: an unknown request rate means no budget cap
is derived, and the current maxReplicas is kept; with a required signal missing
maxReplicas opens back to the user's original (``open_envelope``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.reasons import Hold
from cachescale.api.spec import CacheScalingPolicySpec, CollapseAction
from cachescale.decide.demand import demand
from cachescale.decide.headroom import demand_headroom
from cachescale.decide.hpa_metric import on_running_batch
from cachescale.decide.learned import EnvelopeMark, LearnedState, OriginalEnvelope, ReplicaMark
from cachescale.decide.slo_floors import (
    MinFloor,
    collapse_floor,
    released_floor,
    scale_down_floor,
    slo_floor,
)
from cachescale.decide.slo_guard import (
    Drain,
    drain_max_replicas,
    scaled_replicas,
    slo_mark,
    slo_needed_replicas,
    slo_target,
)
from cachescale.decide.thresholds import (
    BATCH_TARGET_SHARE,
    SLO_BREACH_EVALUATIONS,
    STABILIZATION_SECONDS,
)
from cachescale.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the HPA should say: ``spec.minReplicas``, ``spec.maxReplicas`` and the target."""

    min_replicas: int
    max_replicas: int
    target_average_value: float | None


@dataclass(frozen=True, slots=True)
class EnvelopePlan:
    """The envelope decided, why it is held (if it is), and the learned state it leaves."""

    envelope: Envelope
    budget_max: int | None
    """Most replicas the budget allows now (None: request rate unknown or zero)."""
    held_by: Hold | None
    """Why maxReplicas is below what the HPA would otherwise get, if it is."""
    slo_guard: bool
    """True when the SLO guard overrode a collapse hold or lowered the target."""
    learned: LearnedState
    """The learned state with this plan's stabilization marks, SLO estimate, floor, target
    factor and hold release."""
    slo_needed: int | None = None
    """Replicas the SLO needs at the current cost (``slo_needed_replicas``), while an
    incident lasts; under ``CapAtBudget`` reported, not applied."""
    demand_replicas: int | None = None
    """The demand-alone reference: replicas the demand needs at the baseline cost."""
    drain: Drain | None = None
    """What draining a backlog within ``DRAIN_SECONDS`` needs, when the SLO estimate's
    headroom would take longer (``drain_max_replicas``)."""
    min_floor: int | None = None
    """minReplicas raised above the user's own for the SLO."""
    min_floor_kind: MinFloor | None = None
    """Which of the SLO guard's floors that is, when there is one."""
    headroom: int | None = None
    """Room over the current replicas for rising demand (``headroom.demand_headroom``),
    when the budget does not bind."""


def original_envelope(snapshot: Snapshot, learned: LearnedState) -> OriginalEnvelope:
    """The envelope before cachescale first touched the HPA (recorded once)."""
    if learned.original_envelope is not None:
        return learned.original_envelope
    hpa = snapshot.workload.hpa
    return OriginalEnvelope(
        min_replicas=hpa.min_replicas,
        max_replicas=hpa.max_replicas,
        target_average_value=hpa.target_average_value,
    )


def frozen_envelope(snapshot: Snapshot) -> Envelope:
    """The HPA's envelope exactly as it is (nothing decided while the data is not trusted)."""
    hpa = snapshot.workload.hpa
    return Envelope(hpa.min_replicas, hpa.max_replicas, hpa.target_average_value)


def open_envelope(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState
) -> Envelope:
    """The envelope on missing data: fail open. Nothing is lowered (minReplicas and the
    target stay as they are) and maxReplicas returns to the user's original (within
    ``budget.maxReplicas``), or stays where it is if that is higher, so a cap set on data
    that is now stale cannot block the HPA's own scale-up."""
    hpa = snapshot.workload.hpa
    original = original_envelope(snapshot, learned)
    max_replicas = max(hpa.max_replicas, min(original.max_replicas, spec.budget.max_replicas))
    return Envelope(hpa.min_replicas, max_replicas, hpa.target_average_value)


def hold_level(mark: ReplicaMark | None, requests_per_second: float | None, current: int) -> int:
    """Pre-collapse replicas, scaled up by demand growth since (never down); the current
    replicas when no healthy evaluation was ever seen (nothing better to return to).
    ``requests_per_second`` is the demand (``decide.demand``), as the mark's is."""
    if mark is None:
        return current
    growth = 1.0
    if requests_per_second is not None and mark.requests_per_second > 0:
        growth = max(1.0, requests_per_second / mark.requests_per_second)
    return scaled_replicas(mark.replicas, growth)


def demand_replicas(snapshot: Snapshot, learned: LearnedState) -> int | None:
    """The "demand alone" reference: ``ceil(baseline GPU-s/1k × demand / (1000 × GPUs))``,
    the replicas the demand needs at the healthy cost per request (None when either is
    unknown). No policy caps the fleet below it."""
    cost = learned.baseline.gpu_seconds_per_1k_requests
    rps = demand(snapshot).per_second
    gpus = snapshot.workload.gpus_per_pod
    if cost is None or rps is None or rps <= 0 or gpus <= 0:
        return None
    return math.ceil(cost * rps / (1000 * gpus) - 1e-9)


@dataclass(frozen=True, slots=True)
class EnvelopeFacts:
    """What the diagnosis found that the envelope depends on."""

    collapse_held: bool
    """A confirmed, unacknowledged collapse under ``onCollapse: Hold``."""
    slo_breached: bool
    budget_max: int | None
    max_num_seqs: int | None = None
    """The batch ceiling the pods will run with (after this decision's change, if any)."""
    over_budget: bool = False
    """The cost per request is over the budget (an incident the SLO floor may outlast)."""
    collapse_active: bool = False
    """A collapse is confirmed, or confirmed earlier and not yet recovered (any policy)."""
    requests_got_dearer: bool = False
    """Each request costs more than it did: the warm hit rate under its clearing threshold
    or prefill per request well above its baseline (``diagnosis._requests_got_dearer``)."""


def plan_envelope(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    now: datetime,
    facts: EnvelopeFacts,
) -> EnvelopePlan:
    """Decide min/max/target from the budget, a collapse hold and the SLO guard."""
    low, high = spec.budget.min_replicas, spec.budget.max_replicas
    original = original_envelope(snapshot, learned)
    current_max = snapshot.workload.hpa.max_replicas
    budget_max_replicas = (
        _clamp(current_max, low, high)
        if facts.budget_max is None
        else _clamp(facts.budget_max, low, high)
    )
    recommended, held_by, slo_guard = budget_max_replicas, None, False
    if facts.budget_max is not None and facts.budget_max < high:
        held_by = Hold.BUDGET
    if facts.collapse_held and spec.cache.on_collapse is CollapseAction.HOLD:
        rps = demand(snapshot).per_second
        level = max(low, hold_level(learned.pre_collapse, rps, snapshot.workload.replicas))
        released = learned.hold_released_for_slo
        window = math.ceil(STABILIZATION_SECONDS / spec.metrics.interval_seconds)
        if learned.streaks.slo_breach >= SLO_BREACH_EVALUATIONS:
            released = True
        elif released and learned.streaks.slo_comfortable >= window:
            released = False  # latency comfortable for a whole window: hold again
        learned = learned.model_copy(update={"hold_released_for_slo": released})
        if released:
            slo_guard = True
        elif level < budget_max_replicas:
            recommended, held_by = level, Hold.COLLAPSE
    # Under every policy: never below what the demand needs at the healthy cost.
    reference = demand_replicas(snapshot, learned)
    if reference is not None:
        recommended = max(recommended, _clamp(reference, low, high))
    # At a steady cost a rise is demand: room for the HPA to follow it now.
    dearer = facts.collapse_held or facts.collapse_active or facts.requests_got_dearer
    headroom = demand_headroom(spec, snapshot, steady_cost=not (dearer or facts.over_budget))
    if headroom is not None and min(headroom, high) > recommended:
        recommended, held_by = min(headroom, high), None
    # SLO first (not under CapAtBudget): never below what the SLO needs.
    needed_mark = slo_mark(
        spec,
        snapshot,
        learned,
        now,
        facts.budget_max,
        facts.over_budget,
        facts.requests_got_dearer,
    )
    learned = learned.model_copy(update={"slo_needed": needed_mark})
    slo_needed = None
    slo_raise = False
    if needed_mark is not None:
        slo_needed = min(high, slo_needed_replicas(needed_mark, demand(snapshot).per_second))
        if spec.cache.on_collapse is not CollapseAction.CAP_AT_BUDGET and slo_needed > recommended:
            recommended, held_by, slo_guard, slo_raise = slo_needed, None, True, True
    drain = drain_max_replicas(spec, snapshot, learned, slo_needed)
    if drain is not None and drain.replicas > recommended:
        recommended, held_by, slo_guard, slo_raise = drain.replicas, None, True, True
    else:
        drain = None  # not what sets maxReplicas: the messages name what does
    immediate = held_by == Hold.COLLAPSE
    prompt = slo_raise or headroom is not None  # the SLO's raise, or demand's
    max_replicas, learned = _stabilized_max(
        recommended, current_max, learned, now, immediate, prompt
    )
    max_replicas = _clamp(max_replicas, low, high)
    min_replicas = min(_clamp(original.min_replicas, low, high), max_replicas)
    floor, learned = _min_floor(spec, snapshot, learned, now, slo_needed, min_replicas)
    raised_min = kind = None
    if floor is not None and floor[0] > min_replicas:
        min_replicas = raised_min = min(floor[0], max_replicas)
        kind = floor[1]
        slo_guard = slo_guard or kind in _FLOORS_FOR_THE_SLO
    target, learned, lowered = slo_target(spec, snapshot, learned, original, max_replicas)
    target = _within_batch(target, snapshot, facts.max_num_seqs)
    learned = learned.model_copy(update={"original_envelope": original})
    return EnvelopePlan(
        envelope=Envelope(min_replicas, max_replicas, target),
        budget_max=facts.budget_max,
        held_by=held_by,
        slo_guard=slo_guard or lowered,
        learned=learned,
        slo_needed=slo_needed,
        demand_replicas=reference,
        drain=drain,
        min_floor=raised_min,
        min_floor_kind=kind,
        headroom=headroom,
    )


def _min_floor(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    now: datetime,
    slo_needed: int | None,
    user_min: int,
) -> tuple[tuple[int, MinFloor] | None, LearnedState]:
    """The highest of the SLO guard's floors on minReplicas, and which it is; without a
    breach floor, the raised one coming down (``released_floor``), no lower than the
    SLO's pods while a collapse alert lasts (``collapse_floor``). That holds a floor
    raised above ``user_min`` and never raises one: an estimate made on the first
    breaching evaluation (``slo_guard.estimate_confirmed``) raises maxReplicas at once and
    the floor only on the second, as without a collapse."""
    need = slo_floor(spec, learned, slo_needed)
    after_scale_down, learned = scale_down_floor(spec, snapshot, learned, now)
    if after_scale_down is not None and (need is None or after_scale_down > need):
        return (after_scale_down, MinFloor.AFTER_SCALE_DOWN), learned
    if need is not None:
        return (need, MinFloor.SLO_NEED), learned
    released = released_floor(spec, snapshot, learned, now)
    held = collapse_floor(spec, learned, slo_needed)
    raised = snapshot.workload.hpa.min_replicas > user_min
    if released is not None and held is not None and raised and held > released[0]:
        return (held, MinFloor.HELD_IN_COLLAPSE), learned
    return released, learned


_FLOORS_FOR_THE_SLO = (MinFloor.SLO_NEED, MinFloor.AFTER_SCALE_DOWN, MinFloor.HELD_IN_COLLAPSE)
"""The floors that raise minReplicas for the SLO (``ScaledForSLO``), not a release."""


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _stabilized_max(
    recommended: int,
    current: int,
    learned: LearnedState,
    now: datetime,
    immediate: bool,
    prompt_raise: bool = False,
) -> tuple[int, LearnedState]:
    """Apply the lowering window and the reversal window to a maxReplicas recommendation
    (a raise for the SLO or for rising demand, like a hold's release, is never delayed)."""
    marks = [
        m
        for m in learned.max_replicas_marks
        if (now - m.at).total_seconds() < STABILIZATION_SECONDS
    ]
    marks.append(EnvelopeMark(at=now, max_replicas=recommended))
    candidate = recommended
    if recommended < current and not immediate:
        # The highest recommendation of the window, but never above where it is now: the
        # window slows a lowering down, it never turns one into a raise.
        candidate = min(current, max(m.max_replicas for m in marks))
    direction = (candidate > current) - (candidate < current)
    last = learned.last_max_replicas_change_at
    reversing = direction != 0 and direction == -learned.last_max_replicas_direction
    hold_lowering = immediate and direction < 0
    hold_release = direction > 0 and (learned.last_max_replicas_was_hold or prompt_raise)
    if (
        reversing
        and not (hold_lowering or hold_release)
        and last is not None
        and (now - last).total_seconds() < STABILIZATION_SECONDS
    ):
        candidate, direction = current, 0
    update: dict[str, object] = {"max_replicas_marks": marks}
    if direction:
        update |= {
            "last_max_replicas_change_at": now,
            "last_max_replicas_direction": direction,
            "last_max_replicas_was_hold": hold_lowering,
        }
    return candidate, learned.model_copy(update=update)


def mark_unchanged(learned: LearnedState, current_max: int, now: datetime) -> LearnedState:
    """Record that maxReplicas is ``current_max`` after an evaluation that decided nothing
    from the data (a wait, or missing data): a lowering afterwards still needs a window of
    lower recommendations."""
    marks = [
        m
        for m in learned.max_replicas_marks
        if (now - m.at).total_seconds() < STABILIZATION_SECONDS
    ]
    marks.append(EnvelopeMark(at=now, max_replicas=current_max))
    return learned.model_copy(update={"max_replicas_marks": marks})


def _within_batch(
    target: float | None, snapshot: Snapshot, max_num_seqs: int | None
) -> float | None:
    """An HPA on the running batch must target below the batch ceiling: a pod can never
    run more than ``--max-num-seqs`` requests, so a target above ``BATCH_TARGET_SHARE`` of
    it would stop the HPA from ever scaling out once the ceiling is lowered."""
    if target is None or max_num_seqs is None or not on_running_batch(snapshot):
        return target
    return min(target, round(BATCH_TARGET_SHARE * max_num_seqs, 3))
