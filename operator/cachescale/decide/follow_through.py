"""The ceiling's follow-through: after a lowering toward B_max, the next step while each pays.

Eviction pressure lowers ``--max-num-seqs`` one step and stops once the smaller batch
stops preempting; the SLO rule waits for a hit rate under its baseline, which a baseline
learned under a too-high ceiling never shows. Either can leave the ceiling far above
B_max, where every admission still evicts reusable prefixes. So a whole cooldown after a
lowering the step is judged, and followed by the next one when it paid:

- the warm hit rate under the new ceiling, averaged over the evaluations since its pods
  warmed (``tally_step``), at least ``STEP_GAIN_POINTS`` above the same mean under the
  old ceiling; or preemptions per request fallen under the pressure level from at or
  above it; and in either case GPU-seconds per 1k requests (the same means) not more than
  ``STEP_COST_SHARE`` above the old ceiling's;
- it stops, and says why, within ``NEAR_B_MAX_SHARE`` of B_max, at a step that brought no
  gain; it waits while the SLO is at risk or a pod is still warming (a step restarts
  every pod, taking capacity a breach needs and caches that are still filling: the SLO
  rule alone may lower then);
- it judges nothing within the cooldown (the restarted pods' caches are still filling),
  after a raise or a clamp, off the ceiling it stepped to, with B_max unknown, during a
  prefix collapse, or in a low-hit streak (the raise rule's ground, so the two cannot undo
  each other).

The step and both means live in ``LearnedState.last_max_num_seqs_step``, written by
``batching.remember_change``, and are read only while the step is the last change recorded.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import NamedTuple

from cachescale.api.reasons import Action
from cachescale.decide import words
from cachescale.decide.ceiling_step import CeilingStep
from cachescale.decide.learned import LearnedState
from cachescale.decide.thresholds import (
    NEAR_B_MAX_SHARE,
    PREEMPTIONS_PER_REQUEST_PRESSURE,
    STEP_COST_SHARE,
    STEP_GAIN_POINTS,
)
from cachescale.snapshot import Snapshot


class StepContext(NamedTuple):
    """What this evaluation knows that the judgement reads."""

    ceiling: int | None
    """B_max, when known."""
    collapse_active: bool
    slo_at_risk: bool
    """The SLO breached for ``collapseWindows`` evaluations in a row."""
    warming: bool
    """A pod is younger than ``podWarmupSeconds`` or a rollout runs."""


def judge_last_step(
    learned: LearnedState, current: int, now: datetime, cooldown: float, context: StepContext
) -> tuple[bool, str]:
    """``(True, why)`` when the next step toward B_max is due, else ``(False, why not)``.
    The why not is empty when there is no lowering to judge or nothing worth saying (see
    the module docstring)."""
    step = last_step(learned)
    ceiling = context.ceiling
    if (
        step is None
        or step.reason is not Action.LOWERED_MAX_NUM_SEQS
        or step.after != current
        or (now - step.at).total_seconds() < cooldown
        or ceiling is None
        or context.collapse_active
        or learned.streaks.low_hit
    ):
        return False, ""
    last = f"the last step ({step.before} → {step.after})"
    if current <= NEAR_B_MAX_SHARE * ceiling:
        return False, (
            f"--max-num-seqs {current} is within {NEAR_B_MAX_SHARE - 1:.0%} of B_max {ceiling}: "
            "no further step"
        )
    stays = f"--max-num-seqs stays {current}, above B_max {ceiling}"
    if context.slo_at_risk:
        return False, f"{stays}: the SLO is at risk, and a step restarts pods the breach needs"
    if context.warming:
        return False, f"{stays}: pods are still warming, and a step restarts every pod"
    gain, measured = _gain(step)
    if not gain:
        return False, f"{stays}: {last} brought no gain ({measured})"
    return True, (
        f"{last} paid ({measured}) and the batch is still above the cache-friendly ceiling "
        f"B_max {ceiling}"
    )


def _gain(step: CeilingStep) -> tuple[bool, str]:
    """Whether the last step paid, and the figures that say so: never when requests cost
    more than ``STEP_COST_SHARE`` over what they did under the old ceiling."""
    cost, cost_before = step.cost_since.value, step.cost
    if cost is not None and cost_before is not None and cost > cost_before * (1 + STEP_COST_SHARE):
        return False, (
            f"GPU-s per 1k requests {words.cost(cost_before)} → {words.cost(cost)}: the smaller "
            "batch costs more than the cache saves"
        )
    warm, before = step.hit_rate_since.value, step.warm_hit_rate
    share, share_before = step.preemptions_since.value, step.preemption_share
    pressure = PREEMPTIONS_PER_REQUEST_PRESSURE
    if share is not None and share_before is not None and share_before >= pressure > share:
        return True, f"preemptions {share_before:.1%} → {share:.1%} of requests"
    if warm is None or before is None:
        return False, "the warm hit rate before or since it is unknown"
    rate = f"the warm hit rate {before:.2f} → {warm:.2f}"
    if warm >= before + STEP_GAIN_POINTS:
        return True, rate
    return False, f"{rate}, less than the {STEP_GAIN_POINTS:.2f} points a gain needs"


def preemption_share(snapshot: Snapshot) -> float | None:
    """Preemptions per finished request, when both rates are known and the share is a
    number (requests finish, at a rate whose inverse does not overflow)."""
    preemptions = snapshot.signals.preemptions_per_second.value
    rps = snapshot.signals.requests_per_second.value
    if preemptions is None or rps is None or rps <= 0:
        return None
    share = preemptions / rps
    return share if math.isfinite(share) else None


def last_step(learned: LearnedState) -> CeilingStep | None:
    """The remembered step, when it is the last change (not one the status lost)."""
    step = learned.last_max_num_seqs_step
    if step is None or step.at != learned.last_max_num_seqs_change_at:
        return None
    return step


def tally_step(
    learned: LearnedState,
    snapshot: Snapshot,
    warm_hit_rate: float | None,
    now: datetime,
    warmup_seconds: float,
) -> LearnedState:
    """Fold this evaluation's cache into the last step's means, once the fleet runs its
    ceiling with every pod restarted at least ``warmup_seconds`` ago (no rollout): before
    that the caches are still filling and say nothing of the ceiling."""
    step = last_step(learned)
    if (
        step is None
        or snapshot.workload.max_num_seqs != step.after
        or snapshot.workload.rollout_in_progress
        or (now - step.at).total_seconds() < warmup_seconds
    ):
        return learned
    step = step.model_copy(
        update={
            "hit_rate_since": step.hit_rate_since.add(warm_hit_rate),
            "preemptions_since": step.preemptions_since.add(preemption_share(snapshot)),
            "cost_since": step.cost_since.add(snapshot.signals.gpu_seconds_per_1k_requests.value),
        }
    )
    return learned.model_copy(update={"last_max_num_seqs_step": step})
