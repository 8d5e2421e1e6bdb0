"""The SLO guard: what the SLO needs while an incident lasts, and maxReplicas and the target.

Except under ``CapAtBudget``, TTFT comes before the budget (``docs/decisions.md``,
"Precedence"). Breaching evaluations while the fleet falls behind give an estimate of
the replicas the SLO needs (``slo_mark``), remembered while the incident lasts; the
envelope's maxReplicas never goes below it, and a backlog its headroom would drain slowly
may raise maxReplicas further (``drain_max_replicas``). While the budget leaves room the
HPA's target is lowered in steps (``slo_target``). The floors on minReplicas are
``slo_floors``; ``envelope`` combines all of them with the budget, a collapse hold and
the anti-flapping windows, so that each rule reads on its own. Users read the rules in
``docs/decisions.md``, "The SLO guard"; the evidence for each choice (and what was tried
instead) is ``docs/design/slo-estimate.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import MAX_REPLICAS, CacheScalingPolicySpec, CollapseAction
from cachescale.decide.demand import demand
from cachescale.decide.hpa_metric import hpa_wanted_replicas, on_running_batch
from cachescale.decide.learned import LearnedState, OriginalEnvelope, ReplicaMark
from cachescale.decide.thresholds import (
    DRAIN_SECONDS,
    QUEUED_PER_POD,
    SLO_BREACH_EVALUATIONS,
    SLO_NEEDED_UTILISATION,
    STABILIZATION_SECONDS,
    TARGET_FLOOR,
    TARGET_STEP,
)
from cachescale.snapshot import Snapshot


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


def estimate_confirmed(snapshot: Snapshot, learned: LearnedState) -> bool:
    """The breach is confirmed for an SLO estimate: ``SLO_BREACH_EVALUATIONS`` breaching
    evaluations, or the first one while requests queue (``QUEUED_PER_POD`` or more
    waiting per pod) and, on a known arrival rate, arrive faster than the fleet serves
    them. A queue that grows is no passing noise in a window's TTFT, and the HPA alone
    orders its pods on its first sync after the queue appears: an estimate that waited
    for the second breaching evaluation would come after the HPA's own scale-up."""
    breach = learned.streaks.slo_breach
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
    at_max_replicas = snapshot.workload.replicas >= hpa.max_replicas
    return at_max_replicas and wanted is not None and wanted > hpa.max_replicas


