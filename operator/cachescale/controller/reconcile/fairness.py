"""Fair scheduling: which due group's job may start now, so that one namespace's slow or
failing Prometheus never delays another namespace's policies.

A policy author is untrusted. The scheduler (``scheduler.py``), not the executor, decides
when a job starts: it never submits more jobs than the pool has workers, so no job waits
in the executor's queue behind another namespace's. A job's namespaces are those of the
policies in it; it is charged to each of them while it runs. The rule for starting a due
group's job (:class:`Pool`):

- *per-namespace limit*: it may start while at least one of its namespaces runs fewer
  than ``per_namespace`` jobs (``--max-concurrent-per-namespace``). A group spanning
  namespaces (policies of several namespaces reading one Prometheus without credentials,
  e.g. the operator's default one) is every one of its namespaces' evaluation: any of them
  entitled to a worker lets it start, so a namespace at its limit cannot hold back another
  namespace's policies by sharing a group with them, and charging it to all of them means
  a namespace gains no more jobs through shared groups than the others it shares with;
- *reserve*: the last ``reserved`` workers (a quarter of the pool, at least one) go only
  to jobs of which a namespace has no job running, so neither one namespace nor several
  at their limits take the whole pool;
- *order*: among the groups that may start, those whose least busy namespace runs the
  fewest jobs go first, then those of the namespace that started a job longest ago (round
  robin over the namespaces waiting), then the longest waiting (per namespace, first due
  first served): a namespace at its limit is throttled, never starved, and its policies
  are each evaluated in turn.

The invariants: a namespace never runs more than ``per_namespace`` jobs of its own
policies alone; a job of a namespace already running one starts only while more than
``reserved`` workers are free, so at most ``workers - reserved`` running jobs were started
that way; and a job of a namespace running none waits for a worker only while every
worker is busy, at least ``reserved`` of them with jobs started for namespaces that were
running none. Whatever other namespaces' Prometheus does, that is all a victim waits for.
A job that overruns keeps its worker (a thread cannot be stopped) but counts only against
its own namespaces: the evaluation's deadline ends its reads (``gather/prometheus.py``),
and until then it delays nothing outside them. There is no bound per Prometheus endpoint:
the namespace limit already bounds a tenant however many URLs it may name (the allow list
decides which), and a bound per endpoint would let one tenant's slow jobs on a shared
Prometheus hold back another tenant's.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

DEFAULT_PER_NAMESPACE = 4
"""Jobs of one namespace running at once (``--max-concurrent-per-namespace``)."""

RESERVED_SHARE = 4
"""A pool of ``n`` workers keeps ``n // RESERVED_SHARE`` of them (at least one) for jobs
of which a namespace has no job running (module doc)."""

NAMESPACE_LIMIT = "namespace"
"""A group held back because each of its namespaces runs ``per_namespace`` jobs."""
WORKER_LIMIT = "workers"
"""A group held back because no worker is free for it (the pool is full, or only its
reserve is left)."""


@dataclass
class Pool:
    """Which job may start now (module doc): the jobs running, in all and per namespace,
    against the per-namespace limit and the reserve. None for ``workers`` or
    ``per_namespace``: no such limit."""

    workers: int | None = None
    per_namespace: int | None = None
    running: int = 0
    by_namespace: Counter[str] = field(default_factory=Counter)
    served: dict[str, int] = field(default_factory=dict)
    """Per namespace, the number of the latest job started for it (a later job: a
    higher number; a namespace never served has none)."""
    _starts: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def reserved(self) -> int:
        """Workers only a job of which a namespace has no job running may take."""
        return 0 if self.workers is None else max(1, self.workers // RESERVED_SHARE)

    def holds_back(self, namespaces: Collection[str]) -> str | None:
        """Why a job of ``namespaces`` may not start now (``NAMESPACE_LIMIT`` or
        ``WORKER_LIMIT``), or None: it may."""
        least = self.rank(namespaces)
        if self.per_namespace is not None and namespaces and least >= self.per_namespace:
            return NAMESPACE_LIMIT
        if self.workers is None:
            return None
        free = self.workers - self.running
        if free <= 0 or (least > 0 and free <= self.reserved):
            return WORKER_LIMIT
        return None

    def rank(self, namespaces: Collection[str]) -> int:
        """Jobs running of the least busy of ``namespaces`` (0 for none)."""
        return min((self.by_namespace[ns] for ns in namespaces), default=0)

    def turn(self, namespaces: Collection[str]) -> int:
        """When the least recently served of ``namespaces`` last started a job (-1 for
        never, or no namespace): the lower, the sooner its turn."""
        return min((self.served.get(ns, -1) for ns in namespaces), default=-1)

    def start(self, namespaces: Collection[str]) -> None:
        """A job of ``namespaces`` started: charged to each."""
        self.running += 1
        self.by_namespace.update(namespaces)
        number = next(self._starts)
        self.served.update((ns, number) for ns in namespaces)

    def end(self, namespaces: Collection[str]) -> None:
        """A job of ``namespaces`` ended."""
        self.running -= 1
        self.by_namespace.subtract(namespaces)
        for namespace in namespaces:
            if self.by_namespace[namespace] <= 0:
                del self.by_namespace[namespace]
