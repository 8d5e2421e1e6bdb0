"""The observed state the operator writes: ``CacheScalingPolicy.status``.

Status is what ``kubectl describe csp`` shows, so it is shaped to explain and nothing in it
says a thing twice: conditions with stable CamelCase reasons, the signals the decision used
(absent when unknown, with the reason in ``unknownSignals`` — a missing value is never
written as 0), the figures ``kubectl get`` prints already formatted (``summary``), the last
decision, the alerts and the suspected change. Earlier decisions are Events and metrics,
not status. The decision engine's memory (the learned baseline among it), which only a
restarted operator reads, is one packed line (``learnedState``, :func:`pack_learned_state`),
so ``describe`` is not mostly memory. ``status.observedGeneration`` is the generation every
condition was computed from (all are computed in one evaluation), so no condition repeats
it. The schema is strict: kopf keeps its own bookkeeping in annotations, so nothing here is
pruned by surprise; fields an older version wrote and this one does not
(``RETIRED_FIELDS``) are dropped when a stored status is read, so an upgrade keeps the
memory.

Status has a largest size. Every text is cut at its limit, ending in "…" (:func:`clip`),
and every list at its length, when a model is built, not refused: messages quote what a
policy's author wrote (a selector, a URL, a refused value), and a status too large to
write is no status at all. So everything but the decision engine's memory
(``learnedState``) fits in ``tests/controller/test_status_bounds.py``'s bound whatever the
spec holds.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import BeforeValidator, Field, model_validator

from cachescale.api.base import ApiModel

CONDITION_MESSAGE_LIMIT: Final = 1024
"""Characters of a condition's message (``kubectl describe`` shows it whole)."""
DECISION_MESSAGE_LIMIT: Final = 1024
"""Characters of a decision's message (Events and the log carry it too)."""
ALERT_MESSAGE_LIMIT: Final = 2048
"""Characters of an alert's or a suspected change's message: the evidence."""
SIGNAL_REASON_LIMIT: Final = 512
"""Characters of why a signal is unknown."""
ELLIPSIS: Final = "…"
"""Ends a text cut at its limit."""


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and
    an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def _clipped(limit: int) -> BeforeValidator:
    """A text longer than ``limit`` is clipped to it, not refused."""

    def clip_text(value: Any) -> Any:
        return clip(value, limit) if isinstance(value, str) else value

    return BeforeValidator(clip_text)


def _first(length: int) -> BeforeValidator:
    """A list longer than ``length`` keeps its first ``length`` items, not refused."""

    def cut(value: Any) -> Any:
        return value[:length] if isinstance(value, list) else value

    return BeforeValidator(cut)


class ConditionType(StrEnum):
    """The conditions a policy reports. True is the good state for all but ScalingHeld."""

    READY = "Ready"
    """The policy is valid, its targets exist and the last evaluation completed."""
    CACHE_HEALTHY = "CacheHealthy"
    """The warm-pod prefix-cache hit rate is not collapsed relative to the baseline."""
    SLO_MET = "SLOMet"
    """TTFT p95 (and p99 if set) is within the objective."""
    WITHIN_BUDGET = "WithinBudget"
    """GPU-seconds per 1k requests is within the budget."""
    METRICS_AVAILABLE = "MetricsAvailable"
    """Every signal the decision needs was read; False freezes scaling down."""
    SCALING_HELD = "ScalingHeld"
    """True while the operator holds or caps the HPA below what it would otherwise do."""
    CACHE_ISOLATION = "CacheIsolation"
    """The engines' prefix cache keeps tenants apart: a cryptographic block hash under
    ``cache.tenancy: MultiTenant``, and prefix caching on."""


class ConditionStatus(StrEnum):
    """Kubernetes condition status values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """One condition, in the shape of metav1.Condition."""

    type: ConditionType
    """Condition type."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=128)
    """CamelCase machine-readable reason for the last transition."""
    message: Annotated[str, _clipped(CONDITION_MESSAGE_LIMIT)] = Field(
        default="", max_length=CONDITION_MESSAGE_LIMIT
    )
    """Human-readable explanation, with the numbers behind it (at most 1024 characters)."""
    last_transition_time: datetime
    """When the status last changed (not when it was last checked)."""


