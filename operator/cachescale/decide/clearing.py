"""What a clearing alert's Event says: that it cleared, and the reading that cleared it.

An alert clears after ``RECOVERY_EVALUATIONS`` quiet evaluations; its Event is written at
that moment, so it quotes this evaluation's reading (the cost within the budget, TTFT within
the SLO, the preemption share, the warm hit rate back near its baseline), never the
failure it quoted while it held. Where the reading is unknown, the Event says it no longer
holds and what it read when it last did (``fallback``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide import words
from cachescale.decide.checks import CollapseCheck
from cachescale.decide.follow_through import preemption_share
from cachescale.decide.thresholds import DEGRADED_CLEAR_SHARE, DEGRADED_HIT_DROP
from cachescale.snapshot import Snapshot

REBASELINED = "cleared: a rebaseline request accepted the current hit rate as the baseline"
"""What an alert measured against the learned hit rate says when a rebaseline clears it."""


def fallback(last_message: str) -> str:
    """A cleared alert whose reason has no reading to quote now."""
    return f"cleared: it no longer holds (it last read: {last_message})"


def cleared_words(
    reasons: Iterable[Diagnosis],
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    collapse: CollapseCheck,
) -> Mapping[Diagnosis, str]:
    """The clearing words for each of ``reasons`` this evaluation can explain."""
    said = {reason: _words(reason, spec, snapshot, collapse) for reason in reasons}
    return {reason: text for reason, text in said.items() if text is not None}


def _words(
    reason: Diagnosis, spec: CacheScalingPolicySpec, snapshot: Snapshot, collapse: CollapseCheck
) -> str | None:
    signals = snapshot.signals
    if reason is Diagnosis.OVER_BUDGET:
        cost = signals.gpu_seconds_per_1k_requests.value
        budget = spec.budget.gpu_seconds_per_1k_requests
        if cost is None or cost > budget:
            return None
        return (
            f"cleared: {words.cost(cost)} GPU-s per 1k requests, within the budget of "
            f"{words.cost(budget)}"
        )
    if reason is Diagnosis.SLO_AT_RISK:
        p95, slo = signals.ttft_p95_seconds, spec.slo.ttft_p95_seconds
        if p95.value is None or p95.lower_bound or p95.value > slo:
            return None
        return f"cleared: TTFT p95 {words.latency(p95)}, within the {words.seconds(slo)} SLO"
    if reason is Diagnosis.EVICTION_PRESSURE:
        share = preemption_share(snapshot)
        if share is None:
            return None
        return f"cleared: preemptions {share:.1%} of requests, no sustained eviction pressure"
    if reason is Diagnosis.CACHE_DEGRADED:
        warm, base = collapse.warm_hit_rate.value, collapse.baseline
        within = DEGRADED_HIT_DROP * DEGRADED_CLEAR_SHARE
        if warm is None or base is None or warm < base - within:
            return None
        return (
            f"cleared: warm-pod token hit rate {words.ratio(warm)}, back within "
            f"{words.ratio(within)} of its baseline {words.ratio(base)}"
        )
    return None
