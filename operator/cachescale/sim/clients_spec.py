"""What closed-loop chat clients send: the ``clients`` part of a scenario file.

A schema, kept apart from the clients themselves (:mod:`cachescale.sim.clients`) as the
workload's schema is kept apart from its generator: the scenario validates files against
it without the token and hashing machinery.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _ordered(span: tuple[int, int]) -> tuple[int, int]:
    if span[0] > span[1]:
        raise ValueError(f"range {list(span)}: the first bound exceeds the second")
    return span


Length = Annotated[int, Field(ge=1)]
Span = Annotated[tuple[Length, Length], AfterValidator(_ordered)]
"""An inclusive range ``[low, high]`` a length is drawn from, uniformly."""


class ClientsSpec(BaseModel):
    """Closed-loop chat clients: how many, how long they think, what they send."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=1, le=10_000, description="Clients, each one conversation at a time.")
    think_time_s: float = Field(
        default=0.0, ge=0, description="Seconds from an answer to the client's next turn."
    )
    systems: int = Field(
        default=3, ge=1, le=1000, description="System prompts shared by every conversation."
    )
    system_tokens: int = Field(default=160, ge=1, description="Tokens of each system prompt.")
    first_user_tokens: Span = Field(
        default=(64, 256), description="Tokens of a conversation's first user message."
    )
    user_tokens: Span = Field(default=(16, 96), description="Tokens of each later message.")
    output_tokens: Span = Field(
        default=(4, 16), description="Tokens each request generates (its max_tokens)."
    )
    turns: Span = Field(default=(2, 6), description="Turns a conversation lasts.")

    def longest_first_turn(self) -> int:
        """Tokens of the longest first turn with its output: it must fit max_model_len."""
        return self.system_tokens + self.first_user_tokens[1] + self.output_tokens[1]
