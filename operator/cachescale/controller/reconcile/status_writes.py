"""When a policy's status is worth a PATCH: only when its meaning changed (what a reader
acts on, or what a restart resumes from), and at least once per refresh
(``StatusWrites.refresh_seconds``: ``STATUS_REFRESH_SECONDS`` unless the cluster owner set
``--status-refresh``), at a moment of its own (``refresh_due``).

A fleet of policies evaluated every interval would otherwise rewrite every status every
interval, though most evaluations end where the last one did, and a live engine's numbers
move at every reading. So the operator keeps, in memory and per policy, what it last
wrote (the watch's own copy of it once that comes back: one status per policy, not two)
and when, and skips the write when the new status equals it once both are *normalised*.
The next evaluation then continues from the status it rendered, not the stored one, so
what is skipped is not lost in this process (``latest``). Normalised means:

- the numbers read at this evaluation ride along: each of ``status.signals``
  (``READINGS``) compares as known or unknown only, ``summary`` (the same numbers as
  ``kubectl get`` prints them) not at all, and the messages of the conditions, the alerts
  and the last decision, and how a qualified quantile reads
  (``signals.qualifiedSignals``), with the numbers they quote masked (``unquoted``: a message
  that says something else, such as naming another policy, is a change); nor their
  stamps (``signals.observedAt``, ``lastDecision.time``). A number that becomes known or
  unknown is a change; one that moves is written with the next change or refresh, whole
  (the stored status is always one evaluation's);
- the decision memory (``status.learnedState``, what a restarted operator resumes from,
  compared unpacked; ``status.memory`` as older versions wrote it) is compared in full,
  except for steady progress: the learned baseline's running averages (as known or not,
  their count and stamp dropped), the marks re-stamped every evaluation
  (``RESTAMPED_MARKS``: their time dropped, the demand they hold as known or not), the
  recent ``maxReplicas`` recommendations and replica counts as their sequence of distinct
  values (``RECENT_MARKS``: a run of equal ones growing at one end and expiring at the
  other is no change), the numbers an alert's message quotes, and
  the length of a streak that is running (a streak that starts or ends is a change).

State, each condition's type, status, reason and transition time, the last decision's
reason, diagnosis and envelope (not whether that evaluation applied it:
``UNCOMPARED_DECISION``), each alert's reason, onset and acknowledgement, the suspected
change and everything else in memory compare exactly. A restarted process (or
a policy it has not written yet) starts from the stored status, as the watch delivered
it, as if it had written it at its ``signals.observedAt``: its first evaluation writes
only what changed since, or when that stamp is older than the refresh time, so a restart
of an operator serving thousands of policies is not a burst of writes. A write that
failed forgets the last one, so the next evaluation writes whatever it has (also once an
API outage ends); and a stored status that no longer matches the last write (edited by
hand, or written by another process) is rewritten. The trade, documented in
``docs/reliability.md``: the numbers a status shows are up to one refresh old while
nothing else changes (``signals.observedAt`` says when they were read; the operator's
metrics are live), and a restart can replay at most that much of the steady progress.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from threading import Lock
from typing import Any

import msgspec

from cachescale.api.status import unpack_learned_state
from cachescale.controller.reconcile.schedule import next_slot, phase_of

STATUS_REFRESH_SECONDS = 600.0
"""The longest a status goes unwritten while nothing changes, by default (``cachescale run
--status-refresh``): readers see numbers read at most this long ago
(``signals.observedAt``), and a restart loses at most this much of the steady progress the
comparison ignores. At a 30 s interval, a fleet of steady policies writes one status in
twenty per interval."""

STATUS_REFRESH_BOUNDS = (60.0, 86_400.0)
"""The refresh a cluster owner may set, in seconds: at least a minute (a shorter one would
rewrite a status at nearly every evaluation) and at most a day (what a restart may replay
of the steady progress)."""

READINGS = frozenset(
    {
        "tokenHitRate",
        "requestHitShare",
        "kvCacheUsageRatio",
        "prefillTokensPerRequest",
        "ttftP95Seconds",
        "ttftP99Seconds",
        "gpuSecondsPer1kRequests",
        "requestsPerSecond",
        "arrivalsPerSecond",
        "preemptionsPerSecond",
    }
)
"""The numbers an evaluation reads (``status.signals``), and averages or marks of them in
the decision memory (the learned baseline, the re-stamped marks): each compares as known
or unknown only, so a number that moves is no change and one that appears or vanishes is."""


def normalised(
    status: Mapping[str, Any], learned: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``status`` (wire form) without what changes every evaluation (the numbers read,
    the messages quoting them, their stamps): two statuses equal here differ in nothing
    worth a write. ``learned``: the memory its ``learnedState`` packs, when the caller
    has it unpacked (the status just rendered), so it is not unpacked again."""
    out = dict(status)
    out.pop("summary", None)
    if isinstance(out.get("signals"), Mapping):
        signals = _known(out["signals"])
        signals.pop("observedAt", None)
        if isinstance(signals.get("qualifiedSignals"), list):
            signals["qualifiedSignals"] = [
                _unquoted(q, "reads") for q in signals["qualifiedSignals"]
            ]
        out["signals"] = signals
    for name in ("conditions", "alerts"):
        if isinstance(out.get(name), list):
            out[name] = [_unquoted(item) for item in out[name]]
    if isinstance(out.get("lastDecision"), Mapping):
        decision = {k: v for k, v in out["lastDecision"].items() if k not in UNCOMPARED_DECISION}
        out["lastDecision"] = _unquoted(decision)
    if isinstance(out.get("memory"), Mapping):
        out["memory"] = _memory(out["memory"])
    if learned is not None and "learnedState" in out:
        out["learnedState"] = _memory(learned)
    elif isinstance(out.get("learnedState"), str):
        out["learnedState"] = _packed_memory(out["learnedState"])
    return out


