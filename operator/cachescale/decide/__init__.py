"""The decision layer: a pure function from (policy, snapshot, memory, now) to a decision.

No I/O, no clock, no Kubernetes or Prometheus imports (import-linter enforces it): the
operator and the simulator feed it the same values, and tests can state any situation
by hand. Start at ``engine.decide``; ``docs/decisions.md`` explains it for users.
"""

from cachescale.decide.diagnosis import Diagnosis, Finding
from cachescale.decide.engine import Decision, decide
from cachescale.decide.envelope import Envelope
from cachescale.decide.inputs import HPAState, HumanRequests, Snapshot, WorkloadState
from cachescale.decide.memory import Memory

__all__ = [
    "Decision",
    "Diagnosis",
    "Envelope",
    "Finding",
    "HPAState",
    "HumanRequests",
    "Memory",
    "Snapshot",
    "WorkloadState",
    "decide",
]
