"""The HPA envelope: min/max replicas and the queue target the HPA scales inside.

cachescale does not replace the HPA; it reshapes the box the HPA moves in. The box is
always inside ``budget.minReplicas..maxReplicas`` (the hard cap) and otherwise never above
what the GPU-s/1k budget allows at the demand. On a confirmed prefix collapse with
``Hold`` the top is pinned at the pre-collapse level (scaled by any demand growth since),
unless TTFT breaches the SLO, in which case the SLO guard lets the HPA use the budget.
Two floors come first (``docs/decisions.md``, "Precedence"): never below what the demand
needs at the baseline cost (every policy), and, except under ``CapAtBudget``, never below
what the SLO needs while an incident lasts (``_slo_mark``).

Against flapping:

- maxReplicas is lowered only to the highest recommendation of the last
  ``STABILIZATION_SECONDS`` (as the HPA's own scale-down stabilization);
- after a change in one direction, a change in the other waits out the same window;
- a confirmed collapse hold is exempt from both: it has already waited
  ``collapseWindows`` evaluations, and every minute of delay buys replicas it exists to
  prevent; so is releasing a hold (the SLO guard, an acknowledgement, recovery): a hold
  is a deliberate state, and leaving it is not a flap; so is a raise to what the SLO
  needs (it already waited ``SLO_BREACH_EVALUATIONS`` breaching evaluations);
- once the SLO guard has released a hold, the hold returns only after a whole window of
  comfortable latency (not on the first evaluation without a breach), so hold and
  release cannot alternate;
- the target moves in 20% steps, down at most every second breaching evaluation, and
  back up only after each full window of comfortable latency.

On unknown data nothing here lowers anything: an unknown request rate means no budget cap
is derived, and the current maxReplicas is kept; with a required signal missing the top
opens back to the user's original maxReplicas (``open_envelope``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.reasons import Diagnosis, Hold
from cachescale.api.spec import MAX_REPLICAS, CacheScalingPolicySpec, CollapseAction
from cachescale.decide.demand import demand
from cachescale.decide.memory import EnvelopeMark, Memory, OriginalEnvelope, ReplicaMark
from cachescale.decide.thresholds import (
    BATCH_TARGET_SHARE,
    DRAIN_SECONDS,
    MIN_RELEASE_STEP,
    QUEUED_PER_POD,
    SLO_BREACH_EVALUATIONS,
    SLO_NEEDED_UTILISATION,
    STABILIZATION_SECONDS,
    TARGET_FLOOR,
    TARGET_STEP,
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
    """The envelope decided, why it is held (if it is), and the memory it leaves."""

    envelope: Envelope
    budget_max: int | None
    """Most replicas the budget allows now (None: request rate unknown or zero)."""
    held_by: Hold | None
    """Why the top is below what the HPA would otherwise get, if it is."""
    slo_guard: bool
    """True when the SLO guard overrode a collapse hold or lowered the target."""
    memory: Memory
    slo_needed: int | None = None
    """Replicas the SLO needs at the current cost (``slo_needed_replicas``), while an
    incident lasts; under ``CapAtBudget`` reported, not applied."""
    demand_replicas: int | None = None
    """The demand-alone reference: replicas the demand needs at the baseline cost."""
    drain: Drain | None = None
    """What draining a backlog within ``DRAIN_SECONDS`` needs, when the SLO estimate's
    headroom would take longer (``drain_top``)."""
    min_floor: int | None = None
    """minReplicas raised above the user's own for the SLO (``_slo_floor``)."""
    min_floor_releasing: bool = False
    """That floor is coming down after the breach (``_released_floor``)."""


def original_envelope(snapshot: Snapshot, memory: Memory) -> OriginalEnvelope:
    """The envelope before cachescale first touched the HPA (recorded once)."""
    if memory.original_envelope is not None:
        return memory.original_envelope
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


def open_envelope(spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: Memory) -> Envelope:
    """The envelope on missing data: fail open. Nothing is lowered (minReplicas and the
    target stay as they are) and the top returns to the user's original maxReplicas
    (within ``budget.maxReplicas``), or stays where it is if that is higher, so a cap set
    on data that is now stale cannot block the HPA's own scale-up."""
    hpa = snapshot.workload.hpa
    original = original_envelope(snapshot, memory)
    top = max(hpa.max_replicas, min(original.max_replicas, spec.budget.max_replicas))
    return Envelope(hpa.min_replicas, top, hpa.target_average_value)


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


