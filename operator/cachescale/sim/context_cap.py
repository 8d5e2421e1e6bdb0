"""The open-loop request stream with conversations capped at the engine's ``max_model_len``.

vLLM refuses a request whose prompt and output pass ``--max-model-len``, so a real chat
client cannot let a conversation grow without end. When a scenario states its engine
(``fleet.engine``), every conversation of the open-loop stream is kept below that length:
a session whose history has grown past what the longest possible turn leaves of
``max_model_len`` restarts (its history is dropped, its tenant, topic and retrieval kept)
before its next turn is built, as a user opens a new chat when the old one is full. The
longest turn without history counts every segment at its largest (all tools, the system
prompt, ``top_k`` chunks at the largest chunk size in force, the longest user turn, the
variable field and the longest output); a workload whose turn could pass
``max_model_len`` even without history is refused
(:func:`~cachescale.sim.engine_spec.longest_turn_tokens`).

Without an engine section nothing is capped and the stream is the one it always was.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachescale.sim.engine_spec import longest_turn_tokens
from cachescale.sim.prompts import Session
from cachescale.sim.traffic import Traffic
from cachescale.sim.traffic_spec import Perturbation, WorkloadSpec


class CappedTraffic(Traffic):
    """:class:`~cachescale.sim.traffic.Traffic` whose conversations restart before a turn
    could pass ``max_model_len``."""

    def __init__(
        self,
        spec: WorkloadSpec,
        max_model_len: int,
        *,
        seed: int,
        perturbations: Sequence[Perturbation],
        until_s: float,
    ) -> None:
        super().__init__(spec, seed=seed, perturbations=perturbations, until_s=until_s)
        self._history_budget = max_model_len - longest_turn_tokens(spec, perturbations)
        if self._history_budget < 0:
            raise ValueError("a turn can pass max_model_len without any history")
        self.restarts = 0
        """Conversations restarted because they grew too long."""

    def _session(self) -> Session:
        session = super()._session()
        if session.history_tokens > self._history_budget:
            session.turns.clear()
            session.history_tokens = 0
            self.restarts += 1
        return session