class UnknownSignal(ApiModel):
    """A signal that could not be read, and why."""

    signal: str = Field(max_length=128)
    """The signal's status field name, e.g. tokenHitRate."""
    reason: Annotated[str, _clipped(SIGNAL_REASON_LIMIT)] = Field(max_length=SIGNAL_REASON_LIMIT)
    """Why it is unknown (series absent, NaN, too few samples, Prometheus unreachable...)."""


class QualifiedSignal(ApiModel):
    """A quantile whose number alone would mislead, as it should be read."""

    signal: str = Field(max_length=128)
    """The signal's status field name, e.g. ttftP95Seconds."""
    reads: Annotated[str, _clipped(256)] = Field(max_length=256)
    """How to read it: "> 400 s" when it is past the histogram's last finite bucket (the
    number in the field is only a lower bound), or "1,200 s (bucket 640–2,560 s)" when the
    bucket it was interpolated in is wider than twice its lower bound."""


class ObservedSignals(ApiModel):
    """Signals over the policy's window at the last evaluation; absent means unknown."""

    token_hit_rate: float | None = Field(default=None, ge=0, le=1)
    """Token-weighted prefix-cache hit rate on warm pods (hits / queried prompt tokens)."""
    request_hit_share: float | None = Field(default=None, ge=0, le=1)
    """Request-weighted: share of requests that skipped almost all prefill."""
    prefill_tokens_per_request: float | None = Field(default=None, ge=0)
    """Prompt tokens actually computed per request (not served from cache)."""
    ttft_p95_seconds: float | None = Field(default=None, ge=0)
    """Time to first token, 95th percentile, in seconds."""
    ttft_p99_seconds: float | None = Field(default=None, ge=0)
    """Time to first token, 99th percentile, in seconds."""
    gpu_seconds_per_1k_requests: float | None = Field(default=None, ge=0)
    """GPU-seconds spent per 1,000 successful requests."""
    requests_per_second: float | None = Field(default=None, ge=0)
    """Successful requests per second: the load served."""
    arrivals_per_second: float | None = Field(default=None, ge=0)
    """Requests arriving per second: the load offered (finished requests of every finish
    reason plus queue growth, or spec.metrics.demandQuery). Above requestsPerSecond when
    the fleet is saturated or clients time out."""
    preemptions_per_second: float | None = Field(default=None, ge=0)
    """Engine preemptions per second (KV pool ran dry)."""
    kv_cache_usage_ratio: float | None = Field(default=None, ge=0, le=1)
    """Average KV cache usage, 0 to 1 (cached but idle blocks count as free, as in vLLM)."""
    replicas: int | None = Field(default=None, ge=0)
    """Replicas of the Deployment."""
    ready_replicas: int | None = Field(default=None, ge=0)
    """Ready replicas."""
    warm_replicas: int | None = Field(default=None, ge=0)
    """Ready replicas older than the warm-up time."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """The engine's current batch ceiling as found in the container args."""
    observed_at: datetime | None = None
    """When these signals were read."""
    prometheus: Annotated[str | None, _clipped(2100)] = Field(default=None, max_length=2100)
    """Where they were read: the Prometheus URL (no credentials, no query) and whether it
    is the policy's ``prometheusUrl`` or the operator's default."""
    unknown_signals: Annotated[list[UnknownSignal], _first(16)] = Field(
        default_factory=list, max_length=16
    )
    """Signals that could not be read, each with the reason."""
    qualified_signals: Annotated[list[QualifiedSignal], _first(8)] = Field(
        default_factory=list, max_length=8
    )
    """Latency quantiles that are only a lower bound or lie in a wide bucket, as read."""


class Summary(ApiModel):
    """The figures ``kubectl get csp`` prints, written already formatted (a printer column
    cannot format a number), each to at most three significant digits; absent when the
    signal is unknown (``signals.unknownSignals`` says why)."""

    hit_rate: str | None = Field(default=None, max_length=8)
    """Warm-pod token hit rate to two decimals: ``0.87``."""
    ttft_p95: Annotated[str | None, _clipped(64)] = Field(default=None, max_length=64)
    """TTFT p95 as it should be read: ``0.58s``, ``16s``, ``2,370s``; ``>400s`` when the
    number in signals.ttftP95Seconds is only a lower bound (past the histogram's last
    finite bucket); ``1.3s(1–2.5s)`` when its bucket is wide."""
    gpu_seconds_per_1k: int | None = Field(default=None, ge=0)
    """GPU-seconds per 1,000 requests, a whole number to three significant digits:
    ``16``, ``688``, ``1140``."""


