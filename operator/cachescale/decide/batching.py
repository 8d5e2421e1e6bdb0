"""``--max-num-seqs``: keep the running batch under the cache-friendly ceiling B_max.

Running sequences and cached prefixes share one KV pool (``docs/decisions.md``,
"``--max-num-seqs``"), so a batch ceiling above ``B_max`` evicts reusable prefixes on
every admission. The rules, first match wins:

- lower toward ``B_max`` (never more than 25% per change) while eviction pressure has held
  for ``collapseWindows`` evaluations;
- keep lowering toward ``B_max`` while the SLO has been breached for ``collapseWindows``
  evaluations and the warm hit rate is depressed (under ``DEPRESSED_HIT_SHARE`` of its
  baseline), even once preemptions stop: the eviction they caused still costs the cache.
  Not during an active prefix collapse (the prompts emptied the cache, not the batch).
  While the SLO stays breached with the batch above (or an unknown) ``B_max`` and this
  does not fire, the message says why not;
- follow through (``decide.follow_through``): a cooldown after a lowering toward
  ``B_max``, take the next step while the batch is more than ``NEAR_B_MAX_SHARE`` of
  ``B_max`` and the last step paid (the warm hit rate under the new ceiling
  ``STEP_GAIN_POINTS`` above the one under the old, each a mean over warm evaluations, or
  preemptions fallen under the pressure level) without making requests more than
  ``STEP_COST_SHARE`` dearer, with neither eviction pressure nor an SLO breach needed:
  a ceiling above ``B_max`` evicts reusable prefixes whether or not it preempts. It stops
  within ``NEAR_B_MAX_SHARE`` of ``B_max`` and at a step that brought no gain; it waits
  while the SLO is at risk or a pod is warming, during a prefix collapse, and while the
  hit rate is low (the next rule's ground), and each message says which;
- raise toward throughput (25% per change, up to ``maxNumSeqs``) when the token hit rate
  has stayed under ``LOW_HIT_RATE`` for ``LOW_HIT_SECONDS`` and the batch is full or
  requests queue: a cache that does not hit is not worth protecting. Not past ``B_max``
  while the SLO rule holds, or the two would undo each other's changes; the follow-through
  never fires in a low-hit streak, and never after a raise;
- at most one change per ``cooldown`` (each change restarts pods and empties their
  caches), none during a rollout, and never outside ``minNumSeqs..maxNumSeqs``.

Every figure of B_max a message quotes is ``BatchFacts.ceiling``, the one value the
evaluation computed (``checks.batch_ceiling``) and decided with. A change is remembered
with the cache before it (``remember_change``), and the cache under the new ceiling is
averaged once its pods warmed (``follow_through.tally_step``); the EvictionPressure alert
reads what the ceiling did from ``eviction_words``, so an evaluation that lowers it never
says it did not. The evidence for these rules is ``docs/design/batching-ceiling.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.reasons import Action
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.ceiling_step import CeilingStep
from cachescale.decide.follow_through import (
    StepContext,
    judge_last_step,
    last_step,
    preemption_share,
)
from cachescale.decide.learned import LearnedState
from cachescale.decide.thresholds import (
    BATCH_NEAR_CEILING,
    DEPRESSED_HIT_SHARE,
    LOW_HIT_RATE,
    LOW_HIT_SECONDS,
    MAX_STEP,
    QUEUED_PER_POD,
)
from cachescale.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The ceiling decided: ``desired`` differs from the current one only on a change."""

    desired: int | None
    reason: Action | None
    message: str
    blocked: str | None = None
    """Why a wanted change did not happen (cooldown, rollout, unknown ceiling)."""


@dataclass(frozen=True, slots=True)
class BatchFacts:
    """What the diagnosis found that the ceiling depends on."""

    ceiling: int | None
    """B_max, when the model shape and context length are known."""
    eviction_sustained: bool
    collapse_active: bool
    slo_at_risk_sustained: bool
    """The SLO breached for ``collapseWindows`` evaluations in a row."""
    warm_hit_rate: float | None
    """The warm pods' token hit rate, when known."""
    baseline_hit_rate: float | None
    """Its learned baseline, when there is one."""
    warming: bool = False
    """A pod is younger than ``podWarmupSeconds`` or a rollout runs."""

    @property
    def cache_depressed(self) -> bool:
        """The warm hit rate under ``DEPRESSED_HIT_SHARE`` of its baseline (False when
        either is unknown)."""
        warm, base = self.warm_hit_rate, self.baseline_hit_rate
        return warm is not None and base is not None and warm < DEPRESSED_HIT_SHARE * base


