"""What one evaluation hands the next: the learned baseline, streaks, alerts, cooldowns.

``decide`` is a pure function, so everything it must remember between evaluations lives in
a ``LearnedState`` value it receives and returns. The operator persists it (in the policy's
status) so a restart loses nothing: the baseline, when each symptom started, the last
``--max-num-seqs`` change (the cooldown survives a restart) and the active alerts. It is a
frozen pydantic model so it round-trips through JSON exactly.

The functions at the end are the steps of an evaluation that only move memory forward:
human requests, the collapse's running evidence, and baseline learning.
"""

from __future__ import annotations

from collections.abc import Set
from datetime import datetime

from pydantic import Field

from cachescale.api.base import ApiModel
from cachescale.api.reasons import Diagnosis
from cachescale.decide.ceiling_step import CeilingStep
from cachescale.decide.demand import demand
from cachescale.decide.thresholds import (
    AT_BASELINE_SHARE,
    BASELINE_TIME_CONSTANT_S,
    SCALE_DOWN_FLOOR_HOLD_SECONDS,
    TREND_SECONDS,
)
from cachescale.snapshot import HumanRequests, Snapshot


class LearnedBaseline(ApiModel):
    """What healthy looked like, learned only while healthy and frozen otherwise."""

    token_hit_rate: float | None = None
    """Token-weighted hit rate on warm pods."""
    prefill_tokens_per_request: float | None = None
    gpu_seconds_per_1k_requests: float | None = None
    requests_per_second: float | None = None
    """Demand: arrivals per second when known, else the served rate (``decide.demand``)."""
    updated_at: datetime | None = None
    evaluations: int = 0
    """Healthy evaluations folded into it."""

    def learn(self, now: datetime, interval_s: float, **observed: float | None) -> LearnedBaseline:
        """Fold one healthy evaluation in (each known value; unknown ones leave the old):
        the running mean at first, then an exponential average with a
        ``BASELINE_TIME_CONSTANT_S`` time constant."""
        weight = max(1.0 / (self.evaluations + 1), interval_s / BASELINE_TIME_CONSTANT_S)
        changes: dict[str, object] = {"updated_at": now, "evaluations": self.evaluations + 1}
        for name, value in observed.items():
            if value is None:
                continue
            old = getattr(self, name)
            changes[name] = value if old is None else old + weight * (value - old)
        return self.model_copy(update=changes)


class Streaks(ApiModel):
    """Consecutive evaluations each symptom has held (0 when it did not hold last time)."""

    collapse: int = 0
    """Warm-pod hit rate under the collapse threshold."""
    recovered: int = 0
    """Warm-pod hit rate back above the clearing threshold (ends a collapse)."""
    eviction: int = 0
    """Preemptions or a full KV pool with the batch near the cache-friendly ceiling."""
    degraded: int = 0
    """Warm-pod hit rate more than ``DEGRADED_HIT_DROP`` under its baseline, not under the
    collapse threshold, without eviction pressure (``decide.degraded``)."""
    low_hit: int = 0
    """Token hit rate under the level where the cache is worth protecting."""
    slo_breach: int = 0
    slo_comfortable: int = 0
    """TTFT p95 well inside the SLO (lets a lowered target relax back)."""
    over_budget: int = 0


class ReplicaMark(ApiModel):
    """Replicas and demand at one moment (the level a collapse hold returns to)."""

    replicas: int
    requests_per_second: float
    """Demand: arrivals when known, else the served rate (``decide.demand``)."""
    at: datetime


class ReplicaCount(ApiModel):
    """The replicas at one evaluation (no demand: a count of the window, not scaled by
    one)."""

    replicas: int
    at: datetime


class LearnedFloor(ApiModel):
    """minReplicas learned from a scale-down that broke the SLO
    (``slo_floors.scale_down_floor``), how long it is held, and when it was released."""

    replicas: int
    at: datetime
    """The last breaching evaluation: the hold counts from it."""
    hold_seconds: float = SCALE_DOWN_FLOOR_HOLD_SECONDS
    released_at: datetime | None = None
    """When the hold ended. The record stays for ``SCALE_DOWN_FLOOR_HOLD_SECONDS`` after:
    a floor learned again within it (its release broke the SLO again) is held twice as
    long."""


class RateSample(ApiModel):
    """A warm-pod token hit rate at one evaluation."""

    at: datetime
    value: float