def demand_replicas(snapshot: Snapshot, memory: Memory) -> int | None:
    """The "demand alone" reference: ``ceil(baseline GPU-s/1k × demand / (1000 × GPUs))``,
    the replicas the demand needs at the healthy cost per request (None when either is
    unknown). No policy caps the fleet below it."""
    cost = memory.baseline.gpu_seconds_per_1k_requests
    rps = demand(snapshot).per_second
    gpus = snapshot.workload.gpus_per_pod
    if cost is None or rps is None or rps <= 0 or gpus <= 0:
        return None
    return math.ceil(cost * rps / (1000 * gpus) - 1e-9)


def slo_needed_replicas(mark: ReplicaMark, requests_per_second: float | None) -> int:
    """The remembered SLO-needed replicas, scaled by the demand's change since (both
    ways: the estimate is per request)."""
    growth = 1.0
    if requests_per_second is not None and mark.requests_per_second > 0:
        growth = requests_per_second / mark.requests_per_second
    return max(1, scaled_replicas(mark.replicas, growth))


def scaled_replicas(replicas: int, growth: float) -> int:
    """``ceil(replicas × growth)``, at most ``MAX_REPLICAS`` (finite however small the
    remembered rate a growth is measured from)."""
    return ceil_at_most(replicas * growth, MAX_REPLICAS)


def ceil_at_most(replicas: float, cap: int) -> int:
    """A fractional replica count rounded up, at most ``cap`` (finite for any input)."""
    return math.ceil(min(replicas, cap) - 1e-9)


@dataclass(frozen=True, slots=True)
class Drain:
    """A backlog too large for the SLO estimate's headroom, and the top that drains it."""

    waiting: int
    """Requests waiting across the ready pods."""
    replicas: int
    """The top that drains them within ``DRAIN_SECONDS`` (at most the HPA's own ask)."""

    def purpose(self) -> str:
        """``to drain 3,000 waiting requests within 10 min``."""
        return f"to drain {self.waiting:,} waiting requests within {DRAIN_SECONDS / 60:.0f} min"


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


def plan_envelope(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    now: datetime,
    facts: EnvelopeFacts,
) -> EnvelopePlan:
    """Decide min/max/target from the budget, a collapse hold and the SLO guard."""
    low, high = spec.budget.min_replicas, spec.budget.max_replicas
    original = original_envelope(snapshot, memory)
    current_max = snapshot.workload.hpa.max_replicas
    budget_top = (
        _clamp(current_max, low, high)
        if facts.budget_max is None
        else _clamp(facts.budget_max, low, high)
    )
    recommended, held_by, slo_guard = budget_top, None, False
    if facts.budget_max is not None and facts.budget_max < high:
        held_by = Hold.BUDGET
    if facts.collapse_held and spec.cache.on_collapse is CollapseAction.HOLD:
        rps = demand(snapshot).per_second
        level = max(low, hold_level(memory.pre_collapse, rps, snapshot.workload.replicas))
        released = memory.hold_released_for_slo
        window = math.ceil(STABILIZATION_SECONDS / spec.metrics.interval_seconds)
        if memory.streaks.slo_breach >= SLO_BREACH_EVALUATIONS:
            released = True
        elif released and memory.streaks.slo_comfortable >= window:
            released = False  # latency comfortable for a whole window: hold again
        memory = memory.model_copy(update={"hold_released_for_slo": released})
        if released:
            slo_guard = True
        elif level < budget_top:
            recommended, held_by = level, Hold.COLLAPSE
    # Under every policy: never below what the demand needs at the healthy cost.
    reference = demand_replicas(snapshot, memory)
    if reference is not None:
        recommended = max(recommended, _clamp(reference, low, high))
    # SLO first (not under CapAtBudget): never below what the SLO needs.
    slo_mark = _slo_mark(spec, snapshot, memory, now, facts)
    memory = memory.model_copy(update={"slo_needed": slo_mark})
    slo_needed = None
    slo_raise = False
    if slo_mark is not None:
        slo_needed = min(high, slo_needed_replicas(slo_mark, demand(snapshot).per_second))
        if spec.cache.on_collapse is not CollapseAction.CAP_AT_BUDGET and slo_needed > recommended:
            recommended, held_by, slo_guard, slo_raise = slo_needed, None, True, True
    drain = drain_top(spec, snapshot, memory, slo_needed)
    if drain is not None and drain.replicas > recommended:
        recommended, held_by, slo_guard, slo_raise = drain.replicas, None, True, True
    else:
        drain = None  # not what sets the top: the messages name what does
    immediate = held_by == Hold.COLLAPSE
    max_replicas, memory = _stabilized_max(
        recommended, current_max, memory, now, immediate, slo_raise
    )
    max_replicas = _clamp(max_replicas, low, high)
    min_replicas = min(_clamp(original.min_replicas, low, high), max_replicas)
    breach_floor = _slo_floor(spec, memory, slo_needed)
    floor = breach_floor if breach_floor is not None else _released_floor(spec, snapshot)
    raised_min = None
    if floor is not None and floor > min_replicas:
        min_replicas = raised_min = min(floor, max_replicas)
        slo_guard = slo_guard or breach_floor is not None
    target, memory, lowered = _slo_target(spec, snapshot, memory, original, max_replicas)
    target = _within_batch(target, snapshot, facts.max_num_seqs)
    memory = memory.model_copy(update={"original_envelope": original})
    return EnvelopePlan(
        envelope=Envelope(min_replicas, max_replicas, target),
        budget_max=facts.budget_max,
        held_by=held_by,
        slo_guard=slo_guard or lowered,
        memory=memory,
        slo_needed=slo_needed,
        demand_replicas=reference,
        drain=drain,
        min_floor=raised_min,
        min_floor_releasing=raised_min is not None and breach_floor is None,
    )


