"""A degraded cache: a hit-rate fall too small to be a collapse, too dear to go unnamed.

A context-truncation change (a sliding history window) or a prompt tweak can take the
warm-pod hit rate from 0.84 to 0.56: above the collapse threshold, so ``PrefixCollapse``
never fires, yet every request recomputes more of its prompt and the fleet pays for it.
``CacheDegraded`` names it with what it costs (``docs/decisions.md``, "CacheDegraded"):

- the warm-pod token hit rate (cold pods miss by nature and never count) is more than
  ``DEGRADED_HIT_DROP`` under its baseline and not under the collapse threshold, for
  ``degraded_evaluations`` evaluations in a row: at least ``collapseWindows``, and more
  than one metrics window, so a collapse whose windowed rate is still falling through the
  band is never named degraded on the way down;
- it is material (``_material``): the cost over the baseline (``demand.extra_cost``) is
  at least ``DEGRADED_COST_SHARE`` of the baseline GPU-s per 1k requests, or prefill per
  request is at least ``DEARER_PREFILL_FACTOR`` × its baseline (recomputed prompts a fleet
  with headroom absorbs before its windowed cost shows them);
- nothing else explains it: no collapse, no eviction pressure, and no dilution (pods that
  joined the fleet explain the drop: ``CacheDiluted``, ``dilution.py``); and it is raised
  only while no pod is cold and no rollout runs (both move the cost on their own).

Once raised it stays while the rate is more than half the drop under the baseline,
whether or not pods are warming (a scale-out the extra cost caused must not clear it).
It is a finding and an alert only: it never changes scaling (the envelope and the batch
ceiling read none of it). The evidence for the thresholds is ``docs/design/degraded-cache.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide import words
from cachescale.decide.checks import CollapseCheck, Finding, prefill_grew
from cachescale.decide.demand import ExtraCost
from cachescale.decide.learned import LearnedState
from cachescale.decide.thresholds import (
    DEARER_PREFILL_FACTOR,
    DEGRADED_CLEAR_SHARE,
    DEGRADED_COST_SHARE,
    DEGRADED_HIT_DROP,
)
from cachescale.snapshot import Snapshot

DEGRADED_ACTION = (
    "scaling is unchanged (a finding, not a hold or a cap: the HPA scales on its own "
    "metric inside the envelope)"
)
"""What the alert says cachescale does about it: nothing to the fleet."""


def in_band(collapse: CollapseCheck, drop: float = DEGRADED_HIT_DROP) -> bool:
    """The warm rate more than ``drop`` under its baseline, at or above the collapse
    threshold (False when anything is unknown)."""
    warm = collapse.warm_hit_rate.value
    if warm is None or collapse.baseline is None or collapse.threshold is None:
        return False
    return collapse.threshold <= warm < collapse.baseline - drop


def degraded_evaluations(spec: CacheScalingPolicySpec) -> int:
    """Evaluations the drop must hold: ``collapseWindows``, and more than one metrics
    window (a windowed rate falling to a collapse crosses the band within one window)."""
    per_window = math.floor(spec.metrics.window_seconds / spec.metrics.interval_seconds)
    return max(spec.cache.collapse_windows, per_window + 1)


@dataclass(frozen=True, slots=True)
class DegradedInputs:
    """What the check reads besides the spec, the snapshot and the learned state."""

    collapse: CollapseCheck
    explained: bool
    """A collapse, eviction pressure or dilution accounts for the drop."""
    cold: bool
    """A pod is warming up or a rollout runs: no new raise."""
    streak: int
    """Evaluations in a row the warm rate has been in the band (this one included)."""
    extra: ExtraCost | None
    """The evaluation's cost over the baseline (``diagnosis.over_baseline``)."""


