"""The kopf side: policies registered with the scheduler, HPA restore on delete, probes.

kopf watches the policies, holds their finalizers and pauses the operator when a peer
with a higher priority is active; the scheduler (``scheduler.py``) decides when each
policy is evaluated. Every watch event of a ``CacheScalingPolicy`` reaches
:func:`membership`, which registers the policy with the scheduler (or refreshes the body
it will be evaluated from) and unregisters it once it is being deleted or has left the
watch (deleted, or relabelled out of ``--policy-selector``). There is no task per policy:
an idle kopf daemon per policy cost about 190 KiB and 1.7 ms of CPU a minute
(docs/decisions.md, "Scheduling evaluations"). With ``--peering`` the operator follows
kopf's pause itself (``peering.py``): on a pause every policy is unregistered and nothing
is submitted, and kopf's relisting on resume registers each policy that still exists.

The scheduler submits the policies of one gather group that are due together as one
job to a bounded worker pool: the event loop never waits on I/O, the group's signals are
read with one query set (``evaluation.evaluate_many``), and a slow Prometheus delays only
the groups that read it. An exception in one policy's evaluation is logged, counted and
retried next round; it never stops that policy's schedule or any other. A policy's
evaluation and the delete handler's restore never overlap, and no evaluation starts once
the restore has begun (:class:`Guard`).

kopf keeps its own bookkeeping (handler progress, the last-handled spec, the finalizer)
in annotations under ``cachescale.dev``: the status schema is strict and written only by
us, through the status subresource.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.policy import ANNOTATION_PREFIX, GROUP, PLURAL, VERSION
from cachescale.api.reasons import ConditionReason, Problem
from cachescale.api.spec import MetricsSpec, TargetSpec
from cachescale.controller.kube.client import KubeError
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import Outcome, evaluate_many
from cachescale.controller.reconcile.scheduler import DEFAULT_PER_NAMESPACE, Due, Job, Scheduler
from cachescale.controller.runtime.kopf_storage import BoundedDiffBaseStorage, annotation_headroom
from cachescale.controller.target.actions import restore_envelope
from cachescale.controller.target.claims import (
    Claimant,
    ClaimKey,
    OperatorIdentity,
    Refusal,
    index_entry,
    refusal,
)
from cachescale.controller.target.workload import TargetError
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
    ``scheduler.py``, "Fair scheduling")."""
    scheduler: Scheduler[str] = field(init=False)

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
        uid = PolicyObject.of(body).uid
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
            namespace=PolicyObject.of(body).namespace,
        )

    def leave(self, uid: str, departed: bool = False) -> None:
        """Stop evaluating the policy (an evaluation under way ends as it would)."""
        member = self.members.pop(uid, None)
        if member is not None:
            member.registered = False
            member.departed = departed
            self.scheduler.unregister(uid)

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


def configure(settings: kopf.OperatorSettings, scanning: bool = True) -> None:
    """kopf settings: annotation-based storage, quiet posting, and namespace/CRD
    scanning only where RBAC allows it (the peering priority is chosen before kopf
    starts: ``controller/runtime/serve.py``)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = BoundedDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.scanning.disabled = not scanning


def interval_of(spec: Any) -> float:
    """The policy's evaluation interval (the default when the spec cannot be read)."""
    try:
        return parse_duration_seconds(
            str(spec.get("metrics", {}).get("interval", DEFAULT_INTERVAL))
        )
    except (ValueError, AttributeError):
        return parse_duration_seconds(DEFAULT_INTERVAL)


