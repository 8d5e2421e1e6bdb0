"""The policies this replica serves: each registered with the scheduler, and the job
that evaluates a group of them when the scheduler says it is due.

kopf's watch events (``handlers.membership``) make a policy a :class:`Member` of the
:class:`Runtime`, shared by every handler through kopf's ``memo``: it is registered with
the scheduler (``controller/reconcile/scheduler.py``) under its gather group
(:func:`gather_group`) and interval (:func:`interval_of`), both read again from its latest
body each time they matter. There is no task per policy: an idle task per policy would
cost memory and CPU with the number of policies, a dict entry does not.

The scheduler submits the policies of one gather group that are due together as one job
to a bounded worker pool: the event loop never waits on I/O, the group's signals are read
with one query set (``evaluation.evaluate_many``), and a slow Prometheus delays only the
groups that read it. An exception in one policy's evaluation is logged, counted and
retried next round; it never stops that policy's schedule or any other. A policy's
evaluation and the delete handler's restore never overlap, and no evaluation starts once
the restore has begun (:class:`Guard`).

A cluster-wide shard follows its targets only where its policies are
(:attr:`Runtime.targets`, ``controller/kube/target_informers.py``): the informers of a namespace
start as its first member joins and stop as its last leaves (a peering pause, which
forgets every policy, stops them all; the relisting on resume starts them again).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections import Counter
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import kopf

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.reasons import Problem
from cachescale.api.spec import MetricsSpec
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import Outcome, evaluate_many
from cachescale.controller.reconcile.fairness import DEFAULT_PER_NAMESPACE
from cachescale.controller.reconcile.schedule import Due
from cachescale.controller.reconcile.scheduler import Job, Scheduler
from cachescale.controller.target.claims import (
    Claimant,
    ClaimKey,
    OperatorIdentity,
    Refusal,
    refusal,
)
from cachescale.gather.grouping import Source

DEFAULT_INTERVAL: Final[str] = MetricsSpec.model_fields["interval"].default
"""``spec.metrics.interval`` when a policy leaves it out: the spec model's default."""
DEFAULT_WINDOW: Final[str] = MetricsSpec.model_fields["window"].default
"""``spec.metrics.window`` when a policy leaves it out."""
WORKERS = 16
"""Group jobs running at once (each mostly waits on HTTP)."""
PHASE_WORKERS = 16
"""Policies of the running jobs prepared or finished at once (Kubernetes reads and writes)."""

log = logging.getLogger("cachescale.operator")


@dataclass
class Guard:
    """One policy's evaluations and its restore: they never overlap, and once the
    restore has begun no evaluation starts."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    retired: bool = False

    def retire(self) -> None:
        """Wait out an evaluation under way, then refuse any later one (blocking)."""
        with self.lock:
            self.retired = True


class TargetScopes(Protocol):
    """Where the targets of a namespace's policies are followed: on-demand informers
    (``controller/kube/target_informers.py`` ``TargetInformers``). Both calls return at once."""

    def open(self, namespace: str) -> None:
        """Start following ``namespace``: its first policy joined."""
        ...

    def close(self, namespace: str) -> None:
        """Stop following ``namespace``: its last policy left."""
        ...


@dataclass
class Member:
    """A policy registered with the scheduler, as its last watch event left it."""

    body: Mapping[str, Any]
    """The object as last seen, less its ``managedFields`` (:func:`retained`): each
    evaluation reads it as it is then."""
    claims: kopf.Index[ClaimKey, Claimant]
    guard: Guard
    registered: bool = True
    departed: bool = False
    """It left this operator's watch while it still exists: its metrics go."""


