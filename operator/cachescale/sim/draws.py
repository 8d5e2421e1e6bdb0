"""Seeded random draws for the request stream: batched numbers, token ids, lengths.

The stream draws a few numbers per request, so each draw must cost an index bump, not a
numpy call: a ``Draws`` fills a batch from its own seeded ``numpy`` Generator and hands it
out one value at a time. The values, and their order, depend only on the seed sequence
the stream gives it. A segment that must be the same wherever it recurs (a tool
definition, a system prompt, a document) draws its tokens from a generator of its own
keyed by what it is (``fixed_tokens``), so its content does not depend on when it is
first used.
"""

from __future__ import annotations

import math

import numpy as np

from cachescale.sim.hashing import TOKEN_BYTES
from cachescale.sim.traffic_spec import LengthDist

VOCAB_SIZE = 32_000
"""Token ids are drawn from ``[0, VOCAB_SIZE)``."""

_BATCH = 8192
_TOKEN_BATCH = 1 << 20


class Draws:
    """Batched draws from one seeded numpy Generator (per-call cost: an index bump)."""

    def __init__(self, seed_seq: np.random.SeedSequence) -> None:
        self._rng = np.random.default_rng(seed_seq)
        self._u: list[float] = []
        self._ui = 0
        self._z: list[float] = []
        self._zi = 0
        self._e: list[float] = []
        self._ei = 0
        self._tok = b""
        self._ti = 0

    def uniform(self) -> float:
        """A uniform draw in ``[0, 1)``."""
        if self._ui == len(self._u):
            self._u, self._ui = self._rng.random(_BATCH).tolist(), 0
        self._ui += 1
        return self._u[self._ui - 1]

    def normal(self) -> float:
        """A standard normal draw."""
        if self._zi == len(self._z):
            self._z, self._zi = self._rng.standard_normal(_BATCH).tolist(), 0
        self._zi += 1
        return self._z[self._zi - 1]

    def exponential(self) -> float:
        """A standard exponential draw (mean 1)."""
        if self._ei == len(self._e):
            self._e, self._ei = self._rng.standard_exponential(_BATCH).tolist(), 0
        self._ei += 1
        return self._e[self._ei - 1]

    def tokens(self, n: int) -> bytes:
        """``n`` fresh token ids as int32 bytes."""
        width = n * TOKEN_BYTES
        if self._ti + width > len(self._tok):
            size = max(_TOKEN_BATCH, n)
            self._tok = self._rng.integers(0, VOCAB_SIZE, size, dtype=np.int32).tobytes()
            self._ti = 0
        self._ti += width
        return self._tok[self._ti - width : self._ti]

    def length(self, dist: LengthDist) -> int:
        """A token count from ``dist``: lognormal with its mean, rounded and clipped."""
        mu = math.log(dist.mean_tokens) - dist.sigma**2 / 2
        n = round(math.exp(mu + dist.sigma * self.normal()))
        return min(max(n, dist.min_tokens), dist.max_tokens)


def fixed_tokens(seed: int, stream: int, *key: int, n: int) -> bytes:
    """Token ids that depend only on (seed, stream, key): a reusable segment's content."""
    rng = np.random.default_rng([seed, stream, *key])
    return rng.integers(0, VOCAB_SIZE, n, dtype=np.int32).tobytes()