def _slo_mark(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    now: datetime,
    facts: EnvelopeFacts,
) -> ReplicaMark | None:
    """The replicas the SLO needs, remembered while the incident lasts.

    Estimated after ``SLO_BREACH_EVALUATIONS`` breaching evaluations while replicas are
    short: requests queue and arrive faster than they are served (a queue served faster
    than requests arrive is a backlog draining), or, without a queue and before any
    estimate, the fleet is at maxReplicas and the HPA's own metric asks for more
    (``capped_below_hpa``: the envelope is what keeps the pods too busy; any other breach
    without a queue is the target guard's). An estimate is raised only on a growing
    queue: just after a backlog drains, the windowed TTFT and the HPA's windowed metric
    still read it for up to a window:
    ``ceil(ready × max(arrivals / served, 1) / SLO_NEEDED_UTILISATION)``, the pods that
    served what they did, scaled to what arrives, with headroom. The first estimate needs
    every pod ready; a later one replaces it only upward, and only on settled pods (the
    youngest a whole window old: a window still covering the time before new pods were
    ready would overstate the need). It is released when the budget's allowance alone
    covers it, or when the incident is over (no breach, no collapse alert, the cost
    within budget)."""
    mark = memory.slo_needed
    need = demand(snapshot).per_second
    signals = snapshot.signals
    served = signals.requests_per_second.value
    waiting = signals.waiting_requests_per_pod.value
    workload = snapshot.workload
    ready = workload.ready_replicas >= workload.replicas > 0
    settled = ready and (
        mark is None or min(workload.pod_ages_seconds, default=0.0) >= spec.metrics.window_seconds
    )
    breaching = memory.streaks.slo_breach >= SLO_BREACH_EVALUATIONS
    queued = waiting is None or waiting >= QUEUED_PER_POD
    capped = mark is None and not queued and capped_below_hpa(snapshot)
    short = (queued and falling_behind(snapshot)) or capped
    if breaching and settled and short and need is not None and served is not None and served > 0:
        ratio = max(need / served, 1.0)
        estimate = workload.ready_replicas * ratio / SLO_NEEDED_UTILISATION
        # Never above the hard cap (and finite however little was served).
        needed = ceil_at_most(estimate, spec.budget.max_replicas)
        if mark is None or needed > slo_needed_replicas(mark, need):
            mark = ReplicaMark(replicas=needed, requests_per_second=need, at=now)
    if mark is None:
        return None
    covered = facts.budget_max is not None and facts.budget_max >= slo_needed_replicas(mark, need)
    incident = breaching or memory.alert(Diagnosis.PREFIX_COLLAPSE) is not None or facts.over_budget
    return None if covered or not incident else mark