@dataclass
class Runtime:
    """Shared by every handler through kopf's ``memo``."""

    operator: Operator
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WORKERS, thread_name_prefix="evaluate")
    )
    phases: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(PHASE_WORKERS, thread_name_prefix="policy")
    )
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    guards: dict[str, Guard] = field(default_factory=dict)
    """Per policy (uid): its evaluations and the delete handler's restore never overlap."""
    members: dict[str, Member] = field(default_factory=dict)
    """Per policy (uid) registered with the scheduler."""
    itself: OperatorIdentity | None = None
    """The operator's own Deployment, which no policy may target (``target/claims.py``)."""
    scanning: bool = True
    """Whether kopf lists and watches namespaces and CRDs. Off where RBAC grants neither
    (namespaced Roles): otherwise kopf retries the forbidden lists with backoff for about
    a minute before it serves anything, and keeps logging the 403s."""
    active: bool = True
    """Whether this replica acts: always when standalone; with ``--peering`` while
    kopf's rule says so (``controller/kube/peering.py``)."""
    max_concurrent_per_namespace: int = DEFAULT_PER_NAMESPACE
    """Jobs of one namespace's policies running at once (``--max-concurrent-per-namespace``;
    ``controller/reconcile/fairness.py``)."""
    targets: TargetScopes | None = None
    """A cluster-wide shard's informers, opened for a namespace when its first member
    joins and closed when its last leaves; None: informers of fixed scopes, started with
    the operator."""
    scheduler: Scheduler[str] = field(init=False)
    _per_namespace: Counter[str] = field(init=False, default_factory=Counter)
    """With :attr:`targets`: how many members each namespace has."""

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(
            self._job,
            self.executor,
            self.operator.metrics,
            workers=WORKERS,
            per_namespace=self.max_concurrent_per_namespace,
        )

    def guard(self, uid: str) -> Guard:
        """The policy's guard (created on first use)."""
        return self.guards.setdefault(uid, Guard())

    def join(self, body: kopf.Body, claims: kopf.Index[ClaimKey, Claimant]) -> None:
        """Register the policy, or have its next evaluation read this newer body (its
        interval and group are read from the body each time they matter)."""
        policy = PolicyObject.of(body)
        uid = policy.uid
        member = self.members.get(uid)
        if member is not None:
            member.body, member.claims = retained(body), claims
            return
        member = self.members[uid] = Member(retained(body), claims, self.guard(uid))
        default_url = self.operator.default_prometheus_url
        self.scheduler.register(
            uid,
            interval=lambda: interval_of(member.body.get("spec", {})),
            group=lambda: gather_group(member.body, default_url),
            namespace=policy.namespace,
        )
        self._count(policy.namespace, 1)

    def leave(self, uid: str, departed: bool = False) -> None:
        """Stop evaluating the policy (an evaluation under way ends as it would)."""
        member = self.members.pop(uid, None)
        if member is not None:
            member.registered = False
            member.departed = departed
            self.scheduler.unregister(uid)
            self._count(PolicyObject.of(member.body).namespace, -1)

    def _count(self, namespace: str, change: int) -> None:
        """With :attr:`targets`: a member of ``namespace`` joined (1) or left (-1); the
        namespace's targets are followed from its first member to its last."""
        if self.targets is None:
            return
        members = self._per_namespace[namespace] = self._per_namespace[namespace] + change
        if members == 1 and change > 0:
            self.targets.open(namespace)
        elif members == 0:
            del self._per_namespace[namespace]
            self.targets.close(namespace)

    def turn(self, active: bool) -> None:
        """Peering: act or pause. A pause forgets every policy, as kopf stops watching
        then; kopf relists on resume, and every policy that still exists joins again."""
        self.active = active
        if not active:
            for uid in list(self.members):
                self.leave(uid)

    def _job(self, due: list[Due[str]]) -> Job:
        """On the event loop: each due policy as it is now, and its refusal (the
        ``claims`` index is kopf's, read on its loop); the job evaluates them."""
        batch = []
        if not self.active:  # joined from an event that came in as the pause began
            return lambda: None
        for member in (self.members.get(d.key) for d in due):
            if member is None or member.body.get("metadata", {}).get("deletionTimestamp"):
                continue  # unregistered, or being deleted: the restore has the last word
            policy = PolicyObject.of(member.body)
            try:
                refused = refusal(member.body, member.claims, self.itself)
            except Exception:  # one policy's bug must not fail its group
                log.exception("evaluation of %s/%s failed", policy.namespace, policy.name)
                self.operator.metrics.failed(policy.namespace, policy.name, Problem.INTERNAL)
                continue
            batch.append((member, policy, refused))
        return lambda: _evaluate_batch(self, batch)


