"""The last ``--max-num-seqs`` change as the learned state remembers it: the step, the cache
under the old ceiling, and running means of the cache under the new one
(``decide.follow_through`` judges whether it paid)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from cachescale.api.base import ApiModel
from cachescale.api.reasons import Action


class Mean(ApiModel):
    """A running mean: the sum and count of the values folded in."""

    total: float = 0.0
    samples: int = 0

    def add(self, value: float | None) -> Mean:
        """Fold one value in (unknown: nothing changes)."""
        if value is None:
            return self
        return Mean(total=self.total + value, samples=self.samples + 1)

    @property
    def value(self) -> float | None:
        """The mean, None before any value."""
        return self.total / self.samples if self.samples else None


class CeilingStep(ApiModel):
    """The last ``--max-num-seqs`` change, the cache under the old ceiling, and the cache
    since under the new one: a cooldown later, the next step toward B_max is taken only if
    this one paid (``decide.batching``, the follow-through rule). Means over the warm
    evaluations, not one reading: a windowed rate of a few warm pods wobbles by several
    points from one evaluation to the next."""

    at: datetime
    before: int
    after: int
    reason: Action
    warm_hit_rate: float | None = None
    """The warm pods' token hit rate under the old ceiling (its mean since that ceiling's
    pods warmed, when the step before was remembered)."""
    preemption_share: float | None = None
    """Preemptions per finished request under the old ceiling (likewise)."""
    hit_rate_since: Mean = Field(default_factory=Mean)
    """The warm hit rate at each evaluation since the new ceiling's pods warmed."""
    preemptions_since: Mean = Field(default_factory=Mean)
    """Preemptions per finished request at the same evaluations."""
    cost: float | None = None
    """GPU-seconds per 1k requests under the old ceiling (likewise)."""
    cost_since: Mean = Field(default_factory=Mean)
    """GPU-seconds per 1k requests at the same evaluations."""
