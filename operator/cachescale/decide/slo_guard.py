"""The SLO guard: what the SLO needs while an incident lasts, and the levers that get it.

Except under ``CapAtBudget``, TTFT comes before the budget (``docs/decisions.md``,
"Precedence"). Breaching evaluations while the fleet falls behind give an estimate of
the replicas the SLO needs (``slo_mark``), remembered while the incident lasts; the
envelope's top never goes below it, a backlog its headroom would drain slowly may raise
the top further (``drain_max_replicas``), minReplicas is floored while the breach lasts and comes
down in steps after it, no lower than its pods while a collapse alert lasts
(``slo_floor``, ``released_floor``, ``collapse_floor``), a scale-down that broke the SLO
is held one replica above for an hour (``scale_down_floor``), and the HPA's target is
lowered while the budget leaves room (``slo_target``). Kept apart from ``envelope``,
which combines these with the budget, a collapse hold and the anti-flapping windows, so
that each reads on its own. What the HPA's own metric asks for (``hpa_wanted_replicas``)
lives here too: the guard is what reads it to decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import MAX_REPLICAS, CacheScalingPolicySpec, CollapseAction
from cachescale.decide.demand import demand
from cachescale.decide.learned import (
    LearnedFloor,
    LearnedState,
    OriginalEnvelope,
    ReplicaCount,
    ReplicaMark,
)
from cachescale.decide.thresholds import (
    DRAIN_SECONDS,
    MIN_RELEASE_STEP,
    QUEUED_PER_POD,
    SCALE_DOWN_FLOOR_HOLD_SECONDS,
    SCALE_DOWN_FLOOR_MAX_HOLD_SECONDS,
    SLO_BREACH_EVALUATIONS,
    SLO_COMFORTABLE_SHARE,
    SLO_NEEDED_UTILISATION,
    STABILIZATION_SECONDS,
    TARGET_FLOOR,
    TARGET_STEP,
)
from cachescale.snapshot import Snapshot


def on_running_batch(snapshot: Snapshot) -> bool:
    """The HPA scales on the requests each pod runs (vLLM's ``num_requests_running``)."""
    return "running" in (snapshot.workload.hpa.metric_name or "")


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


def scaled_replicas(replicas: int, growth: float) -> int:
    """``ceil(replicas × growth)``, at most ``MAX_REPLICAS`` (finite however small the
    remembered rate a growth is measured from)."""
    return ceil_at_most(replicas * growth, MAX_REPLICAS)


def ceil_at_most(replicas: float, cap: int) -> int:
    """A fractional replica count rounded up, at most ``cap`` (finite for any input)."""
    return math.ceil(min(replicas, cap) - 1e-9)


def slo_needed_replicas(mark: ReplicaMark, requests_per_second: float | None) -> int:
    """The remembered SLO-needed replicas, scaled by the demand's change since (both
    ways: the estimate is per request)."""
    growth = 1.0
    if requests_per_second is not None and mark.requests_per_second > 0:
        growth = requests_per_second / mark.requests_per_second
    return max(1, scaled_replicas(mark.replicas, growth))


def falling_behind(snapshot: Snapshot) -> bool:
    """Requests arrive faster than the fleet serves them. Serving at least what arrives,
    the fleet keeps up: its queue is a backlog draining, and more capacity would only
    overshoot once it is gone. True when arrivals are unknown (nothing says it drains)."""
    need = demand(snapshot)
    served = snapshot.signals.requests_per_second.value
    if not need.arrivals:
        return True
    return need.per_second is not None and served is not None and need.per_second > served


def estimate_confirmed(snapshot: Snapshot, memory: LearnedState) -> bool:
    """The breach is confirmed for an SLO estimate: ``SLO_BREACH_EVALUATIONS`` breaching
    evaluations, or the first one while requests queue (``QUEUED_PER_POD`` or more
    waiting per pod) and, on a known arrival rate, arrive faster than the fleet serves
    them. A queue that grows is no passing noise in a window's TTFT, and the HPA alone
    orders its pods on its first sync after the queue appears: waiting for the second
    put the first estimate at 2,490 s in ``shuffled-long-tools`` seed 7, where the HPA
    alone had asked for 11 pods at 2,430 s, and its last third at 16.14 replicas
    against the HPA alone's 15.96 (15.27 since; ``docs/decisions.md`` section 7)."""
    breach = memory.streaks.slo_breach
    if breach >= SLO_BREACH_EVALUATIONS:
        return True
    waiting = snapshot.signals.waiting_requests_per_pod.value
    queued = waiting is not None and waiting >= QUEUED_PER_POD
    return breach >= 1 and queued and demand(snapshot).arrivals and falling_behind(snapshot)


def capped_below_hpa(snapshot: Snapshot) -> bool:
    """The fleet is at maxReplicas and the HPA's own metric asks for more: the envelope,
    not the HPA, is what stops it adding replicas."""
    hpa = snapshot.workload.hpa
    wanted = hpa_wanted_replicas(snapshot, hpa.target_average_value)
    at_top = snapshot.workload.replicas >= hpa.max_replicas
    return at_top and wanted is not None and wanted > hpa.max_replicas


def slo_mark(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: LearnedState,
    now: datetime,
    budget_max: int | None,
    over_budget: bool,
) -> ReplicaMark | None:
    """The replicas the SLO needs, remembered while the incident lasts.

    Estimated once the breach is confirmed (``estimate_confirmed``: two breaching
    evaluations, or the first while a queue grows) while replicas are short: requests
    queue and arrive faster than they are served (a queue served faster than requests
    arrive is a backlog draining), or, without a queue and before any estimate, the
    fleet is at maxReplicas and the HPA's own metric asks for more
    (``capped_below_hpa``: the envelope is what keeps the pods too busy; any other breach
    without a queue is the target guard's). An estimate is raised only on a growing
    queue: just after a backlog drains, the windowed TTFT and the HPA's windowed metric
    still read it for up to a window:
    ``ceil(serving × max(arrivals / served, 1) / SLO_NEEDED_UTILISATION)``, the pods that
    served what they did over the window, scaled to what arrives, with headroom. Serving
    pods are ``WorkloadState.serving_pods``: each ready pod counts for the share of the
    window it has been ready, so an estimate comes while new pods start and a window
    still covering the time before they were ready does not overstate the need. (The
    ready count did, so estimates waited for every pod to be ready and the youngest a
    window old, and a breach lasted a pod start longer: ``docs/decisions.md`` section 7,
    "The estimate counts the pods that served its window".) A later estimate replaces it
    only upward. It is released when the budget's allowance alone covers it, or when the
    incident is over (no breach, no collapse alert, the cost within budget)."""
    mark = memory.slo_needed
    need = demand(snapshot).per_second
    signals = snapshot.signals
    served = signals.requests_per_second.value
    waiting = signals.waiting_requests_per_pod.value
    serving = snapshot.workload.serving_pods(spec.metrics.window_seconds)
    confirmed = estimate_confirmed(snapshot, memory)
    queued = waiting is None or waiting >= QUEUED_PER_POD
    capped = mark is None and not queued and capped_below_hpa(snapshot)
    short = (queued and falling_behind(snapshot)) or capped
    if confirmed and short and serving > 0 and need is not None and served:
        ratio = max(need / served, 1.0)
        estimate = serving * ratio / SLO_NEEDED_UTILISATION
        # Never above the hard cap (and finite however little was served).
        needed = ceil_at_most(estimate, spec.budget.max_replicas)
        if mark is None or needed > slo_needed_replicas(mark, need):
            mark = ReplicaMark(replicas=needed, requests_per_second=need, at=now)
    if mark is None:
        return None
    covered = budget_max is not None and budget_max >= slo_needed_replicas(mark, need)
    incident = confirmed or memory.alert(Diagnosis.PREFIX_COLLAPSE) is not None or over_budget
    return None if covered or not incident else mark


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


def drain_max_replicas(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: LearnedState, slo_needed: int | None
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
    back (``rag-rechunk`` seed 7, ``docs/decisions.md`` section 3).

    It scales the ready count, not ``serving_pods`` as the estimate does: bounded by the
    HPA's ask either way, the serving pods made it rest higher (``shuffled-long-tools``
    seed 7 16.12 → 16.29 replicas over the last third, ``rag-rechunk`` seed 11 16.38 →
    17.14) and drained no backlog sooner (``scaleout-round-robin`` the same)."""
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


class MinFloor(StrEnum):
    """Why minReplicas is above the user's own (the words of ``actions``)."""

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
    spec: CacheScalingPolicySpec, memory: LearnedState, slo_needed: int | None
) -> int | None:
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
    return _without_headroom(slo_needed)


