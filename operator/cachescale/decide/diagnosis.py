"""The diagnosis of one evaluation: measure the signals against the policy, then name findings.

Two stages. ``run_checks`` measures once — the collapse and eviction checks
(``checks.py``), the SLO, the budget, the cold pods — into ``CheckResults``;
``next_streaks`` counts how long each symptom has held. Then ``CHECKS``, an ordered chain
of named checks (the shape of cert-manager's certificate policy chain), each reading the
same ``Facts`` and returning a ``Finding`` or None. ``findings`` runs the chain, falls
back to ``Healthy`` when nothing was found, and orders the result by ``PRECEDENCE``. A
new diagnosis is one more check in the chain, one member in
``cachescale.api.reasons.Diagnosis`` and a section in ``docs/decisions.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide import words
from cachescale.decide.checks import (
    PRECEDENCE,
    CollapseCheck,
    EvictionCheck,
    Finding,
    batch_ceiling,
    budget_replicas,
    check_collapse,
    check_eviction,
    collapse_evidence,
    prefill_grew,
)
from cachescale.decide.degraded import DegradedInputs, check_degraded, in_band
from cachescale.decide.demand import ExtraCost, demand, extra_cost
from cachescale.decide.dilution import DilutionInputs, check_dilution
from cachescale.decide.healing import trend_words
from cachescale.decide.learned import LearnedState, Streaks
from cachescale.decide.thresholds import (
    COST_STEADY_FACTOR,
    DEARER_PREFILL_FACTOR,
    DEMAND_GROWTH_FACTOR,
    LOW_HIT_RATE,
    RECOVERY_EVALUATIONS,
    SLO_COMFORTABLE_SHARE,
)
from cachescale.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class CheckResults:
    """The signals measured against the policy, once per evaluation."""

    collapse: CollapseCheck
    eviction: EvictionCheck
    ceiling: int | None
    """B_max, when known."""
    budget_max: int | None
    """Most replicas the budget allows now."""
    slo_breach: bool
    slo_comfortable: bool
    over_budget: bool
    cold_pods: int
    requests_got_dearer: bool = False
    """Each request costs more than it did (``_requests_got_dearer``)."""


def run_checks(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState
) -> CheckResults:
    """Measure this evaluation's signals against the policy and the learned baseline."""
    signals = snapshot.signals
    ceiling = batch_ceiling(spec, snapshot)
    p95 = signals.ttft_p95_seconds.value
    p99 = signals.ttft_p99_seconds.value
    # A quantile past the histogram's last bucket (a lower bound) counts as above the SLO.
    breach = p95 is not None and (
        p95 > spec.slo.ttft_p95_seconds or signals.ttft_p95_seconds.lower_bound
    )
    if spec.slo.ttft_p99_seconds is not None and p99 is not None:
        breach = breach or p99 > spec.slo.ttft_p99_seconds or signals.ttft_p99_seconds.lower_bound
    cost = signals.gpu_seconds_per_1k_requests.value
    warmup = float(spec.cache.pod_warmup_seconds)
    ages = snapshot.workload.pod_ages_seconds
    collapse = check_collapse(spec, snapshot, learned)
    eviction = check_eviction(snapshot, ceiling)
    dearer = _requests_got_dearer(collapse, eviction, snapshot, learned)
    return CheckResults(
        collapse=collapse,
        eviction=eviction,
        ceiling=ceiling,
        budget_max=budget_replicas(spec, snapshot, dearer),
        slo_breach=breach,
        slo_comfortable=p95 is not None
        and not signals.ttft_p95_seconds.lower_bound
        and p95 < SLO_COMFORTABLE_SHARE * spec.slo.ttft_p95_seconds,
        over_budget=cost is not None and cost > spec.budget.gpu_seconds_per_1k_requests,
        cold_pods=sum(1 for age in ages if age < warmup),
        requests_got_dearer=dearer,
    )


def _requests_got_dearer(
    collapse: CollapseCheck, eviction: EvictionCheck, snapshot: Snapshot, learned: LearnedState
) -> bool:
    """Evidence that each request costs more than it did (so a queue is not demand): the
    warm hit rate under its clearing threshold (unless eviction explains it: then more
    replicas help), or prefill per request well above its baseline. The windowed cost
    lags both by most of a window."""
    cache_down = collapse.clear_threshold is not None and collapse.warm_hit_rate.is_known
    cache_down = cache_down and not collapse.recovered and not eviction.held
    return cache_down or prefill_grew(snapshot, learned.baseline, DEARER_PREFILL_FACTOR)