class DecisionRecord(ApiModel):
    """One evaluation's outcome, as recorded for humans."""

    time: datetime
    """When the decision was made."""
    diagnosis: str = Field(max_length=64)
    """The leading diagnosis, e.g. Healthy, PrefixCollapse, EvictionPressure."""
    reason: str = Field(max_length=128)
    """CamelCase reason for the action taken."""
    message: Annotated[str, _clipped(DECISION_MESSAGE_LIMIT)] = Field(
        max_length=DECISION_MESSAGE_LIMIT
    )
    """What was decided and why, with the numbers."""
    min_replicas: int | None = Field(default=None, ge=0)
    """HPA minReplicas decided."""
    max_replicas: int | None = Field(default=None, ge=0)
    """HPA maxReplicas decided."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Batch ceiling decided."""
    applied: bool = False
    """Whether it was applied (False in Advise mode or when nothing changed)."""


class ActiveAlert(ApiModel):
    """An alert raised by the policy and not yet cleared."""

    reason: str = Field(max_length=64)
    """What raised it: PrefixCollapse, EvictionPressure, OverBudget, SLOAtRisk or
    MetricsUnavailable."""
    since: datetime
    """When it was raised."""
    message: Annotated[str, _clipped(ALERT_MESSAGE_LIMIT)] = Field(max_length=ALERT_MESSAGE_LIMIT)
    """The evidence, with the numbers."""
    acknowledged: bool = False
    """A human acknowledged it (annotation cachescale.dev/acknowledge)."""


class SuspectedChange(ApiModel):
    """What changed before a collapse's drop: the most likely culprit, or that nothing
    changed where the operator looked (``docs/decisions.md``, "PrefixCollapse")."""

    onset: datetime
    """The drop it was looked up for: the collapse's first evaluation under the threshold."""
    checked_at: datetime
    """When the sources were read (once when the collapse is suspected, once when raised)."""
    message: Annotated[str, _clipped(ALERT_MESSAGE_LIMIT)] = Field(max_length=ALERT_MESSAGE_LIMIT)
    """The culprit in words, e.g. "rag-api (Deployment, namespace rag) rolled out revision
    42 (image rag-api:1.8.2 → 1.8.3) 4 minutes before the hit rate fell"."""


LEARNED_STATE_PACKED_LIMIT: Final = 65_536
"""Most characters ``status.learnedState`` may hold (the API server refuses more)."""
LEARNED_STATE_UNPACKED_LIMIT: Final = 1_048_576
"""Most bytes its JSON may unpack to: a packing that inflates past this is refused as
damaged, so a status written by hand cannot make the operator inflate without bound."""


RETIRED_FIELDS: Final = frozenset({"baseline", "history"})
"""Status fields older versions wrote: the learned baseline (now only in ``learnedState``)
and the last ten applied decisions (now Events and metrics only)."""
RETIRED_CONDITION_FIELDS: Final = frozenset({"observedGeneration"})
"""Condition fields older versions wrote (``status.observedGeneration`` says it once)."""