def _without_headroom(slo_needed: int) -> int:
    """The pods that serve the arrivals at the measured rate per pod: the SLO estimate
    without its headroom, ``ceil(slo_needed × SLO_NEEDED_UTILISATION)``."""
    return math.ceil(slo_needed * SLO_NEEDED_UTILISATION - 1e-9)


def collapse_floor(
    spec: CacheScalingPolicySpec, memory: LearnedState, slo_needed: int | None
) -> int | None:
    """The least a floor coming down after the breach may reach while the PrefixCollapse
    alert lasts (not under ``CapAtBudget``): ``slo_floor``'s pods, the remembered
    estimate scaled by the demand since, ``ceil(slo_needed × SLO_NEEDED_UTILISATION)``.

    With the cache collapsed, each request carries several times the prefill its slot in
    the running batch shows: an HPA on that batch reads the fleet as half idle and scales
    down into a queue (one on the queue asks for its minimum while nothing waits). In
    ``collapse-then-decline`` seed 11 traffic fell 30 → 20 req/s with the cache still
    collapsed, the HPA went 13 → 8 ready pods, the queue reached 251 and TTFT p95 over
    the last third was 6.14 s (the HPA alone 11.38 s); with this floor, at the estimate
    scaled to 20 req/s, 0.57 s at 11.38 replicas against 12.11.

    Only under a collapse alert: over budget without one (a dearer cache at a tight
    budget) lasts for hours, and the floor held there kept ``shuffled-tools`` seed 7 at
    8.41 replicas over the last third against 7.88 (the HPA alone 8.12), to take a TTFT
    p95 already within the 1 s SLO from 0.41 to 0.33 s (``docs/decisions.md`` section
    3)."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET or slo_needed is None:
        return None
    if memory.alert(Diagnosis.PREFIX_COLLAPSE) is None:
        return None
    return _without_headroom(slo_needed)


def scale_down_floor(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: LearnedState, now: datetime
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
    twice as long as the last time (``_next_hold``): its release is what broke the SLO.
    With the hour each time, ``batch-pressure-loop`` seed 7 released its floor of 4 at
    8,760 and 12,720 s and breached into learning it again at 9,030 and 12,900 s; held
    twice as long the second time, the second release does not come, and TTFT p95 over
    the last third went 0.97 → 0.74 s (``docs/decisions.md`` sections 3 and 7)."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None, memory
    workload = snapshot.workload
    horizon = spec.metrics.window_seconds + spec.metrics.interval_seconds
    known = demand(snapshot).per_second is not None
    p95 = snapshot.signals.ttft_p95_seconds.value
    recent = [m for m in memory.recent_replicas if (now - m.at).total_seconds() <= horizon]
    comfortable = [
        m for m in memory.comfortable_replicas if (now - m.at).total_seconds() <= horizon
    ]
    if known:
        mark = ReplicaCount(replicas=workload.replicas, at=now)
        recent.append(mark)
        ready = workload.ready_replicas >= workload.replicas > 0
        if ready and p95 is not None and p95 < SLO_COMFORTABLE_SHARE * spec.slo.ttft_p95_seconds:
            comfortable.append(mark)
    floor = memory.scale_down_floor
    held = floor if floor is not None and floor.released_at is None else None
    breach = memory.streaks.slo_breach
    if breach == SLO_BREACH_EVALUATIONS and recent and known:
        fewest = min(m.replicas for m in recent)
        if any(m.replicas > fewest for m in comfortable):
            level = fewest + 1 if held is None else max(fewest + 1, held.replicas)
            floor = LearnedFloor(replicas=level, at=now, hold_seconds=_next_hold(floor))
    elif breach >= SLO_BREACH_EVALUATIONS and held is not None:
        floor = held.model_copy(update={"at": now})
    floor = _released(floor, now)
    update = {"recent_replicas": recent, "comfortable_replicas": comfortable}
    memory = memory.model_copy(update=update | {"scale_down_floor": floor})
    if floor is None or floor.released_at is not None:
        return None, memory
    return floor.replicas, memory


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
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: LearnedState, now: datetime
) -> tuple[int, MinFloor] | None:
    """After the breach, a floor found on the HPA comes down by ``MIN_RELEASE_STEP`` per
    evaluation. Dropped at once, it lets the HPA fall to what its metric read on the
    oversized fleet, far below what the fleet serves with; in steps, the HPA's own metric
    catches the fleet on the way down.

    Only a metric that reads the load on the pods (the running batch) catches it. On the
    queue (KEDA's trigger) the HPA asks for its minimum while nothing waits, so the fleet
    is the floor, and the queue shows a count too few only once TTFT has breached there:
    stepping each evaluation, the floor went 16 → 10 in four (``rag-rechunk-keda``), the
    fleet with it, and the backlog took TTFT p95 to 48 s. For such an HPA the floor steps
    once the fleet has run a whole window at it, so the windowed TTFT judges each count
    before the next.

    It stops where it is while TTFT breaches the SLO again: stepping down under a breach
    that no lever sizes (no estimate, no scale-down to learn from) hands the HPA the
    count it is breaching at."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET:
        return None
    current = snapshot.workload.hpa.min_replicas
    if memory.streaks.slo_breach >= SLO_BREACH_EVALUATIONS:
        return current, MinFloor.HELD_IN_BREACH
    step = current - max(1, math.floor(MIN_RELEASE_STEP * current))
    if on_running_batch(snapshot):
        return step, MinFloor.RELEASING
    paced = step if _ran_a_window_at(current, spec, memory, now) else current
    return paced, MinFloor.RELEASING_PER_WINDOW


def _ran_a_window_at(
    replicas: int, spec: CacheScalingPolicySpec, memory: LearnedState, now: datetime
) -> bool:
    """The fleet ran at ``replicas`` or fewer for the whole last window (so the windowed
    TTFT is that count's)."""
    window = spec.metrics.window_seconds
    ages = [((now - m.at).total_seconds(), m.replicas) for m in memory.recent_replicas]
    covered = any(age >= window for age, _ in ages)
    return covered and all(count <= replicas for age, count in ages if age < window)


def slo_target(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: LearnedState,
    original: OriginalEnvelope,
    max_replicas: int,
) -> tuple[float | None, LearnedState, bool]:
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
