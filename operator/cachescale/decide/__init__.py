"""The decision layer: a pure function from (policy, snapshot, memory, now) to a decision.

No I/O, no clock, no Kubernetes or Prometheus imports (import-linter enforces it): the
operator and the simulator feed it the same values, and tests can state any situation
by hand. Start at ``engine.decide``; ``docs/decisions.md`` explains it for users. What it
reads is ``cachescale.snapshot.Snapshot``; every reason it writes is in
``cachescale.api.reasons``; every tuning threshold is in ``thresholds.py``.
"""

from cachescale.decide.checks import Finding
from cachescale.decide.decision import Decision
from cachescale.decide.engine import decide
from cachescale.decide.envelope import Envelope
from cachescale.decide.learned import LearnedState

__all__ = [
    "Decision",
    "Envelope",
    "Finding",
    "LearnedState",
    "decide",
]
