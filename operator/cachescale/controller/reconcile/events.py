"""Kubernetes Events about a policy, without flooding.

An Event is written when something happens — an alert raised or cleared, a change
applied, a new problem with the target — never on every evaluation. On top of that, an
identical event (same policy, type, reason and message) is not repeated within
``REPEAT_AFTER_S``; a changed message (new numbers) is a new event. Events go to the
core/v1 API with the policy as the involved object, so ``kubectl describe csp`` lists
them. The memory of recent events is shared by the evaluation threads (a lock) and
pruned at most every ``PRUNE_EVERY_S``: pruning it on every event would cost time in the
number of events remembered, quadratic in the number of policies over a first round.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from datetime import datetime

from cachescale.api.policy import API_VERSION, KIND
from cachescale.controller.kube.client import KubeApi

REPEAT_AFTER_S = 3600.0
PRUNE_EVERY_S = 60.0
COMPONENT = "cachescale"


@dataclass(frozen=True)
class PolicyRef:
    """The policy an event is about."""

    namespace: str
    name: str
    uid: str


@dataclass
class EventRecorder:
    """Posts events and remembers recent ones to drop repeats."""

    api: KubeApi
    sent: dict[tuple[str, str, str, str], datetime] = field(default_factory=dict)
    _pruned_at: datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self, policy: PolicyRef, kind: str, reason: str, message: str, now: datetime
    ) -> bool:
        """Post one event unless the same one went out within the repeat window."""
        key = (policy.uid, kind, reason, message)
        with self._lock:
            last = self.sent.get(key)
            if last is not None and (now - last).total_seconds() < REPEAT_AFTER_S:
                return False
            self._prune(now)
            self.sent[key] = now
        digest = hashlib.sha256("/".join(key).encode()).hexdigest()[:10]
        stamp = now.isoformat()
        self.api.post(
            f"/api/v1/namespaces/{policy.namespace}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{policy.name}.{digest}{int(now.timestamp())}",
                    "namespace": policy.namespace,
                },
                "involvedObject": {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": policy.name,
                    "namespace": policy.namespace,
                    "uid": policy.uid,
                },
                "type": kind,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            },
        )
        return True

    def _prune(self, now: datetime) -> None:
        """Forget events older than the repeat window, at most every ``PRUNE_EVERY_S``
        (under the lock)."""
        if self._pruned_at is not None and (now - self._pruned_at).total_seconds() < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        self.sent = {
            k: t for k, t in self.sent.items() if (now - t).total_seconds() < REPEAT_AFTER_S
        }