def drain_top(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: Memory, slo_needed: int | None
) -> Drain | None:
    """The top a backlog needs while TTFT breaches, after an SLO estimate (not under
    ``CapAtBudget``): the pods that serve the arrivals and the waiting requests within
    ``DRAIN_SECONDS``, with the estimate's headroom,
    ``ceil(ready × (arrivals + waiting / DRAIN_SECONDS) / served / SLO_NEEDED_UTILISATION)``,
    and at most what the HPA's own metric asks for: the top lets the HPA drain the backlog
    as it would alone, a step per evaluation, and never adds a replica it does not ask for.
    None when the fleet's surplus (served − arriving) drains the backlog within
    ``DRAIN_SECONDS``, with no queue, or when it needs no more than the estimate; and for
    an HPA on anything but the running batch: on the queue (KEDA's trigger) its ask grows
    with the backlog and bounds nothing, and the estimate alone, its served rate lagging
    the new pods, overshot (``rag-rechunk-keda`` seed 7: 18.64 → 20.61 replicas over the
    last third for no better latency).

    The estimate sizes the fleet for the arrivals with 15% headroom; a backlog built
    while it lagged drains at that headroom only. The top is transient, gone with the
    backlog, and comes only above an estimate, which is what the fleet returns to: without
    one, the top fell back to the budget's once the backlog drained and the queue came
    back (``rag-rechunk`` seed 7, ``docs/decisions.md`` section 3)."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET or slo_needed is None:
        return None
    if memory.streaks.slo_breach < SLO_BREACH_EVALUATIONS or not on_running_batch(snapshot):
        return None
    need = demand(snapshot).per_second
    served = snapshot.signals.requests_per_second.value
    per_pod = snapshot.signals.waiting_requests_per_pod.value
    ready = snapshot.workload.ready_replicas
    if need is None or not served or per_pod is None or per_pod < QUEUED_PER_POD or ready <= 0:
        return None
    waiting = per_pod * ready
    to_serve = need + waiting / DRAIN_SECONDS
    if to_serve <= served:
        return None
    estimate = ready * to_serve / served / SLO_NEEDED_UTILISATION
    top = ceil_at_most(estimate, spec.budget.max_replicas)
    hpa = snapshot.workload.hpa
    wanted = hpa_wanted_replicas(snapshot, hpa.target_average_value)
    if wanted is None:
        return None
    top = min(top, max(wanted, hpa.max_replicas))
    return Drain(waiting=round(waiting), replicas=top) if top > slo_needed else None


def capped_below_hpa(snapshot: Snapshot) -> bool:
    """The fleet is at maxReplicas and the HPA's own metric asks for more: the envelope,
    not the HPA, is what stops it adding replicas."""
    hpa = snapshot.workload.hpa
    wanted = hpa_wanted_replicas(snapshot, hpa.target_average_value)
    at_top = snapshot.workload.replicas >= hpa.max_replicas
    return at_top and wanted is not None and wanted > hpa.max_replicas


def falling_behind(snapshot: Snapshot) -> bool:
    """Requests arrive faster than the fleet serves them. Serving at least what arrives,
    the fleet keeps up: its queue is a backlog draining, and more capacity would only
    overshoot once it is gone. True when arrivals are unknown (nothing says it drains)."""
    need = demand(snapshot)
    served = snapshot.signals.requests_per_second.value
    if not need.arrivals:
        return True
    return need.per_second is not None and served is not None and need.per_second > served


def _slo_floor(spec: CacheScalingPolicySpec, memory: Memory, slo_needed: int | None) -> int | None:
    """The least minReplicas may be while TTFT breaches the SLO (not under
    ``CapAtBudget``): the pods that serve what arrives at the rate each serves now,
    ``slo_needed`` without its headroom (which is the top's, for the HPA's own metric).

    A raised top only lets the HPA add replicas; an HPA whose own metric is under its
    target (a running-batch metric while requests wait for prefill) adds none, and the
    queue grows. The floor makes the HPA add them now."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None
    if slo_needed is None or memory.streaks.slo_breach < SLO_BREACH_EVALUATIONS:
        return None
    return math.ceil(slo_needed * SLO_NEEDED_UTILISATION - 1e-9)