UNCOMPARED_DECISION = frozenset({"time", "applied"})
"""What ``lastDecision`` holds of one evaluation only: when, and whether it changed the
target then (the next evaluation of the same decision has nothing left to change): the
same decision again is no change."""


QUOTED_NUMBER = re.compile(r"(?<![\w./-])[-+]?\d[\d,.]*(?![\w/-])")
"""A number a message quotes, standing alone (``0.31``, ``1,200``, ``80`` in ``80%``), not
part of a name (``fuzz-1``, ``p00010``, ``ns/llm-3``)."""


def unquoted(message: str) -> str:
    """``message`` with each number it quotes masked: two messages equal here say the same
    thing about different readings."""
    return QUOTED_NUMBER.sub("#", message)


def _unquoted(item: Any, text: str = "message") -> Any:
    """A condition, an alert or a qualified signal with the numbers in its ``text``
    masked."""
    if not isinstance(item, Mapping) or not isinstance(item.get(text), str):
        return item
    return {**item, text: unquoted(item[text])}


def _packed_memory(packed: str) -> dict[str, Any] | str:
    """``status.learnedState`` unpacked and normalised; as it is when it cannot be
    unpacked (then only an identical one is equal to it)."""
    try:
        return _memory(unpack_learned_state(packed))
    except ValueError:
        return packed