def plan_max_num_seqs(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    now: datetime,
    facts: BatchFacts,
) -> BatchPlan:
    """Whether to change the engine's batch ceiling, and to what."""
    current = snapshot.workload.max_num_seqs
    batching = spec.batching
    if not batching.manage_max_num_seqs or current is None:
        return BatchPlan(current, None, "")
    wanted, reason, why = _wanted(spec, snapshot, learned, facts, current, now)
    if wanted == current or reason is None:
        return BatchPlan(current, None, why)
    blocked = _blocked(spec, snapshot, learned, now)
    if blocked:
        return BatchPlan(
            current, None, f"{why}; --max-num-seqs stays {current}: {blocked}", blocked
        )
    message = f"--max-num-seqs {current} → {wanted}: {why}"
    return BatchPlan(wanted, reason, message)


def _wanted(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    learned: LearnedState,
    facts: BatchFacts,
    current: int,
    now: datetime,
) -> tuple[int, Action | None, str]:
    low, high = spec.batching.min_num_seqs, spec.batching.max_num_seqs
    if not low <= current <= high:
        bounded = max(low, min(high, current))
        return bounded, Action.CLAMPED_MAX_NUM_SEQS, f"outside the policy's {low}..{high}"
    if facts.eviction_sustained:
        if facts.ceiling is None:
            return current, None, "eviction pressure, but B_max is unknown (no context length)"
        if current <= facts.ceiling:
            return (
                current,
                None,
                f"eviction pressure although the ceiling is at B_max {facts.ceiling}",
            )
        return (
            _toward(facts.ceiling, current, low),
            Action.LOWERED_MAX_NUM_SEQS,
            (
                f"sustained eviction pressure with the batch above the cache-friendly ceiling "
                f"B_max {facts.ceiling}"
            ),
        )
    for_slo, slo_why = _for_the_slo(learned, facts, current, low)
    if for_slo is not None:
        return for_slo, Action.LOWERED_MAX_NUM_SEQS, slo_why
    cooled = spec.batching.cooldown_seconds
    onward, onward_why = _follow_through(learned, facts, current, low, now, cooled)
    if onward is not None:
        return onward, Action.LOWERED_MAX_NUM_SEQS, onward_why
    slo_why = "; ".join(w for w in (slo_why, onward_why) if w)
    evaluations = math.ceil(LOW_HIT_SECONDS / spec.metrics.interval_seconds)
    if (
        learned.streaks.low_hit >= evaluations
        and not facts.collapse_active
        and _busy(snapshot, current)
    ):
        return _raised(facts, current, high)
    return current, None, slo_why


def _raised(facts: BatchFacts, current: int, high: int) -> tuple[int, Action | None, str]:
    """A step up for throughput, stopped at B_max while the SLO rule would lower anything
    above it again (the two must not undo each other's changes)."""
    low_hit = f"token hit rate under {LOW_HIT_RATE:.2f} for {LOW_HIT_SECONDS / 60:.0f} min"
    wanted = min(high, math.floor(current * (1 + MAX_STEP)))
    ceiling = facts.ceiling
    if ceiling is None or not (facts.slo_at_risk_sustained and facts.cache_depressed):
        return (
            wanted,
            Action.RAISED_MAX_NUM_SEQS,
            f"{low_hit}: nothing to protect, so the batch buys throughput",
        )
    depressed = "the SLO at risk and the warm hit rate under its baseline"
    if min(wanted, ceiling) <= current:
        return (
            current,
            None,
            f"{low_hit}, but --max-num-seqs stays {current}, within B_max {ceiling}, "
            f"with {depressed}",
        )
    return (
        min(wanted, ceiling),
        Action.RAISED_MAX_NUM_SEQS,
        f"{low_hit}: the batch buys throughput up to B_max {ceiling}, with {depressed}",
    )


def _toward(ceiling: int, current: int, low: int) -> int:
    """One step down toward ``ceiling``: at most ``MAX_STEP`` of ``current``, never below
    ``ceiling`` or ``minNumSeqs``."""
    return max(low, ceiling, math.ceil(current * (1 - MAX_STEP)))


