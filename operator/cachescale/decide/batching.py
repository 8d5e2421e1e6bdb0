"""``--max-num-seqs``: keep the running batch under the cache-friendly ceiling B_max.

Running sequences and cached prefixes share one KV pool (``docs/decisions.md``, §4), so a
batch ceiling above ``B_max`` evicts reusable prefixes on every admission. The rules:

- lower toward ``B_max`` (never more than 25% per change) while eviction pressure has held
  for ``collapseWindows`` evaluations;
- raise toward throughput (25% per change, up to ``maxNumSeqs``) when the token hit rate
  has stayed under ``LOW_HIT_RATE`` for ``LOW_HIT_SECONDS`` and the batch is full or
  requests queue: a cache that does not hit is not worth protecting;
- at most one change per ``cooldown`` (each change restarts pods and empties their
  caches), none during a rollout, and never outside ``minNumSeqs..maxNumSeqs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from cachescale.api.reasons import Action
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide.memory import Memory
from cachescale.decide.thresholds import (
    BATCH_NEAR_CEILING,
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


def plan_max_num_seqs(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    now: datetime,
    facts: BatchFacts,
) -> BatchPlan:
    """Whether to change the engine's batch ceiling, and to what."""
    current = snapshot.workload.max_num_seqs
    batching = spec.batching
    if not batching.manage_max_num_seqs or current is None:
        return BatchPlan(current, None, "")
    wanted, reason, why = _wanted(spec, snapshot, memory, facts, current)
    if wanted == current or reason is None:
        return BatchPlan(current, None, why)
    blocked = _blocked(spec, snapshot, memory, now)
    if blocked:
        return BatchPlan(
            current, None, f"{why}; --max-num-seqs stays {current}: {blocked}", blocked
        )
    message = f"--max-num-seqs {current} → {wanted}: {why}"
    return BatchPlan(wanted, reason, message)


def _wanted(
    spec: CacheScalingPolicySpec,
    snapshot: Snapshot,
    memory: Memory,
    facts: BatchFacts,
    current: int,
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
        step = math.ceil(current * (1 - MAX_STEP))
        wanted = max(low, facts.ceiling, step)
        return (
            wanted,
            Action.LOWERED_MAX_NUM_SEQS,
            (
                f"sustained eviction pressure with the batch above the cache-friendly ceiling "
                f"B_max {facts.ceiling}"
            ),
        )
    evaluations = math.ceil(LOW_HIT_SECONDS / spec.metrics.interval_seconds)
    if (
        memory.streaks.low_hit >= evaluations
        and not facts.collapse_active
        and _busy(snapshot, current)
    ):
        wanted = min(high, math.floor(current * (1 + MAX_STEP)))
        return (
            wanted,
            Action.RAISED_MAX_NUM_SEQS,
            (
                f"token hit rate under {LOW_HIT_RATE:.2f} for {LOW_HIT_SECONDS / 60:.0f} min: "
                "nothing to protect, so the batch buys throughput"
            ),
        )
    return current, None, ""


def _busy(snapshot: Snapshot, current: int) -> bool:
    """Requests queue, or the batch is nearly full: a larger batch would be used."""
    signals = snapshot.signals
    waiting = signals.waiting_requests_per_pod.value
    running = signals.running_requests_per_pod.value
    return (waiting is not None and waiting >= QUEUED_PER_POD) or (
        running is not None and running >= BATCH_NEAR_CEILING * current
    )


def _blocked(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, memory: Memory, now: datetime
) -> str | None:
    last = memory.last_max_num_seqs_change_at
    cooldown = spec.batching.cooldown_seconds
    if last is not None and (now - last).total_seconds() < cooldown:
        elapsed = (now - last).total_seconds()
        return (
            f"cooldown: the last change was {elapsed / 60:.0f} min ago; "
            f"next possible in {(cooldown - elapsed) / 60:.0f} min"
        )
    if snapshot.workload.rollout_in_progress:
        return "a rollout is in progress"
    return None