def _memory(memory: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(memory)
    if isinstance(out.get("baseline"), Mapping):
        baseline = _known(out["baseline"])
        baseline.pop("updatedAt", None)
        baseline.pop("evaluations", None)
        out["baseline"] = baseline
    if isinstance(out.get("streaks"), Mapping):
        out["streaks"] = {k: bool(v) for k, v in out["streaks"].items()}
    if isinstance(out.get("alerts"), list):
        out["alerts"] = [_unquoted(alert) for alert in out["alerts"]]
    for name in RESTAMPED_MARKS:
        if isinstance(out.get(name), Mapping):
            mark = _known(out[name])
            mark.pop("at", None)
            out[name] = mark
    for name, key in RECENT_MARKS.items():
        if isinstance(out.get(name), list):
            out[name] = _distinct_run(
                [m.get(key) if isinstance(m, Mapping) else m for m in out[name]]
            )
    return out


RESTAMPED_MARKS = ("preCollapse", "scaleDownFloor")
"""Learned-state marks re-stamped every evaluation while they hold; compared without their
time, and with the numbers read (``READINGS``: the demand) as known or not."""

RECENT_MARKS = {
    "maxReplicasMarks": "maxReplicas",
    "recentReplicas": "replicas",
    "comfortableReplicas": "replicas",
}
"""Learned-state lists of one mark per evaluation over the last window, and the value each is
compared by: a run of equal values growing at one end and expiring at the other is no
change."""


def _distinct_run(values: list[Any]) -> list[Any]:
    """``values`` with each run of equal neighbours as one."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def _known(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each of ``READINGS`` as whether it is known."""
    out = dict(values)
    for name in READINGS:
        if name in out:
            out[name] = out[name] is not None
    return out


_SORTED_JSON = msgspec.json.Encoder(order="sorted")


def _canonical(normal: Mapping[str, Any]) -> bytes:
    """A normalised status as JSON with sorted keys: equal texts, equal statuses."""
    return _SORTED_JSON.encode(normal)


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class _Written:
    """What is kept of a policy's last write: its normalised form as a digest and as
    compressed JSON, a few hundred bytes where the normalised status is kilobytes of
    dicts, kept for every policy."""

    digest: bytes
    """The digest of the last status written, normalised (``_canonical``)."""
    detail: bytes
    """The same, as zlib-compressed JSON: the comparison when the digests differ, and the
    fields a change names."""
    at: datetime
    """When it was written."""
    latest: Mapping[str, Any]
    """The last status rendered, written or not: the next evaluation's previous status."""
    written: Mapping[str, Any]
    """The last status written, as written: a stored status equal to it is known to be
    unchanged without normalising it (the watch delivers it back at every evaluation)."""

    @classmethod
    def of(
        cls,
        normal: Mapping[str, Any],
        at: datetime,
        latest: Mapping[str, Any],
        written: Mapping[str, Any],
    ) -> _Written:
        """The record of a write whose status normalises to ``normal``."""
        text = _canonical(normal)
        return cls(_digest(text), zlib.compress(text, 1), at, latest, written)

    def normalised(self) -> dict[str, Any]:
        """The last status written, normalised."""
        normal: dict[str, Any] = json.loads(zlib.decompress(self.detail))
        return normal

    def changed(self, normal: Mapping[str, Any]) -> list[str]:
        """The fields in which ``normal`` (a normalised status) differs from the last
        written. Equal texts are equal; different ones are compared as values, so a number
        the API server returned as ``2`` is the ``2.0`` this process wrote."""
        if _digest(_canonical(normal)) == self.digest:
            return []
        return _differing(normal, self.normalised())

    def holds(self, stored: Mapping[str, Any] | None) -> bool:
        """Whether ``stored`` is still the status written, once both are normalised."""
        if stored is None:
            return False
        return stored is self.written or not self.changed(normalised(stored))


@dataclass
class StatusWrites:
    """The last status written per policy (by uid) and when; thread-safe, since
    evaluations run in worker threads."""

    refresh_seconds: float = STATUS_REFRESH_SECONDS
    _last: dict[str, _Written] = field(default_factory=dict)
    _unsure: set[str] = field(default_factory=set)
    """Policies whose last write failed: what the API server holds is unknown."""
    _lock: Lock = field(default_factory=Lock)

    def due(
        self,
        uid: str,
        status: Mapping[str, Any],
        stored: Mapping[str, Any] | None,
        now: datetime,
        learned: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Why ``status`` must be written, or None: the last write failed (or nothing is
        known), the refresh time is up, the stored status (``stored``, as the watch
        delivered it) is no longer the one written, or ``status`` differs from it once
        normalised (the fields that differ). With nothing written by this process yet,
        the stored status counts as written at its ``observedAt``. ``learned``: the
        memory ``status`` packs, when the caller has it (``normalised``)."""
        with self._lock:
            last = self._last.get(uid)
            if last is None and uid not in self._unsure:
                last = self._adopt(uid, stored)
            elif last is not None:
                last = self._share(uid, last, stored)
        if last is None:
            return "no write known"
        if now >= refresh_due(uid, last.at, self.refresh_seconds):
            return "refresh"
        if not last.holds(stored):
            return "stored status changed"
        changed = last.changed(normalised(status, learned))
        return f"changed: {', '.join(changed)}" if changed else None

    def _adopt(self, uid: str, stored: Mapping[str, Any] | None) -> _Written | None:
        """The stored status as this process's last write, when it says when it was
        observed (under the lock)."""
        observed = _observed_at(stored)
        if stored is None or observed is None:
            return None
        adopted = self._last[uid] = _Written.of(normalised(stored), observed, stored, stored)
        return adopted

    def _share(self, uid: str, last: _Written, stored: Mapping[str, Any] | None) -> _Written:
        """``last``, holding ``stored`` itself as the status written once the watch has
        delivered an equal copy (under the lock). The member's body keeps that copy
        anyway: keeping ours too would cost a whole parsed status per policy, and the next
        evaluations know it unchanged by identity."""
        if stored is None or stored is last.written or stored != last.written:
            return last
        latest = stored if last.latest is last.written else last.latest
        shared = self._last[uid] = replace(last, latest=latest, written=stored)
        return shared

    def wrote(
        self,
        uid: str,
        status: Mapping[str, Any],
        now: datetime,
        learned: Mapping[str, Any] | None = None,
    ) -> None:
        """``status`` was written at ``now`` (call only after the API accepted it);
        ``learned`` as for ``due``."""
        written = _Written.of(normalised(status, learned), now, status, status)
        with self._lock:
            self._last[uid] = written
            self._unsure.discard(uid)

    def skipped(self, uid: str, status: Mapping[str, Any]) -> None:
        """``status`` was not written (``due`` said so): it is still what the next
        evaluation continues from, its streaks and averages one evaluation further."""
        with self._lock:
            last = self._last.get(uid)
            if last is not None:
                self._last[uid] = replace(last, latest=status)

    def latest(self, uid: str, stored: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The last status rendered for the policy, when the stored one (``stored``) is
        still the last written; None otherwise (nothing kept, or changed by someone else:
        the stored one is then the truth)."""
        with self._lock:
            last = self._last.get(uid)
            if last is not None:
                last = self._share(uid, last, stored)
        if last is None or not last.holds(stored):
            return None
        return last.latest

    def failed(self, uid: str) -> None:
        """A write failed: what the API server holds is unknown, so the next evaluation
        writes whatever it has."""
        with self._lock:
            self._last.pop(uid, None)
            self._unsure.add(uid)

    def forget(self, uid: str) -> None:
        """The policy is gone: drop what was kept for it."""
        with self._lock:
            self._last.pop(uid, None)
            self._unsure.discard(uid)


def refresh_due(uid: str, written_at: datetime, refresh_seconds: float) -> datetime:
    """When a status written at ``written_at`` is refreshed if nothing changes: at the
    policy's own slot, the first moment after the write on its phase (from its uid, as
    the scheduler phases a group: ``schedule.phase_of``), so never more than
    ``refresh_seconds`` after it. Statuses written together (an operator's first start,
    anything that changes every policy at once) are then refreshed spread over the whole
    period, not together again every ``refresh_seconds``; the price is one refresh sooner
    than needed after a write made for a change."""
    due = next_slot(phase_of(uid), refresh_seconds, written_at.timestamp())
    return datetime.fromtimestamp(due, tz=UTC)


def _differing(new: Mapping[str, Any], old: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The fields (dotted, down to the first level that is not a mapping) in which two
    normalised statuses differ."""
    out: list[str] = []
    for key in sorted(set(new) | set(old)):
        a, b = new.get(key), old.get(key)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differing(a, b, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def _observed_at(status: Mapping[str, Any] | None) -> datetime | None:
    """``signals.observedAt`` of a stored status, if it has a readable one."""
    signals = status.get("signals") if isinstance(status, Mapping) else None
    stamp = signals.get("observedAt") if isinstance(signals, Mapping) else None
    try:
        observed = datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except ValueError:
        return None
    if observed is not None and observed.tzinfo is None:
        return observed.replace(tzinfo=UTC)
    return observed