def interval_of(spec: Any) -> float:
    """The policy's evaluation interval (the default when the spec cannot be read)."""
    try:
        return parse_duration_seconds(
            str(spec.get("metrics", {}).get("interval", DEFAULT_INTERVAL))
        )
    except (ValueError, AttributeError):
        return parse_duration_seconds(DEFAULT_INTERVAL)


def retained(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a member keeps of its policy's body: all of it but ``metadata.managedFields``,
    its keys and short strings shared (``_shared``).

    The API server's record of which client wrote which field (one entry per writer, the
    status writes' mirroring the whole status) is a large share of a parsed policy, and
    nothing here reads it. kopf's object is left as it is."""
    metadata = body.get("metadata", {})
    kept = {**body, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    shared: dict[str, Any] = _shared(kept)
    return shared


SHARED_TEXT_CHARS: Final = 16
"""The longest string value a member's body shares with every other body (``sys.intern``):
words such as ``True``, a condition's type or reason, a namespace; longer ones (messages,
times) are mostly one policy's own."""


def _shared(value: Any) -> Any:
    """``value`` (JSON-shaped) rebuilt with each key, and each string of at most
    ``SHARED_TEXT_CHARS``, one string for the whole process. The JSON decoder makes every
    body's keys anew, and the same keys and words recur in every policy the operator
    holds."""
    if isinstance(value, Mapping):
        return {sys.intern(key): _shared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shared(item) for item in value]
    if isinstance(value, str) and len(value) <= SHARED_TEXT_CHARS:
        return sys.intern(value)
    return value


def gather_group(body: Mapping[str, Any], default_url: str | None) -> Hashable:
    """Which policies are due together: those reading one Prometheus (URL and
    credentials, ``gather/grouping.Source``) over one window. It only times the
    evaluations; the read itself groups by resolved client and selector
    (``gather/grouped.py``). A spec that cannot be read is a group of its own."""
    try:
        metrics = body.get("spec", {}).get("metrics", {})
        window = parse_duration_seconds(str(metrics.get("window", DEFAULT_WINDOW)))
        return (Source.of(metrics, body["metadata"]["namespace"], default_url), window)
    except (AttributeError, KeyError, TypeError, ValueError):
        return ("unreadable", body.get("metadata", {}).get("uid"))


def _evaluate_batch(
    runtime: Runtime, batch: list[tuple[Member, PolicyObject, Refusal | None]]
) -> None:
    """In a worker: evaluate a group's due policies together, each under its guard. A
    policy whose guard is held (its restore, or a job of the group it just left) or that
    was unregistered or retired since it was found due is skipped this round. A policy
    unregistered mid-evaluation (peering pause, deletion) does not stop the worker, so
    the log line of each evaluation comes from here."""
    held = [item for item in batch if item[0].guard.lock.acquire(blocking=False)]
    try:
        serving = [item for item in held if item[0].registered and not item[0].guard.retired]
        outcomes = evaluate_many(
            runtime.operator,
            [(policy, refused) for _, policy, refused in serving],
            runtime.phases.map,
        )
        for (member, policy, _), outcome in zip(serving, outcomes, strict=True):
            _log(runtime, policy, outcome)
            if member.departed:  # it left the watch while it was being evaluated
                runtime.operator.metrics.forget(policy.namespace, policy.name)
    finally:
        for member, _, _ in held:
            member.guard.lock.release()


def _log(runtime: Runtime, policy: PolicyObject, outcome: Outcome | Exception) -> None:
    """An evaluation's log line; an exception (a bug) is logged and counted."""
    if isinstance(outcome, Exception):
        log.error("evaluation of %s/%s failed", policy.namespace, policy.name, exc_info=outcome)
        runtime.operator.metrics.failed(policy.namespace, policy.name, Problem.INTERNAL)
    else:
        log.info("%s/%s: %s", policy.namespace, policy.name, outcome.reason)