def slo_mark(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    now: datetime,
    budget_max: int | None,
    over_budget: bool,
    requests_got_dearer: bool = False,
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
    still read it for up to a window.

    The estimate is ``ceil(serving × max(arrivals / served, 1) / SLO_NEEDED_UTILISATION)``,
    the pods that served what they did over the window, scaled to what arrives, with
    headroom, at most ``budget.maxReplicas``. Serving pods are
    ``WorkloadState.serving_pods``: each ready pod counts for the share of the window it
    has been ready, so an estimate comes while new pods start, and a window still
    covering the time before they were ready does not overstate the need. A later
    estimate replaces it only upward. It is released when the budget's allowance alone
    covers it, or when the incident is over (no breach, no collapse alert, the cost
    within budget, requests no dearer than they were: a cost held within the budget by a
    fleet the budget keeps short is not the end of the incident that made it short)."""
    mark = learned.slo_needed
    need = demand(snapshot).per_second
    signals = snapshot.signals
    served = signals.requests_per_second.value
    waiting = signals.waiting_requests_per_pod.value
    serving = snapshot.workload.serving_pods(spec.metrics.window_seconds)
    confirmed = estimate_confirmed(snapshot, learned)
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
    collapse = learned.alert(Diagnosis.PREFIX_COLLAPSE) is not None
    incident = confirmed or collapse or over_budget or requests_got_dearer
    return None if covered or not incident else mark


@dataclass(frozen=True, slots=True)
class Drain:
    """A backlog too large for the SLO estimate's headroom, and the maxReplicas that
    drains it."""

    waiting: int
    """Requests waiting across the ready pods."""
    replicas: int
    """The maxReplicas that drains them within ``DRAIN_SECONDS`` (at most the HPA's own
    ask, or the current maxReplicas if higher)."""

    def purpose(self) -> str:
        """``to drain 3,000 waiting requests within 10 min``."""
        return f"to drain {self.waiting:,} waiting requests within {DRAIN_SECONDS / 60:.0f} min"


def drain_max_replicas(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, slo_needed: int | None
) -> Drain | None:
    """The maxReplicas a backlog needs while TTFT breaches, after an SLO estimate (not
    under ``CapAtBudget``): the pods that serve the arrivals and the waiting requests
    within ``DRAIN_SECONDS``, with the estimate's headroom,
    ``ceil(ready × (arrivals + waiting / DRAIN_SECONDS) / served / SLO_NEEDED_UTILISATION)``,
    at most ``budget.maxReplicas`` and at most what the HPA's own metric asks for (or the
    current maxReplicas, if higher): it lets the HPA drain the backlog as it would alone,
    a step per evaluation, and never adds a replica the HPA does not ask for.

    None unless it is above the estimate, and None when the fleet's surplus (served −
    arriving) drains the backlog within ``DRAIN_SECONDS``, with no queue, before
    ``SLO_BREACH_EVALUATIONS`` breaching evaluations, and for an HPA on anything but the
    running batch: on the queue (KEDA's trigger) its ask grows with the backlog and
    bounds nothing, and the estimate's served rate lags the new pods.

    The estimate sizes the fleet for the arrivals with its headroom; a backlog built
    while it lagged drains at that headroom only. This maxReplicas is transient, gone
    with the backlog, and comes only above an estimate, which is what the fleet returns
    to (without one it would fall back to the budget's and let the queue return). It
    scales the ready count, not ``serving_pods`` as the estimate does: bounded by the
    HPA's ask either way, the ready count rests lower and drains as soon."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET or slo_needed is None:
        return None
    if learned.streaks.slo_breach < SLO_BREACH_EVALUATIONS or not on_running_batch(snapshot):
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
    max_replicas = ceil_at_most(estimate, spec.budget.max_replicas)
    hpa = snapshot.workload.hpa
    wanted = hpa_wanted_replicas(snapshot, hpa.target_average_value)
    if wanted is None:
        return None
    max_replicas = min(max_replicas, max(wanted, hpa.max_replicas))
    return (
        Drain(waiting=round(waiting), replicas=max_replicas) if max_replicas > slo_needed else None
    )


def slo_target(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    original: OriginalEnvelope,
    max_replicas: int,
) -> tuple[float | None, LearnedState, bool]:
    """The SLO guard's lever on the target: lower it by ``TARGET_STEP`` every
    ``SLO_BREACH_EVALUATIONS`` breaching evaluations while the budget leaves room above
    the current replicas (never below ``TARGET_FLOOR`` of the original), and relax it by
    the same step after each full ``STABILIZATION_SECONDS`` of comfortable latency. True
    in the last place when this evaluation lowered it."""
    if original.target_average_value is None:
        return None, learned, False
    factor = learned.target_factor
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
    breach, comfortable = learned.streaks.slo_breach, learned.streaks.slo_comfortable
    lowered = False
    if breach >= SLO_BREACH_EVALUATIONS and breach % SLO_BREACH_EVALUATIONS == 0 and room:
        lowered = factor > TARGET_FLOOR
        factor = max(TARGET_FLOOR, factor * TARGET_STEP)
    elif comfortable and comfortable % window_evaluations == 0 and factor < 1.0:
        factor = min(1.0, factor / TARGET_STEP)
    learned = learned.model_copy(update={"target_factor": factor})
    return round(original.target_average_value * factor, 3), learned, lowered
