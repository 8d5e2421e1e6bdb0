"""The one request type shared by the traffic generator, the router and the engine.

A request arrives carrying the chained block hashes of its whole token sequence (prompt
followed by the output it will generate), computed once by the traffic generator, so the
engine never hashes and a multi-turn follow-up can hit the blocks this turn's output filled.
Ground-truth outcomes (cached tokens at admission, TTFT, preemptions) are written back here
by the engine so the reports can see what a token-weighted counter cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter


@dataclass(slots=True, eq=False)
class SimRequest:
    """One inference request as the engine sees it, plus its ground-truth outcome."""

    request_id: int
    arrival_s: float
    tenant: str
    prefix_group: int
    prompt_tokens: int
    output_tokens: int
    # Chained hashes of every *full* block of prompt + output, in order (block 0 first).
    # The first ``prompt_tokens // block_size`` of them cover the prompt.
    block_hashes: list[bytes]
    # Filled in by the engine.
    cached_tokens: int | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_preemptions: int = 0
    replica: int | None = None
    aborted_s: float | None = None
    """When the client gave up waiting (``workload.client_timeout_s``); it never finishes."""
    scheduled_s: float | None = None
    """When the engine first admitted it (vLLM's first ``SCHEDULED`` event, which ends its
    queue time); a preempted request keeps its first."""
    max_tokens: int | None = None
    """The client's ``max_tokens``, or None when it set none (the workload's requests end by
    themselves); a request whose output reaches it finishes by ``length``."""

    def __reduce__(self) -> tuple[type[SimRequest], tuple[object, ...]]:
        """Pickled as its fields in order (a run finished in another process sends its
        requests back): about half the time of pickling a slotted object's state."""
        return SimRequest, _FIELDS(self)

    @property
    def ttft_s(self) -> float | None:
        """Seconds from arrival to the first output token, queueing included (as vLLM)."""
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def prefill_computed_tokens(self) -> int | None:
        """Prompt tokens the engine had to compute (``prompt - cached``), as vLLM reports."""
        if self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens


_FIELDS = attrgetter(*(f.name for f in fields(SimRequest)))
"""A request's fields, in order: its constructor's arguments."""