def kubeconfig_login(path: str) -> kopf.ConnectionInfo:
    """kopf's credentials from an explicit kubeconfig file (kopf's own login reads only
    ``$KUBECONFIG`` and the default path)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=path, client_configuration=configuration
    )
    header = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, _, token = header.partition(" ") if " " in header else ("Bearer", "", header)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme if token else None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def retained(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a member keeps of its policy's body: all of it but ``metadata.managedFields``.

    The API server's record of which client wrote which field is half of a parsed steady
    policy (23.4 of 46.5 KiB: one entry per writer, the status writes' mirroring the
    status), and nothing here reads it. The rest is shared with kopf's object, not
    copied."""
    metadata = body.get("metadata", {})
    return {**body, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


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


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    configure(settings, runtime.scanning)
    runtime.scheduler.start()
    runtime.ready.set()


@kopf.on.cleanup()
async def _cleanup(memo: Any, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    runtime.scheduler.stop()
    runtime.executor.shutdown(wait=False, cancel_futures=True)
    runtime.phases.shutdown(wait=False, cancel_futures=True)


@kopf.index(GROUP, VERSION, PLURAL, id="claims")
def claims(body: kopf.Body, **_: Any) -> dict[ClaimKey, Claimant]:
    """Every policy by the HPA it names: who holds which (``controller/target/claims.py``)."""
    return index_entry(body)


@kopf.on.event(GROUP, VERSION, PLURAL, id="membership")
async def membership(event: kopf.RawEvent, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """Keep the scheduler's policies as the watch reports them: a policy listed, added
    or changed is registered (or refreshed); one being deleted is unregistered (the
    restore has the last word), and so is one the watch reports gone.

    A policy gone without a deletion under way was relabelled out of this operator's
    ``--policy-selector`` (the API server sends a deletion, carrying the old labels, to a
    filtered watch), or its finalizer was removed by hand: its metrics go with it (the
    other shard reports them now). Any policy gone from the watch also drops its last
    written status (``controller/reconcile/status_writes.py``) and its failed reads in a row. Runs
    on the event loop, like the scheduler."""
    runtime: Runtime = memo.runtime
    policy = PolicyObject.of(body)
    deleting = bool(body.get("metadata", {}).get("deletionTimestamp"))
    if event.get("type") != "DELETED":
        if deleting:
            runtime.leave(policy.uid)
        else:
            runtime.join(body, kwargs["claims"])  # indexes come by id
        return
    runtime.operator.status_writes.forget(policy.uid)
    runtime.operator.read_failures.forget(policy.uid)
    if deleting:
        runtime.leave(policy.uid)
        return
    runtime.leave(policy.uid, departed=True)
    log.info("%s/%s left this operator's watch: no longer served", policy.namespace, policy.name)
    runtime.operator.metrics.forget(policy.namespace, policy.name)


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


def _refused_restore(runtime: Runtime, policy: PolicyObject, error: TargetError) -> None:
    """Say, in the log and a Warning Event on the policy, that the HPA was not restored
    and why (the policy still goes: holding its finalizer would only block its namespace)."""
    message = f"deleted without restoring: {error.message}"
    log.warning("%s/%s %s", policy.namespace, policy.name, message)
    operator = runtime.operator
    assert operator.events is not None
    try:
        operator.events.record(policy.ref, "Warning", error.reason, message, operator.clock())
    except KubeError as failure:
        log.warning("event for %s/%s not posted: %s", policy.namespace, policy.name, failure)


RESTORE_ATTEMPTS: Final = 6
"""Attempts at the restore on delete (``RESTORE_RETRY_SECONDS`` apart) before the policy
goes without it: a finalizer held longer only blocks the policy's namespace."""
RESTORE_RETRY_SECONDS: Final = 10.0
PROGRESS_HEADROOM: Final = 4096
"""Annotation bytes a retry needs: kopf records its progress in an annotation, and a
policy whose annotations leave less room is not retried (the record could not be
written, so the retry would never come)."""


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def restore_on_delete(body: kopf.Body, memo: Any, retry: int = 0, **kwargs: Any) -> None:
    """Put the HPA's original envelope back (unless the policy says keep, or it never
    held its target), forget metrics. A failed restore is retried ``RESTORE_ATTEMPTS``
    times in all; then the policy goes without it, with a Warning Event
    (``RestoreAbandoned``): the finalizer always comes off."""
    runtime: Runtime = memo.runtime
    policy = PolicyObject.of(body)
    loop = asyncio.get_running_loop()
    # Wait out an evaluation under way; none starts after (the restore has the last word).
    await loop.run_in_executor(runtime.executor, runtime.guard(policy.uid).retire)
    runtime.operator.metrics.forget(policy.namespace, policy.name)
    try:
        await _restore(runtime, policy, body, kwargs["claims"])
    except Exception as error:
        if retry + 1 < RESTORE_ATTEMPTS and annotation_headroom(body) >= PROGRESS_HEADROOM:
            if isinstance(error, kopf.TemporaryError):
                raise
            raise kopf.TemporaryError(str(error), delay=RESTORE_RETRY_SECONDS) from error
        await loop.run_in_executor(runtime.executor, _abandoned, runtime, policy, retry, error)
    finally:
        runtime.guards.pop(policy.uid, None)


def _abandoned(runtime: Runtime, policy: PolicyObject, retry: int, error: Exception) -> None:
    """Say, in the log and a Warning Event on the policy, that it goes without its restore
    after ``retry + 1`` failed attempts, and why."""
    message = f"deleted without restoring after {retry + 1} attempts: {error}"[:1024]
    log.warning("%s/%s %s", policy.namespace, policy.name, message)
    operator = runtime.operator
    if operator.events is None:
        return
    try:
        operator.events.record(
            policy.ref, "Warning", ConditionReason.RESTORE_ABANDONED, message, operator.clock()
        )
    except KubeError as failure:
        log.warning("event for %s/%s not posted: %s", policy.namespace, policy.name, failure)


async def _restore(
    runtime: Runtime,
    policy: PolicyObject,
    body: kopf.Body,
    claims: kopf.Index[ClaimKey, Claimant],
) -> None:
    """The restore itself, unless the HPA was never this policy's to change."""
    if refusal(body, claims, runtime.itself) is not None:
        return  # the HPA is another policy's (or the operator's own): never touched
    # Only the target is read: a spec the model refuses may still have changed its HPA
    # (admitted before a limit was tightened).
    try:
        target = TargetSpec.model_validate(policy.spec.get("target"))
    except ValueError:
        return  # no target it could have changed
    if policy.spec.get("restoreOnDelete", True) is False:
        return
    loop = asyncio.get_running_loop()
    try:
        restored = await loop.run_in_executor(
            runtime.executor, restore_envelope, runtime.operator.api, policy.namespace, target
        )
    except KubeError as error:
        raise kopf.TemporaryError(f"restoring {target.autoscaler}: {error}", delay=10) from error
    except TargetError as error:  # a tampered record: the HPA is left as it is
        restored = False
        await loop.run_in_executor(runtime.executor, _refused_restore, runtime, policy, error)
    if restored:
        log.info("%s/%s deleted: %s restored", policy.namespace, policy.name, target.autoscaler)
