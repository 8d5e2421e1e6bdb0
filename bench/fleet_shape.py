"""Who is where in the bench's fleet: each policy's namespace, hit rate, operator shard,
and whether its signals move, its pod restarts or it reads through the slow proxy.

One place that both halves of the rig read (``bench/fleet_engines.py`` serves the engines'
series, ``bench/fleet_rig.py`` creates the objects and restarts pods) and the bench reads
too, so a policy's namespace in its selector, in its engine's series and in the API
server agree by construction. Everything is a pure function of the policy's index and
the options: two runs with the same options build the same fleet.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from cachescale.gather.grouping import DEFAULT_MAX_GROUP_SIZE
from tests.controller.cluster import NAMESPACE

HIT_SHARES = (0.3, 0.9)
"""The range of the engines' prefix-cache hit rates (token-weighted), one per policy."""
GOLDEN = 0.6180339887498949
"""Steps the hit rate by the golden ratio's fraction per policy index: any run of
consecutive policies covers the range evenly, neighbours differ."""
CYCLE_S = 600.0
"""A moving policy's cycle: its hit rate halves, requests queue and TTFT passes the SLO
for :data:`FALL_S` once every this many seconds."""
FALL_S = 120.0
"""How long a moving policy's fall lasts in each cycle, before it recovers."""
SHARD_LABEL = "shard"
"""The policy label operator shards select on (``--policy-selector shard=I``), as
docs/install.md's Sharding labels a namespace's policies."""


def name_of(k: int) -> str:
    """Policy ``k``'s name, and its Deployment's, HPA's and model's; unique in the fleet."""
    return f"p{k:05d}"


def groupable(k: int) -> bool:
    """Nine policies in ten share label names; the tenth has one of its own."""
    return k % 10 != 9


def slowable(k: int) -> bool:
    """One policy in four (one Prometheus URL, one window: one scheduling group) may read
    through the slow proxy: those that read ``localhost`` over the 5m window."""
    return k % 4 == 3


def picked(count: int, share: float, salt: str) -> list[int]:
    """``round(share × count)`` policy indices, sorted, drawn with a fixed seed per
    ``salt`` (so the moving and restarting policies are two independent draws)."""
    return sorted(random.Random(salt).sample(range(count), round(share * count)))


@dataclass
class Shape:
    """The fleet's layout for ``count`` policies under the bench's options."""

    count: int
    namespaces: int = 1
    """``1``: every policy in ``llm`` (the tests' namespace); more: round-robin over
    ``llm-0`` … ``llm-{N-1}``."""
    moving: float = 0.0
    """Share of policies whose signals move (:data:`CYCLE_S`)."""
    restarting: float = 0.0
    """Share of pods deleted and re-created during the steady window."""
    shards: int = 1
    """Operator processes, each serving the policies of every ``shards``-th namespace
    (:meth:`shard`); 1: one operator serving them all."""
    slow: bool = False
    """Whether one chunk's policies (:attr:`slowed`) read through the slow proxy."""
    phases: dict[int, float] = field(init=False)
    """Each moving policy's offset of its cycle from the engines' start: spread evenly
    over the cycle, so each interval sees the same share of falls and recoveries."""
    restarts: list[int] = field(init=False)
    """The policies whose pod restarts, in restart order."""
    slowed: frozenset[int] = field(init=False)
    """With ``slow``, the first :data:`DEFAULT_MAX_GROUP_SIZE` ``slowable`` policies: one
    Prometheus URL of their own and one window, so one gather group and one chunk."""

    def __post_init__(self) -> None:
        movers = picked(self.count, self.moving, "moving")
        self.phases = {k: CYCLE_S * i / len(movers) for i, k in enumerate(movers)}
        self.restarts = picked(self.count, self.restarting, "restarting")
        slowable_ones = (k for k in range(self.count) if slowable(k))
        chunk = list(itertools.islice(slowable_ones, DEFAULT_MAX_GROUP_SIZE))
        self.slowed = frozenset(chunk if self.slow else ())

    def namespace(self, k: int) -> str:
        return NAMESPACE if self.namespaces == 1 else f"llm-{k % self.namespaces}"

    def all_namespaces(self) -> list[str]:
        return [self.namespace(k) for k in range(min(self.count, self.namespaces))]

    def shard(self, k: int) -> int:
        """The operator shard serving policy ``k``: its namespace's index modulo
        ``shards``, so every namespace's policies are in one shard (0 with one shard)."""
        return (k % self.namespaces) % self.shards

    def key(self, k: int) -> str:
        """``namespace/name``: how the operator's series name policy ``k``."""
        return f"{self.namespace(k)}/{name_of(k)}"

    def keys(self) -> list[str]:
        return [self.key(k) for k in range(self.count)]

    def hit_share(self, k: int) -> float:
        """Policy ``k``'s engine's hit rate while it is not falling."""
        low, high = HIT_SHARES
        return low + (high - low) * ((k * GOLDEN) % 1.0)

    def fallen_s(self, k: int, start: float, t: float) -> float:
        """Seconds policy ``k`` spent falling from ``start`` (the engines' start) until
        ``t``: 0 for a policy that does not move. Never decreases with ``t``."""
        phase = self.phases.get(k)
        if phase is None or t <= start + phase:
            return 0.0
        cycles, into = divmod(t - start - phase, CYCLE_S)
        return cycles * FALL_S + min(into, FALL_S)

    def backlog_s(self, k: int, start: float, t: float) -> float:
        """How many seconds' worth of queue policy ``k`` holds at ``t``: it grows through
        each fall and drains as fast after it, 0 for a policy that does not move."""
        phase = self.phases.get(k)
        if phase is None or t <= start + phase:
            return 0.0
        into = (t - start - phase) % CYCLE_S
        return into if into < FALL_S else max(0.0, 2 * FALL_S - into)

    def words(self) -> str:
        """The layout in words, for the bench's setup line."""
        spread = "" if self.namespaces == 1 else " (round-robin, the operator cluster-wide)"
        low, high = HIT_SHARES
        moving = (
            f"{100 * self.moving:g}% of policies moving ({len(self.phases):,}: hit rate "
            f"halved, a queue growing and TTFT over the SLO for {FALL_S:.0f} s of every "
            f"{CYCLE_S:.0f} s, staggered)"
            if self.phases
            else "no policy moving"
        )
        restarting = (
            f"{100 * self.restarting:g}% of pods restarted during the steady window "
            f"({len(self.restarts):,}: deleted, re-created under a new name)"
            if self.restarts
            else "no pod restarted"
        )
        plural = "s" if self.namespaces > 1 else ""
        sharded = (
            [
                f"{self.shards} operator shards by namespace (each cluster-wide with "
                f"--policy-selector {SHARD_LABEL}=I, I the namespace's index modulo "
                f"{self.shards})"
            ]
            if self.shards > 1
            else []
        )
        slowed = (
            [f"{len(self.slowed):,} policies (one chunk) reading Prometheus through a slow proxy"]
            if self.slowed
            else []
        )
        return "; ".join(
            [
                f"{self.namespaces:,} namespace{plural}{spread}",
                f"engine hit rates {low:g}–{high:g} by policy",
                moving,
                restarting,
                *sharded,
                *slowed,
            ]
        )