class CollapseEvidence(ApiModel):
    """Numbers gathered while a collapse builds and while its alert lasts, for the message
    a human reads: the demand range, and the hit rate since the onset (its trend,
    ``decide.healing``)."""

    started_at: datetime
    """The onset: the first evaluation under the collapse threshold."""
    requests_per_second_min: float | None = None
    requests_per_second_max: float | None = None
    onset_hit_rate: float | None = None
    """The warm-pod token hit rate at the onset (the first known one after it)."""
    low_hit_rate: float | None = None
    """The lowest warm-pod token hit rate since the onset."""
    recent_hit_rates: list[RateSample] = Field(default_factory=list)
    """The warm-pod token hit rates of the last ``TREND_SECONDS``, oldest first."""

    def saw_hit_rate(self, value: float | None, now: datetime) -> CollapseEvidence:
        """Fold one more evaluation's warm-pod hit rate in (unknown: nothing changes)."""
        if value is None:
            return self
        recent = [s for s in self.recent_hit_rates if (now - s.at).total_seconds() <= TREND_SECONDS]
        low = self.low_hit_rate
        return self.model_copy(
            update={
                "onset_hit_rate": value if self.onset_hit_rate is None else self.onset_hit_rate,
                "low_hit_rate": value if low is None else min(low, value),
                "recent_hit_rates": [*recent, RateSample(at=now, value=value)],
            }
        )

    def saw(self, requests_per_second: float | None) -> CollapseEvidence:
        """Widen the request-rate range with one more evaluation."""
        if requests_per_second is None:
            return self
        low = self.requests_per_second_min
        high = self.requests_per_second_max
        return self.model_copy(
            update={
                "requests_per_second_min": (
                    requests_per_second if low is None else min(low, requests_per_second)
                ),
                "requests_per_second_max": (
                    requests_per_second if high is None else max(high, requests_per_second)
                ),
            }
        )


class LearnedAlert(ApiModel):
    """One active alert."""

    reason: Diagnosis
    """The diagnosis that raised it, e.g. PrefixCollapse."""
    since: datetime
    message: str
    acknowledged: bool = False
    quiet_evaluations: int = 0
    """Consecutive evaluations without its condition (it clears after a few)."""


class EnvelopeMark(ApiModel):
    """A maxReplicas recommendation (kept for the stabilization window)."""

    at: datetime
    max_replicas: int


class OriginalEnvelope(ApiModel):
    """The HPA's envelope before cachescale first touched it (restored on delete)."""

    min_replicas: int
    max_replicas: int
    target_average_value: float | None = None


class LearnedState(ApiModel):
    """Everything carried from one evaluation to the next."""

    data_since: datetime | None = None
    """First evaluation with data after none (policy created, or metrics came back). Until
    a full window has passed the windowed rates still cover blank time, so nothing is
    decided from them."""
    missing_since: datetime | None = None
    """First evaluation of the current run without data (None while data is there): how
    long the gap lasted decides whether the window must fill again (``SHORT_GAP_SHARE``)."""
    baseline: LearnedBaseline = Field(default_factory=LearnedBaseline)
    streaks: Streaks = Field(default_factory=Streaks)
    pre_collapse: ReplicaMark | None = None
    """Last replicas and req/s while the cache was at its baseline."""
    collapse_evidence: CollapseEvidence | None = None
    alerts: list[LearnedAlert] = Field(default_factory=list)
    original_envelope: OriginalEnvelope | None = None
    max_replicas_marks: list[EnvelopeMark] = Field(default_factory=list)
    last_max_replicas_change_at: datetime | None = None
    last_max_replicas_direction: int = 0
    """+1 after a raise, −1 after a lowering, 0 before any change."""
    last_max_replicas_was_hold: bool = False
    """The last change was a collapse hold (releasing it is not a flap)."""
    hold_released_for_slo: bool = False
    """The SLO guard released a collapse hold; it stays released until latency has been
    comfortable for a stabilization window."""
    slo_needed: ReplicaMark | None = None
    """The replicas the SLO needed (and the demand then), estimated while TTFT breached
    the SLO, from the pods that served the window; kept while the incident lasts so the
    cap does not fall back and breach again once latency recovers (``decide.envelope``,
    "SLO first")."""
    recent_replicas: list[ReplicaCount] = Field(default_factory=list)
    """The replicas at each evaluation of the last window (with demand known)."""
    comfortable_replicas: list[ReplicaCount] = Field(default_factory=list)
    """The same at the evaluations of the last window where TTFT p95 was under
    ``SLO_COMFORTABLE_SHARE`` of the SLO with every pod ready."""
    scale_down_floor: LearnedFloor | None = None
    """One above the fewest replicas of the window before a breach that followed a
    scale-down from a comfortable count: minReplicas is held there until it is released
    (``slo_floors.scale_down_floor``)."""
    target_factor: float = 1.0
    """Multiplier the SLO guard applies to the original HPA target (1: untouched)."""
    last_max_num_seqs_change_at: datetime | None = None
    last_max_num_seqs_step: CeilingStep | None = None
    """The last ceiling change with the cache before it; read only while its ``at`` is
    ``last_max_num_seqs_change_at`` (a change the Deployment recorded and the status lost
    leaves it stale)."""
    acknowledged_at: datetime | None = None
    """The last acknowledgement request handled."""
    rebaselined_at: datetime | None = None
    """The last rebaseline request handled."""

    def alert(self, reason: Diagnosis) -> LearnedAlert | None:
        """The active alert raised by ``reason``, if any."""
        return next((a for a in self.alerts if a.reason == reason), None)