class CacheScalingPolicyStatus(ApiModel):
    """Observed state of a CacheScalingPolicy."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The .metadata.generation last evaluated."""
    state: str | None = Field(default=None, max_length=64)
    """One-word summary shown by kubectl get: the leading diagnosis."""
    conditions: Annotated[list[Condition], _first(len(ConditionType))] = Field(
        default_factory=list, max_length=len(ConditionType)
    )
    """Ready, CacheHealthy, SLOMet, WithinBudget, MetricsAvailable, ScalingHeld,
    CacheIsolation."""
    summary: Summary | None = None
    """The figures ``kubectl get csp`` prints, formatted."""
    signals: ObservedSignals | None = None
    """Signals at the last evaluation: the numbers the decision and its messages used."""
    last_decision: DecisionRecord | None = None
    """The most recent decision (each one applied is also a Normal Event)."""
    alerts: Annotated[list[ActiveAlert], _first(8)] = Field(default_factory=list, max_length=8)
    """Alerts active now (also exported as the cachescale_alert_active metric)."""
    suspected_change: SuspectedChange | None = None
    """While a collapse is suspected or alerted: what changed in the prompt sources and the
    policy's namespace in the hour before the drop (also in the alert's message)."""
    learned_state: str | None = Field(default=None, max_length=LEARNED_STATE_PACKED_LIMIT)
    """The decision engine's memory between evaluations (baseline, streaks, cooldowns,
    alerts), kept here so an operator restart loses nothing: ``v1:`` and the base64 of its
    zlib-compressed JSON, one line in ``kubectl describe``. Written by the operator; do
    not edit."""
    memory: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """The decision engine's memory as older versions wrote it (structured). Read when
    learnedState is absent, never written: the next status write replaces it."""

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, stored: Any) -> Any:
        """A stored status as this version reads it: the ``RETIRED_FIELDS`` an older
        version wrote left out (the next write drops them from the object too). A status
        this version wrote, read at every evaluation, is returned as it is, not copied."""
        if not isinstance(stored, Mapping) or not _holds_retired(stored):
            return stored
        kept = {k: v for k, v in stored.items() if k not in RETIRED_FIELDS}
        conditions = kept.get("conditions")
        if isinstance(conditions, list):
            kept["conditions"] = [
                {k: v for k, v in c.items() if k not in RETIRED_CONDITION_FIELDS}
                if isinstance(c, Mapping)
                else c
                for c in conditions
            ]
        return kept

    def to_wire(self) -> dict[str, object]:
        """As the API server stores it, with Kubernetes' ``omitempty``: unset optionals and
        empty lists left out (``describe`` would show each as a line with nothing under it)."""
        return _without_empty_lists(super().to_wire())

    def learned(self) -> dict[str, Any] | None:
        """The decision engine's memory as stored: ``learnedState`` unpacked, else the
        structured ``memory`` an older version wrote, else None. Raises ``ValueError``
        when ``learnedState`` cannot be unpacked."""
        if self.learned_state is not None:
            return unpack_learned_state(self.learned_state)
        return self.memory


def _holds_retired(stored: Mapping[str, Any]) -> bool:
    """Whether ``stored`` has a field, or a condition a field, that an older version wrote."""
    if not RETIRED_FIELDS.isdisjoint(stored):
        return True
    conditions = stored.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, Mapping) and not RETIRED_CONDITION_FIELDS.isdisjoint(c) for c in conditions
    )


def _without_empty_lists(wire: dict[str, object]) -> dict[str, object]:
    """``wire`` without its empty lists, at any depth of nested objects."""
    return {
        key: _without_empty_lists(value) if isinstance(value, dict) else value
        for key, value in wire.items()
        if value != []
    }


LEARNED_STATE_VERSION: Final = "v1"
"""How ``status.learnedState`` is packed: ``v1:`` and the base64 of the zlib-compressed
compact JSON of the memory (camelCase, as ``LearnedState`` serialises it)."""


def pack_learned_state(memory: Mapping[str, Any]) -> str:
    """``memory`` (JSON-ready) as ``status.learnedState``: one line, no spaces."""
    text = json.dumps(memory, separators=(",", ":"), ensure_ascii=False)
    packed = base64.b64encode(zlib.compress(text.encode(), 9)).decode("ascii")
    return f"{LEARNED_STATE_VERSION}:{packed}"


def unpack_learned_state(text: str) -> dict[str, Any]:
    """``status.learnedState`` as the memory it packs; ``ValueError`` for another version,
    a damaged packing, or JSON that is not an object."""
    version, _, packed = text.partition(":")
    if version != LEARNED_STATE_VERSION:
        raise ValueError(f"learnedState is packed as {version!r}, not {LEARNED_STATE_VERSION!r}")
    try:
        memory = json.loads(_inflate(base64.b64decode(packed, validate=True)))
    except (binascii.Error, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"learnedState cannot be unpacked: {error}") from None
    if not isinstance(memory, dict):
        raise ValueError("learnedState does not hold an object")
    return memory


def _inflate(data: bytes) -> bytes:
    """``data`` decompressed, at most ``LEARNED_STATE_UNPACKED_LIMIT`` bytes of it
    (``zlib.error`` past that, or when the stream does not end)."""
    inflater = zlib.decompressobj()
    text = inflater.decompress(data, LEARNED_STATE_UNPACKED_LIMIT)
    if inflater.unconsumed_tail or not inflater.eof:
        raise zlib.error(f"it unpacks past {LEARNED_STATE_UNPACKED_LIMIT:,} bytes or is cut short")
    return text
