"""Dilution: a lower hit rate that pods joining the fleet explain, not a degraded cache.

Each pod has its own prefix cache. When the fleet grows, every new pod computes each shared
prefix once more while its cache fills, and behind a router that spreads requests without
regard to their prefixes (round-robin, least-loaded) each of N pods sees 1/N of the
requests that share a prefix (a session's next turn lands on another pod N−1 times in N),
so even warm pods hit less than the smaller fleet did. The baseline was learned on that
smaller fleet; nothing is wrong with the prompts. ``CacheDiluted`` says so instead of
``CacheDegraded`` (``docs/decisions.md``, "CacheDiluted"), from what is measured:

- pods joined: some ready pods are younger than ``podWarmupSeconds`` plus
  ``DILUTION_WINDOWS`` metrics windows and some are older (a fleet whose pods all started
  together, or a rollout, is not growth: ``ColdFleet`` names it);
- the hit rate is lower: the warm-pod rate is in the degraded band (``in_band``), or,
  with joined pods still warming, the fleet's rate is more than ``DEGRADED_HIT_DROP``
  under the baseline;
- the joined pods explain it: the pods that served before them still hit within
  ``DEGRADED_HIT_DROP`` of the baseline (pooled, as the warm rate is), or demand grew at
  least ``DEMAND_GROWTH_FACTOR`` × the baseline's, so the pods joined for it and the old
  pods lost their share of each prefix's requests to them. When the old pods fell at a flat
  demand, the drop came first (a truncation whose dearer requests made the HPA scale out);
- the drop came with the pods: the warm rate's band streak began no earlier than the
  first of them became ready and before the last of them had been warm for a window. A
  drop that began before them (a scale-out the dearer requests caused) or after they
  settled (the grown fleet's own) stays ``CacheDegraded``'s;
- nothing else explains it (no collapse, no eviction pressure) and no ``CacheDegraded``
  alert is active (once raised, a scale-out does not clear it).

It is a finding only: no alert, no scaling change; ``CacheDegraded`` is not raised while
it holds. Its message quotes what a prefix-aware router would save at most: the hit rate
before the pods joined against now, and the recomputed prefill. Once the first joined
pod has been warm for a window (its windowed rate covers warm time only), the cache half of
the baseline (hit rate, prefill per request) is re-learned at the current values for the
grown fleet (``relearn_for_fleet``): the finding ends there, and a later fall on that
fleet is measured from the new baseline, so a real degradation stays detectable.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide import words
from cachescale.decide.checks import CollapseCheck, Finding
from cachescale.decide.degraded import in_band
from cachescale.decide.demand import ExtraCost, demand
from cachescale.decide.learned import LearnedState
from cachescale.decide.thresholds import (
    DEGRADED_HIT_DROP,
    DEMAND_GROWTH_FACTOR,
    DILUTION_WINDOWS,
)
from cachescale.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Joined:
    """The ready pods that joined the fleet recently, beside older ones."""

    pods: int
    ready: int
    oldest_age: float
    """Seconds since the first of them became ready."""
    youngest_age: float
    cold: int
    """Of them, those still younger than ``podWarmupSeconds``."""


def joined_pods(spec: CacheScalingPolicySpec, snapshot: Snapshot) -> Joined | None:
    """Ready pods younger than ``podWarmupSeconds`` + ``DILUTION_WINDOWS`` windows, when
    older pods served before them and no rollout runs (None otherwise)."""
    workload = snapshot.workload
    if workload.rollout_in_progress:
        return None
    ages = workload.pod_ages_seconds
    young = [age for age in ages if age < horizon(spec)]
    if not young or len(young) == len(ages):
        return None
    cold = sum(1 for age in young if age < spec.cache.pod_warmup_seconds)
    return Joined(len(young), len(ages), max(young), min(young), cold)


def horizon(spec: CacheScalingPolicySpec) -> float:
    """How recently a pod became ready for it to count as joined."""
    return spec.cache.pod_warmup_seconds + DILUTION_WINDOWS * spec.metrics.window_seconds


def settled(spec: CacheScalingPolicySpec, joined: Joined) -> bool:
    """The first joined pod has been warm for a window: its windowed rate covers warm
    time only, so the fleet's rate is the grown fleet's own. (Not the last one: a fleet
    the HPA keeps resizing always has a pod that joined minutes ago.)"""
    return joined.oldest_age >= spec.cache.pod_warmup_seconds + spec.metrics.window_seconds


@dataclass(frozen=True, slots=True)
class DilutionInputs:
    """What the check reads besides the spec, the snapshot and the learned state."""

    collapse: CollapseCheck
    explained: bool
    """A collapse or eviction pressure accounts for the drop."""
    streak: int
    """Evaluations in a row the warm rate has been in the degraded band (this one
    included)."""
    extra: ExtraCost | None
    """The evaluation's cost over the baseline (``diagnosis.over_baseline``)."""