def apply_human_requests(
    memory: LearnedState, human: HumanRequests
) -> tuple[LearnedState, tuple[str, ...], bool]:
    """Apply new acknowledge/rebaseline requests; True in the last place on a rebaseline."""
    notes: list[str] = []
    rebaselined = False
    if human.rebaseline_at is not None and (
        memory.rebaselined_at is None or human.rebaseline_at > memory.rebaselined_at
    ):
        memory = memory.model_copy(
            update={
                "baseline": LearnedBaseline(),
                "streaks": memory.streaks.model_copy(
                    update={"collapse": 0, "recovered": 0, "degraded": 0}
                ),
                "collapse_evidence": None,
                "rebaselined_at": human.rebaseline_at,
                "pre_collapse": None,
            }
        )
        notes.append("baseline reset on request; relearning from the current hit rate")
        rebaselined = True
    if human.acknowledge_at is not None and (
        memory.acknowledged_at is None or human.acknowledge_at > memory.acknowledged_at
    ):
        alerts = [
            a.model_copy(update={"acknowledged": True})
            if a.reason == Diagnosis.PREFIX_COLLAPSE
            else a
            for a in memory.alerts
        ]
        memory = memory.model_copy(
            update={"alerts": alerts, "acknowledged_at": human.acknowledge_at}
        )
        if any(a.reason == Diagnosis.PREFIX_COLLAPSE for a in alerts):
            notes.append("collapse acknowledged: replicas are no longer held")
    return memory, tuple(notes), rebaselined


def track_collapse_evidence(
    memory: LearnedState,
    requests_per_second: float | None,
    warm_hit_rate: float | None,
    now: datetime,
) -> LearnedState:
    """Widen the building collapse's demand range (its message quotes it) and follow its
    warm hit rate while the streak or the alert lasts; forget both once the streak is
    broken and no alert still needs them."""
    evidence = memory.collapse_evidence
    if memory.streaks.collapse == 0:
        if memory.alert(Diagnosis.PREFIX_COLLAPSE) is None:
            return memory.model_copy(update={"collapse_evidence": None})
        if evidence is None:
            return memory
    else:
        evidence = (evidence or CollapseEvidence(started_at=now)).saw(requests_per_second)
    evidence = evidence.saw_hit_rate(warm_hit_rate, now)
    return memory.model_copy(update={"collapse_evidence": evidence})


_CACHE_TROUBLE = frozenset(
    {Diagnosis.PREFIX_COLLAPSE, Diagnosis.EVICTION_PRESSURE, Diagnosis.CACHE_DEGRADED}
)
REBASELINE_CLEARS = frozenset({Diagnosis.PREFIX_COLLAPSE, Diagnosis.CACHE_DEGRADED})
"""Alerts measured against the learned hit rate: a rebaseline accepts the new rate and
clears them."""
_BENIGN = frozenset({Diagnosis.HEALTHY, Diagnosis.DEMAND_GROWTH, Diagnosis.COLD_FLEET})


def learn(
    memory: LearnedState,
    snapshot: Snapshot,
    found: Set[Diagnosis],
    *,
    warm_hit_rate: float | None,
    below_clearing: bool,
    interval_seconds: float,
    now: datetime,
) -> LearnedState:
    """Fold a healthy evaluation into the baseline; mark the pre-collapse replica level.

    ``found`` holds this evaluation's diagnoses; ``below_clearing`` says the warm hit rate
    is under the collapse's clearing threshold. The cache half (hit rate, prefill per
    request) is learned while the cache looks healthy — no cache finding, no collapse
    building or alerted, and the warm hit rate not below the clearing threshold — even if
    the SLO or budget are in trouble; the cost half (GPU-s/1k, req/s) only when nothing at
    all is wrong."""
    signals = snapshot.signals
    rps = demand(snapshot).per_second
    update: dict[str, object] = {}
    relearning = memory.baseline.token_hit_rate is None  # a collapse alert is about to clear
    cache_alerted = any(
        a.reason in _CACHE_TROUBLE and not (relearning and a.reason in REBASELINE_CLEARS)
        for a in memory.alerts
    )
    cache_ok = (
        warm_hit_rate is not None
        and memory.streaks.collapse == 0
        and not cache_alerted
        and not below_clearing
        and not found & _CACHE_TROUBLE
    )
    if cache_ok:
        all_ok = found <= _BENIGN and not memory.alerts
        update["baseline"] = memory.baseline.learn(
            now,
            interval_seconds,
            token_hit_rate=warm_hit_rate,
            prefill_tokens_per_request=signals.prefill_tokens_per_request.value,
            gpu_seconds_per_1k_requests=(
                signals.gpu_seconds_per_1k_requests.value if all_ok else None
            ),
            requests_per_second=rps if all_ok else None,
        )
    baseline = memory.baseline.token_hit_rate
    at_baseline = warm_hit_rate is not None and (
        baseline is None or warm_hit_rate >= AT_BASELINE_SHARE * baseline
    )
    if at_baseline and rps is not None and memory.alert(Diagnosis.PREFIX_COLLAPSE) is None:
        update["pre_collapse"] = ReplicaMark(
            replicas=snapshot.workload.replicas, requests_per_second=rps, at=now
        )
    return memory.model_copy(update=update) if update else memory