def check_degraded(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, inputs: DegradedInputs
) -> Finding | None:
    """``CacheDegraded`` with its evidence, or None when it does not hold."""
    collapse = inputs.collapse
    if collapse.warm_hit_rate.value is None or collapse.baseline is None or inputs.explained:
        return None
    extra = inputs.extra
    if learned.alert(Diagnosis.CACHE_DEGRADED) is not None:
        holds = in_band(collapse, DEGRADED_HIT_DROP * DEGRADED_CLEAR_SHARE)
    else:
        holds = (
            not inputs.cold
            and inputs.streak >= degraded_evaluations(spec)
            and _material(snapshot, learned, extra)
        )
    if not holds:
        return None
    return Finding(Diagnosis.CACHE_DEGRADED, _evidence(collapse, snapshot, learned, inputs, extra))


def _material(snapshot: Snapshot, learned: LearnedState, extra: ExtraCost | None) -> bool:
    """Worth a page: the cost over the baseline is at least ``DEGRADED_COST_SHARE`` of it,
    or each request prefills ``DEARER_PREFILL_FACTOR`` × the baseline's tokens. The second
    counts on its own because a fleet with headroom (or decode-heavy requests) absorbs
    recomputed prompts for a while before the windowed GPU-s/1k shows them."""
    base_cost = learned.baseline.gpu_seconds_per_1k_requests
    if (
        extra is not None
        and base_cost is not None
        and extra.gpu_seconds_per_1k >= DEGRADED_COST_SHARE * base_cost
    ):
        return True
    return prefill_grew(snapshot, learned.baseline, DEARER_PREFILL_FACTOR)


def _evidence(
    collapse: CollapseCheck,
    snapshot: Snapshot,
    learned: LearnedState,
    inputs: DegradedInputs,
    extra: ExtraCost | None,
) -> str:
    assert collapse.warm_hit_rate.value is not None
    assert collapse.baseline is not None
    assert collapse.threshold is not None
    span = f" over {inputs.streak} evaluations" if inputs.streak else ""
    text = (
        f"warm-pod token hit rate {words.ratio(collapse.baseline)} → "
        f"{words.ratio(collapse.warm_hit_rate.value)}{span} on {collapse.warm_pods} warm pods, "
        f"above the collapse threshold {words.ratio(collapse.threshold)}"
    )
    prefill = snapshot.signals.prefill_tokens_per_request.value
    base = learned.baseline.prefill_tokens_per_request
    if prefill is not None and base is not None:
        more = prefill - base
        sign = "+" if more >= 0 else "−"
        text += (
            f"; prefill tokens per request {words.tokens(base)} → {words.tokens(prefill)} "
            f"({sign}{words.tokens(abs(more))})"
        )
    return f"{text}; {_cost_words(snapshot, learned, extra)}"


def _cost_words(snapshot: Snapshot, learned: LearnedState, extra: ExtraCost | None) -> str:
    """What it costs: the extra GPU-s/1k and GPU-hours per day, or that the windowed cost
    does not show it (yet)."""
    if extra is not None:
        return extra.words()
    cost = snapshot.signals.gpu_seconds_per_1k_requests.value
    base = learned.baseline.gpu_seconds_per_1k_requests
    if cost is None or base is None:
        return "its GPU-s per 1k requests are unknown (no baseline cost or no cost now)"
    return (
        f"GPU-s per 1k requests {words.cost(cost)} against the baseline's {words.cost(base)}: "
        "the recomputed prefill does not show in the cost yet (the fleet absorbs it)"
    )


def degraded_cause(snapshot: Snapshot, learned: LearnedState) -> str:
    """What to check, named from the evidence (more prefill per request: the prompts)."""
    if prefill_grew(snapshot, learned.baseline, DEARER_PREFILL_FACTOR):
        return (
            "requests recompute more of each prompt: check recent changes to history "
            "truncation or context windows, prompt templates and retrieval (anything that "
            "rewrites text an earlier request already sent)"
        )
    return (
        "the cache keeps or finds less of what requests share without more prefill per "
        "request: check routing, cache_salt settings and the KV cache's size"
    )