def next_streaks(results: CheckResults, snapshot: Snapshot, streaks: Streaks) -> Streaks:
    """Each symptom's streak after this evaluation: one longer if it held, else 0."""

    def count(held: bool, old: int) -> int:
        return old + 1 if held else 0

    warm_known = results.collapse.warm_hit_rate.is_known
    # Warm pods when known (cold ones miss by nature), else the fleet.
    hit = results.collapse.warm_hit_rate.value
    if hit is None:
        hit = snapshot.signals.token_hit_rate_local.value
    collapsing = results.collapse.below and not results.eviction.held
    degraded = in_band(results.collapse) and not results.eviction.held
    return Streaks(
        collapse=count(collapsing, streaks.collapse) if warm_known else streaks.collapse,
        recovered=count(results.collapse.recovered, streaks.recovered)
        if warm_known
        else streaks.recovered,
        eviction=count(results.eviction.held, streaks.eviction),
        degraded=count(degraded, streaks.degraded) if warm_known else streaks.degraded,
        low_hit=count(hit is not None and hit < LOW_HIT_RATE, streaks.low_hit),
        slo_breach=count(results.slo_breach, streaks.slo_breach),
        slo_comfortable=count(results.slo_comfortable, streaks.slo_comfortable),
        over_budget=count(results.over_budget, streaks.over_budget),
    )


def collapse_active(learned: LearnedState, spec: CacheScalingPolicySpec) -> bool:
    """Confirmed now, or confirmed earlier and not yet recovered (never without a
    baseline: a rebaseline ends it)."""
    if learned.baseline.token_hit_rate is None:
        return False
    if learned.streaks.collapse >= spec.cache.collapse_windows:
        return True
    alert = learned.alert(Diagnosis.PREFIX_COLLAPSE)
    return alert is not None and learned.streaks.recovered < RECOVERY_EVALUATIONS


# --- the chain ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Facts:
    """What every check in the chain reads."""

    spec: CacheScalingPolicySpec
    snapshot: Snapshot
    learned: LearnedState
    """With this evaluation's streaks when it is a full evaluation."""
    results: CheckResults
    collapse_active: bool
    extra: ExtraCost | None
    """The cost over the baseline as received (``over_baseline``): the one every message of
    this evaluation quotes and the decision records."""


def over_baseline(snapshot: Snapshot, learned: LearnedState) -> ExtraCost | None:
    """The cost over the baseline the memory held when the evaluation began. Computed once
    per evaluation, before learning moves the baseline, so a finding, an alert message and
    ``Decision.extra_cost`` never disagree about it."""
    return extra_cost(
        snapshot.signals.gpu_seconds_per_1k_requests.value,
        learned.baseline.gpu_seconds_per_1k_requests,
        demand(snapshot),
    )


def facts_of(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, results: CheckResults
) -> Facts:
    """The facts of one evaluation, read from the memory as received."""
    return Facts(
        spec,
        snapshot,
        learned,
        results,
        collapse_active(learned, spec),
        over_baseline(snapshot, learned),
    )


Check = Callable[[Facts], Finding | None]
"""One named check: a finding from the facts, or None when its diagnosis does not hold."""


def _prefix_collapse(facts: Facts) -> Finding | None:
    if not facts.collapse_active:
        return None
    collapse, learned = facts.results.collapse, facts.learned
    warm = collapse.warm_hit_rate.value
    if warm is None or collapse.baseline is None:
        evidence = "collapse confirmed earlier; the warm-pod hit rate is not measurable now"
        return Finding(Diagnosis.PREFIX_COLLAPSE, evidence)
    evidence = collapse_evidence(collapse, facts.snapshot, learned, learned.streaks.collapse)
    trend = trend_words(learned.collapse_evidence, warm)
    return Finding(Diagnosis.PREFIX_COLLAPSE, f"{evidence}; {trend}" if trend else evidence)


def _eviction_pressure(facts: Facts) -> Finding | None:
    eviction = facts.results.eviction
    if facts.learned.streaks.eviction >= 1 and eviction.held:
        return Finding(Diagnosis.EVICTION_PRESSURE, eviction.evidence)
    return None


def _cache_degraded(facts: Facts) -> Finding | None:
    results = facts.results
    inputs = DegradedInputs(
        collapse=results.collapse,
        explained=facts.collapse_active
        or results.eviction.held
        or _cache_diluted(facts) is not None,
        cold=bool(results.cold_pods) or facts.snapshot.workload.rollout_in_progress,
        streak=facts.learned.streaks.degraded,
        extra=facts.extra,
    )
    return check_degraded(facts.spec, facts.snapshot, facts.learned, inputs)