def check_dilution(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, inputs: DilutionInputs
) -> Finding | None:
    """``CacheDiluted`` with its evidence, or None when it does not hold."""
    collapse = inputs.collapse
    baseline = collapse.baseline
    if baseline is None or inputs.explained:
        return None
    if learned.alert(Diagnosis.CACHE_DEGRADED) is not None:
        return None
    joined = joined_pods(spec, snapshot)
    if joined is None:
        return None
    if not _began_while_joining(spec, joined, inputs.streak):
        return None
    before = snapshot.signals.warm_token_hit_rate(horizon(spec)).value
    if before is None:
        return None  # nothing shows what the pods that served before hit
    if before < baseline - DEGRADED_HIT_DROP and not _demand_grew(snapshot, learned):
        return None  # they fell too, and no demand called the pods in: the drop came first
    warm = collapse.warm_hit_rate.value
    fleet = snapshot.signals.token_hit_rate_local.value
    if warm is not None and in_band(collapse):
        seen = f"warm-pod token hit rate {words.ratio(baseline)} → {words.ratio(warm)}"
        now = warm
    elif joined.cold and fleet is not None and fleet < baseline - DEGRADED_HIT_DROP:
        seen = f"fleet token hit rate {words.ratio(fleet)} against a warm-pod baseline of "
        seen += words.ratio(baseline)
        now = fleet
    else:
        return None
    evidence = _evidence(snapshot, learned, joined, seen, before, baseline - now, inputs.extra)
    return Finding(Diagnosis.CACHE_DILUTED, evidence + _relearn_words(spec, joined, now))


def _demand_grew(snapshot: Snapshot, learned: LearnedState) -> bool:
    """Demand is at least ``DEMAND_GROWTH_FACTOR`` × the baseline's: the pods joined for
    it (a scale-out that dearer requests caused comes at a flat demand)."""
    rps = demand(snapshot).per_second
    base = learned.baseline.requests_per_second
    return rps is not None and base is not None and rps >= DEMAND_GROWTH_FACTOR * base


def _began_while_joining(spec: CacheScalingPolicySpec, joined: Joined, streak: int) -> bool:
    """The warm rate's band streak (when there is one) began after the first joined pod
    became ready and before the last one settled: the pods joining explain it. A fall
    that began before them caused the scale-out or came with it; one that began after
    they settled is the grown fleet's own."""
    if streak == 0:
        return True
    began = (streak - 1) * spec.metrics.interval_seconds  # seconds ago (this one counts)
    settle = spec.cache.pod_warmup_seconds + spec.metrics.window_seconds
    return began <= joined.oldest_age and joined.youngest_age - began < settle


def _evidence(
    snapshot: Snapshot,
    learned: LearnedState,
    joined: Joined,
    seen: str,
    before: float,
    lost: float,
    extra: ExtraCost | None,
) -> str:
    minutes = joined.oldest_age / 60
    warming = f", {joined.cold} still warming" if joined.cold else ""
    text = (
        f"{seen} since {joined.pods} of {joined.ready} ready pods joined in the last "
        f"{minutes:.0f} min{warming} (the {joined.ready - joined.pods} that served before hit "
        f"{words.ratio(before)}): dilution, not a degraded cache (each pod's cache sees "
        "a smaller share of the requests that share a prefix)"
    )
    saving = f"up to {words.ratio(lost)} of the prompt tokens"
    prefill = snapshot.signals.prefill_tokens_per_request.value
    base = learned.baseline.prefill_tokens_per_request
    if prefill is not None and base is not None and prefill > base:
        saving += (
            f" and {words.tokens(prefill - base)} prefill tokens per request "
            f"({words.tokens(base)} → {words.tokens(prefill)})"
        )
    if extra is not None:
        saving += f"; {extra.words()}"
    text += (
        "; if the router spreads requests without regard to their prefixes (round-robin, "
        f"least-loaded), a prefix-aware router would save {saving}"
    )
    return text


def _relearn_words(spec: CacheScalingPolicySpec, joined: Joined, rate: float) -> str:
    """When the baseline follows the grown fleet: now (``relearn_for_fleet``), or later."""
    if settled(spec, joined):
        return (
            f"; the pods that joined first have been warm for a window: the hit-rate baseline is "
            f"re-learned at {words.ratio(rate)} for {joined.ready} pods (a later fall is "
            "measured from it)"
        )
    return (
        "; the hit-rate baseline is re-learned for the grown fleet once the pods that joined "
        "first have been warm for a window"
    )


def relearn_for_fleet(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: LearnedState,
    found: Set[Diagnosis],
    collapse: CollapseCheck,
) -> LearnedState:
    """The cache half of the baseline at the grown fleet's values, once ``CacheDiluted``
    holds on the warm rate (in the degraded band, not only the fleet's rate while pods
    warm) with the first joined pod settled; the memory unchanged otherwise. The degraded
    streak restarts with it: a later fall is measured from the new baseline."""
    joined = joined_pods(spec, snapshot)
    warm_hit_rate = collapse.warm_hit_rate.value
    if Diagnosis.CACHE_DILUTED not in found or joined is None or warm_hit_rate is None:
        return memory
    if not settled(spec, joined) or not in_band(collapse):
        return memory
    prefill = snapshot.signals.prefill_tokens_per_request.value
    update: dict[str, object] = {"token_hit_rate": warm_hit_rate}
    if prefill is not None:
        update["prefill_tokens_per_request"] = prefill
    return memory.model_copy(
        update={
            "baseline": memory.baseline.model_copy(update=update),
            "streaks": memory.streaks.model_copy(update={"degraded": 0}),
        }
    )