def _for_the_slo(
    learned: LearnedState, facts: BatchFacts, current: int, low: int
) -> tuple[int | None, str]:
    """The SLO rule: ``(step, why)`` toward B_max while the SLO stays breached and the
    warm hit rate is depressed, else ``(None, why not)``. The why not is empty when there
    is nothing to say: no sustained breach, or the batch already within a known B_max."""
    ceiling = facts.ceiling
    if not facts.slo_at_risk_sustained or (ceiling is not None and current <= ceiling):
        return None, ""
    breach = f"SLO at risk for {learned.streaks.slo_breach} evaluations"
    if ceiling is not None:
        breach += f" with the batch above the cache-friendly ceiling B_max {ceiling}"
    warm, base = facts.warm_hit_rate, facts.baseline_hit_rate
    if facts.collapse_active:
        why = "a prefix collapse is active: the prompts emptied the cache, not the batch"
    elif warm is None:
        why = "the warm pods' hit rate is unknown"
    elif base is None:
        why = "no hit-rate baseline learned yet to call the cache depressed"
    elif not facts.cache_depressed:
        why = (
            f"the warm hit rate {warm:.2f} is within {1 - DEPRESSED_HIT_SHARE:.0%} of its "
            f"baseline {base:.2f}, so the batch is not what costs the cache"
        )
    elif ceiling is None:
        why = "B_max is unknown (no context length)"
    else:
        return (
            _toward(ceiling, current, low),
            f"{breach} and the warm hit rate {warm:.2f} under its baseline {base:.2f}",
        )
    return None, f"{breach}; --max-num-seqs stays {current}: {why}"


def _follow_through(
    learned: LearnedState,
    facts: BatchFacts,
    current: int,
    low: int,
    now: datetime,
    cooldown: float,
) -> tuple[int | None, str]:
    """The follow-through rule (``decide.follow_through``): ``(step, why)`` toward B_max
    once the last lowering paid, else ``(None, why not)``."""
    paid, why = judge_last_step(
        learned,
        current,
        now,
        cooldown,
        StepContext(
            facts.ceiling, facts.collapse_active, facts.slo_at_risk_sustained, facts.warming
        ),
    )
    if not paid or facts.ceiling is None:
        return None, why
    return _toward(facts.ceiling, current, low), why


def remember_change(
    learned: LearnedState,
    snapshot: Snapshot,
    facts: BatchFacts,
    batch: BatchPlan,
    now: datetime,
) -> LearnedState:
    """The memory after this evaluation's ceiling change (unchanged without one): its time
    for the cooldown, and the step with the cache under the old ceiling (the last step's
    means when it has them, else this evaluation's reading), for the follow-through rule to
    judge a cooldown later."""
    current = snapshot.workload.max_num_seqs
    if batch.reason is None or batch.desired is None or current is None:
        return learned
    last = last_step(learned)
    hit, share = facts.warm_hit_rate, preemption_share(snapshot)
    cost = snapshot.signals.gpu_seconds_per_1k_requests.value
    if last is not None and last.hit_rate_since.samples:
        hit, share = last.hit_rate_since.value, last.preemptions_since.value
        cost = last.cost_since.value
    step = CeilingStep(
        at=now,
        before=current,
        after=batch.desired,
        reason=batch.reason,
        warm_hit_rate=hit,
        preemption_share=share,
        cost=cost,
    )
    return learned.model_copy(
        update={"last_max_num_seqs_change_at": now, "last_max_num_seqs_step": step}
    )


def eviction_words(batch: BatchPlan) -> str:
    """What the EvictionPressure alert says the ceiling did this evaluation: the change it
    made, or why none."""
    if batch.reason is not None:
        return batch.message
    why = batch.blocked or batch.message or "--max-num-seqs is not managed by this policy"
    return f"ceiling not lowered now: {why}"


def _busy(snapshot: Snapshot, current: int) -> bool:
    """Requests queue, or the batch is nearly full: a larger batch would be used."""
    signals = snapshot.signals
    waiting = signals.waiting_requests_per_pod.value
    running = signals.running_requests_per_pod.value
    return (waiting is not None and waiting >= QUEUED_PER_POD) or (
        running is not None and running >= BATCH_NEAR_CEILING * current
    )


def _blocked(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState, now: datetime
) -> str | None:
    last = learned.last_max_num_seqs_change_at
    cooldown = spec.batching.cooldown_seconds
    if last is not None and (now - last).total_seconds() < cooldown:
        elapsed = (now - last).total_seconds()
        step = last_step(learned)
        change = f" ({step.before} → {step.after})" if step is not None else ""
        ago = f"{elapsed / 60:.0f} min ago" if elapsed >= 60 else "under a minute ago"
        return (
            f"cooldown: the last change{change} was {ago}; "
            f"next possible in {(cooldown - elapsed) / 60:.0f} min"
        )
    if snapshot.workload.rollout_in_progress:
        return "a rollout is in progress"
    return None
