"""Failed reads in a row, per policy: what ``decide.engine.read_retried`` counts.

One timed-out answer from Prometheus should not raise ``MetricsUnavailable``, write the
status and post Events, only to clear all of it at the next interval: the first failed
read of a run is retried instead (``READ_FAILURES_TO_FREEZE``). The count is this
process's, in memory, so retrying writes nothing; a restart starts it over, and a
policy already frozen on a known outage stays frozen (its stored alert says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from threading import Lock

from cachescale.snapshot import EngineSignals


@dataclass
class ReadFailures:
    """Failed reads in a row per policy (by uid); thread-safe, since evaluations run in
    worker threads."""

    _in_a_row: dict[str, int] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)

    def counted(self, uid: str, signals: EngineSignals) -> int:
        """The failed reads in a row with this one (0: this read did not fail)."""
        with self._lock:
            if signals.failure is None:
                self._in_a_row.pop(uid, None)
                return 0
            failed = self._in_a_row[uid] = self._in_a_row.get(uid, 0) + 1
            return failed

    def forget(self, uid: str) -> None:
        """The policy is gone: drop its count."""
        with self._lock:
            self._in_a_row.pop(uid, None)