def _cache_diluted(facts: Facts) -> Finding | None:
    results = facts.results
    inputs = DilutionInputs(
        collapse=results.collapse,
        explained=facts.collapse_active or results.eviction.held,
        streak=facts.learned.streaks.degraded,
        extra=facts.extra,
    )
    return check_dilution(facts.spec, facts.snapshot, facts.learned, inputs)


def _slo_at_risk(facts: Facts) -> Finding | None:
    p95 = facts.snapshot.signals.ttft_p95_seconds
    if not facts.results.slo_breach or not p95.is_known:
        return None
    return Finding(
        Diagnosis.SLO_AT_RISK,
        f"TTFT p95 {words.latency(p95)} above the "
        f"{words.seconds(facts.spec.slo.ttft_p95_seconds)} SLO",
    )


def _over_budget(facts: Facts) -> Finding | None:
    cost = facts.snapshot.signals.gpu_seconds_per_1k_requests.value
    if not facts.results.over_budget or cost is None:
        return None
    return Finding(
        Diagnosis.OVER_BUDGET,
        f"{words.cost(cost)} GPU-s per 1k requests against a budget of "
        f"{words.cost(facts.spec.budget.gpu_seconds_per_1k_requests)}",
    )


def _cold_fleet(facts: Facts) -> Finding | None:
    if not facts.results.cold_pods and not facts.snapshot.workload.rollout_in_progress:
        return None
    return Finding(Diagnosis.COLD_FLEET, _cold_evidence(facts))


def _cold_evidence(facts: Facts) -> str:
    workload = facts.snapshot.workload
    text = (
        f"{facts.results.cold_pods} of {workload.ready_replicas} ready pods younger than "
        f"{facts.spec.cache.pod_warmup_seconds} s (caches still filling)"
    )
    if workload.rollout_in_progress:
        text += " during a rollout"
    warm = facts.results.collapse.warm_hit_rate.value
    if warm is not None:
        text += f"; warm pods hit {words.ratio(warm)}"
    return text + "; expected, not a collapse"


def _demand_growth(facts: Facts) -> Finding | None:
    baseline = facts.learned.baseline
    need = demand(facts.snapshot)
    rps = need.per_second
    cost = facts.snapshot.signals.gpu_seconds_per_1k_requests.value
    if rps is None or baseline.requests_per_second is None:
        return None
    if rps < DEMAND_GROWTH_FACTOR * baseline.requests_per_second:
        return None
    base_cost = baseline.gpu_seconds_per_1k_requests
    if cost is not None and base_cost is not None and cost > COST_STEADY_FACTOR * base_cost:
        return None
    return Finding(
        Diagnosis.DEMAND_GROWTH,
        f"req/s {words.rate(baseline.requests_per_second)} → {need.rate()} with the cost "
        "per request steady: the HPA scales for it, inside the budget",
    )


CHECKS: tuple[Check, ...] = (
    # A collapse confirmed for collapseWindows evaluations, or alerted and not recovered.
    _prefix_collapse,
    # Preemptions or a full KV pool with the running batch near its ceiling.
    _eviction_pressure,
    # The warm hit rate held well under its baseline, above the collapse threshold, at a
    # material cost (decide/degraded.py).
    _cache_degraded,
    # TTFT p95 (or p99, when the policy sets one) above the SLO.
    _slo_at_risk,
    # GPU-seconds per 1k requests above the budget.
    _over_budget,
    # Pods that joined the fleet explain a lower hit rate (decide/dilution.py).
    _cache_diluted,
    # Pods younger than podWarmupSeconds, or a rollout: misses are expected.
    _cold_fleet,
    # Requests up DEMAND_GROWTH_FACTOR over baseline at a steady cost per request.
    _demand_growth,
)
"""Every check, in the order they run (``PRECEDENCE`` orders what they find)."""


def findings(facts: Facts) -> tuple[Finding, ...]:
    """Run every check; ``Healthy`` when none finds anything; ordered by ``PRECEDENCE``."""
    found = [finding for check in CHECKS if (finding := check(facts)) is not None]
    if not found:
        found.append(Finding(Diagnosis.HEALTHY, _healthy_evidence(facts)))
    return tuple(sorted(found, key=lambda f: PRECEDENCE.index(f.diagnosis)))


def _healthy_evidence(facts: Facts) -> str:
    parts = []
    collapse = facts.results.collapse
    warm = collapse.warm_hit_rate.value
    if warm is not None:
        parts.append(f"warm-pod token hit rate {words.ratio(warm)}")
    if collapse.baseline is not None:
        parts.append(f"baseline {words.ratio(collapse.baseline)}")
    else:
        parts.append("baseline still being learned")
    p95 = facts.snapshot.signals.ttft_p95_seconds
    if p95.is_known:
        parts.append(f"TTFT p95 {words.latency(p95)}")
    return ", ".join(parts)