def _released_floor(spec: CacheScalingPolicySpec, snapshot: Snapshot) -> int | None:
    """After the breach, a floor found on the HPA comes down by ``MIN_RELEASE_STEP`` per
    evaluation. Dropped at once, it lets the HPA fall to what its metric read on the
    oversized fleet, far below what the fleet serves with; in steps, the HPA's own metric
    catches the fleet on the way down."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None
    current = snapshot.workload.hpa.min_replicas
    return current - max(1, math.floor(MIN_RELEASE_STEP * current))


def hpa_wanted_replicas(snapshot: Snapshot, target: float | None) -> int | None:
    """The HPA's own replica count for its metric at ``target`` (ceil(ready × avg / target))."""
    name = snapshot.workload.hpa.metric_name or ""
    signals = snapshot.signals
    per_pod = (
        signals.running_requests_per_pod
        if on_running_batch(snapshot)
        else signals.waiting_requests_per_pod
        if "waiting" in name or "queue" in name
        else None
    )
    if per_pod is None or per_pod.value is None or not target:
        return None
    return math.ceil(snapshot.workload.ready_replicas * per_pod.value / target - 1e-9)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _stabilized_max(
    recommended: int,
    current: int,
    memory: Memory,
    now: datetime,
    immediate: bool,
    slo_raise: bool = False,
) -> tuple[int, Memory]:
    """Apply the lowering window and the reversal window to a maxReplicas recommendation
    (a raise for the SLO, like a hold's release, is never delayed)."""
    marks = [
        m for m in memory.max_replicas_marks if (now - m.at).total_seconds() < STABILIZATION_SECONDS
    ]
    marks.append(EnvelopeMark(at=now, max_replicas=recommended))
    candidate = recommended
    if recommended < current and not immediate:
        # The highest recommendation of the window, but never above where it is now: the
        # window slows a lowering down, it never turns one into a raise.
        candidate = min(current, max(m.max_replicas for m in marks))
    direction = (candidate > current) - (candidate < current)
    last = memory.last_max_replicas_change_at
    reversing = direction != 0 and direction == -memory.last_max_replicas_direction
    hold_lowering = immediate and direction < 0
    hold_release = direction > 0 and (memory.last_max_replicas_was_hold or slo_raise)
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
    return candidate, memory.model_copy(update=update)


def mark_unchanged(memory: Memory, current_max: int, now: datetime) -> Memory:
    """Record that maxReplicas is ``current_max`` after an evaluation that decided nothing
    from the data (a wait, or missing data): a lowering afterwards still needs a window of
    lower recommendations."""
    marks = [
        m for m in memory.max_replicas_marks if (now - m.at).total_seconds() < STABILIZATION_SECONDS
    ]
    marks.append(EnvelopeMark(at=now, max_replicas=current_max))
    return memory.model_copy(update={"max_replicas_marks": marks})


def _within_batch(
    target: float | None, snapshot: Snapshot, max_num_seqs: int | None
) -> float | None:
    """An HPA on the running batch must target below the batch ceiling: a pod can never
    run more than ``--max-num-seqs`` requests, so a target above ``BATCH_TARGET_SHARE`` of
    it would stop the HPA from ever scaling out once the ceiling is lowered."""
    if target is None or max_num_seqs is None or not on_running_batch(snapshot):
        return target
    return min(target, round(BATCH_TARGET_SHARE * max_num_seqs, 3))


def on_running_batch(snapshot: Snapshot) -> bool:
    """The HPA scales on the requests each pod runs (vLLM's ``num_requests_running``)."""
    return "running" in (snapshot.workload.hpa.metric_name or "")


def _slo_target(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    original: OriginalEnvelope,
    max_replicas: int,
) -> tuple[float | None, Memory, bool]:
    """The SLO guard's lever: lower the queue target while TTFT breaches the SLO and the
    budget leaves room above the current replicas; relax it back once comfortable."""
    if original.target_average_value is None:
        return None, memory, False
    factor = memory.target_factor
    workload = snapshot.workload
    # Room within the budget, and no capacity added within the window: while pods are
    # starting, or the windowed TTFT still covers the time before they were ready, a
    # lower target would only overshoot.
    window = spec.metrics.window_seconds
    settled = min(workload.pod_ages_seconds, default=0.0) >= window
    room = (
        workload.replicas < max_replicas
        and workload.ready_replicas >= workload.replicas
        and settled
        and falling_behind(snapshot)
    )
    window_evaluations = math.ceil(STABILIZATION_SECONDS / spec.metrics.interval_seconds)
    breach, comfortable = memory.streaks.slo_breach, memory.streaks.slo_comfortable
    lowered = False
    if breach >= SLO_BREACH_EVALUATIONS and breach % SLO_BREACH_EVALUATIONS == 0 and room:
        lowered = factor > TARGET_FLOOR
        factor = max(TARGET_FLOOR, factor * TARGET_STEP)
    elif comfortable and comfortable % window_evaluations == 0 and factor < 1.0:
        factor = min(1.0, factor / TARGET_STEP)
    memory = memory.model_copy(update={"target_factor": factor})
    return round(original.target_average_value * factor, 3), memory, lowered
