"""The kopf side: one evaluation loop per policy, HPA restore on delete, probes.

Each ``CacheScalingPolicy`` gets a daemon that evaluates it every ``spec.metrics.interval``
(re-read each round, so an edit takes effect at the next one). The evaluation itself
blocks on the Kubernetes and Prometheus APIs, so it runs in a bounded worker pool: the
event loop never waits on I/O, and a slow Prometheus delays only the policies that read
it. An exception in one policy's evaluation is logged, counted and retried next round;
it never stops that loop or any other. A policy that leaves the watch while it still
exists (relabelled out of ``--policy-selector``) has its loop stopped by
:func:`departures`, which kopf would not do.

kopf keeps its own bookkeeping (handler progress, the last-handled spec, the finalizer)
in annotations under ``cachescale.dev``: the status schema is strict and written only by
us, through the status subresource.
"""

from __future__ import annotations

import asyncio
import logging
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.policy import ANNOTATION_PREFIX, GROUP, PLURAL, VERSION
from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec, MetricsSpec
from cachescale.controller.actions import restore_envelope
from cachescale.controller.claims import (
    Claimant,
    ClaimKey,
    OperatorIdentity,
    Refusal,
    index_entry,
    refusal,
)
from cachescale.controller.evaluation import Operator, PolicyObject, evaluate
from cachescale.controller.kube import KubeError
from cachescale.controller.workload import TargetError

DEFAULT_INTERVAL: Final[str] = MetricsSpec.model_fields["interval"].default
"""``spec.metrics.interval`` when a policy leaves it out: the spec model's default."""
WORKERS = 16
"""Evaluations running at once (each mostly waits on HTTP)."""

log = logging.getLogger("cachescale.operator")


@dataclass
class Runtime:
    """Shared by every handler through kopf's ``memo``."""

    operator: Operator
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WORKERS, thread_name_prefix="evaluate")
    )
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """Per policy (uid): an evaluation and the delete handler's restore never overlap."""
    itself: OperatorIdentity | None = None
    """The operator's own Deployment, which no policy may target (``controller/claims.py``)."""
    scanning: bool = True
    """Whether kopf lists and watches namespaces and CRDs. Off where RBAC grants neither
    (namespaced Roles): otherwise kopf retries the forbidden lists with backoff for about
    a minute before it serves anything, and keeps logging the 403s."""
    departed: dict[str, asyncio.Event] = field(default_factory=dict)
    """Per policy (uid) with a running loop: set when the watch reports it gone while it
    still exists (:func:`departures`), so that loop stops."""

    def lock(self, uid: str) -> asyncio.Lock:
        """The policy's lock (created on first use)."""
        return self.locks.setdefault(uid, asyncio.Lock())


def configure(settings: kopf.OperatorSettings, scanning: bool = True) -> None:
    """kopf settings: annotation-based storage, quiet posting, a peering priority, and
    namespace/CRD scanning only where RBAC allows it."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Peers with equal priorities all pause; distinct ones let exactly one act.
    settings.peering.priority = random.randint(1, 32_767)
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


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    configure(settings, runtime.scanning)
    runtime.ready.set()


@kopf.on.cleanup()
async def _cleanup(memo: Any, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    runtime.executor.shutdown(wait=False, cancel_futures=True)


@kopf.index(GROUP, VERSION, PLURAL, id="claims")
def claims(body: kopf.Body, **_: Any) -> dict[ClaimKey, Claimant]:
    """Every policy by the HPA it names: who holds which (``controller/claims.py``)."""
    return index_entry(body)


@kopf.on.event(GROUP, VERSION, PLURAL, id="departures")
def departures(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    """Stop the loop of a policy the watch reports gone without a deletion under way.

    That is a policy relabelled out of this operator's ``--policy-selector`` (the API
    server sends a deletion, carrying the old labels, to a filtered watch), or one whose
    finalizer was removed by hand: kopf forgets the object but does not stop its daemon,
    which would go on evaluating, and acting, beside the shard the policy moved to. Its
    metrics go with it (the other shard reports them now). Any policy gone from the watch
    also drops its last written status (``controller/status_writes.py``)."""
    if event.get("type") != "DELETED":
        return
    runtime: Runtime = memo.runtime
    policy = PolicyObject.of(body)
    runtime.operator.status_writes.forget(policy.uid)
    if body.get("metadata", {}).get("deletionTimestamp"):
        return  # a deletion under way stops the loop through kopf, then restores
    gone = runtime.departed.pop(policy.uid, None)
    if gone is not None:
        gone.set()
        log.info(
            "%s/%s left this operator's watch: no longer served", policy.namespace, policy.name
        )
    runtime.operator.metrics.forget(policy.namespace, policy.name)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def policy_loop(
    body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, **kwargs: Any
) -> None:
    """Evaluate the policy every interval until it is deleted, leaves the watch
    (:func:`departures`) or the operator stops."""
    runtime: Runtime = memo.runtime
    claims: kopf.Index[ClaimKey, Claimant] = kwargs["claims"]  # kopf passes indexes by id
    loop = asyncio.get_running_loop()
    uid = PolicyObject.of(body).uid
    gone = runtime.departed[uid] = asyncio.Event()
    try:
        # Spread the first evaluations over a third of the interval: 200 policies created
        # (or an operator restarted) at once would otherwise come due together, every round.
        await stopped.wait(random.uniform(0, interval_of(body.get("spec", {})) / 3))
        while not stopped:
            policy = PolicyObject.of(body)
            async with runtime.lock(policy.uid):
                if stopped or body.get("metadata", {}).get("deletionTimestamp"):
                    break  # being deleted: the restore must have the last word
                if gone.is_set():  # an evaluation already under way may have just ended
                    runtime.operator.metrics.forget(policy.namespace, policy.name)
                    break
                try:
                    refused = refusal(body, claims, runtime.itself)
                    await loop.run_in_executor(
                        runtime.executor, _evaluate_and_log, runtime.operator, policy, refused
                    )
                except Exception:  # one policy's bug must not end its loop, nor anyone else's
                    log.exception("evaluation of %s/%s failed", policy.namespace, policy.name)
                    runtime.operator.metrics.failed(policy.namespace, policy.name, Problem.INTERNAL)
            await stopped.wait(interval_of(body.get("spec", {})))
    finally:
        if runtime.departed.get(uid) is gone:  # not a newer loop's, after a return
            del runtime.departed[uid]


def _evaluate_and_log(operator: Operator, policy: PolicyObject, refused: Refusal | None) -> None:
    """One evaluation and its log line, in the worker thread: a daemon paused or cancelled
    mid-evaluation (peering, shutdown) stops waiting, but the worker still writes the
    status, so the line that reports it must come from the worker too."""
    outcome = evaluate(operator, policy, refused)
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


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def restore_on_delete(body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """Put the HPA's original envelope back (unless the policy says keep, or it never
    held its target), forget metrics."""
    runtime: Runtime = memo.runtime
    policy = PolicyObject.of(body)
    runtime.operator.metrics.forget(policy.namespace, policy.name)
    if refusal(body, kwargs["claims"], runtime.itself) is not None:
        return  # the HPA is another policy's (or the operator's own): never touched
    try:
        spec = CacheScalingPolicySpec.model_validate(policy.spec)
    except ValueError:
        return  # never valid: it never changed anything
    if not spec.restore_on_delete:
        return
    loop = asyncio.get_running_loop()
    async with runtime.lock(policy.uid):  # wait out an evaluation already under way
        try:
            restored = await loop.run_in_executor(
                runtime.executor,
                restore_envelope,
                runtime.operator.api,
                policy.namespace,
                spec.target,
            )
        except KubeError as error:
            raise kopf.TemporaryError(
                f"restoring {spec.target.autoscaler}: {error}", delay=10
            ) from error
        except TargetError as error:  # a tampered record: the HPA is left as it is
            restored = False
            await loop.run_in_executor(runtime.executor, _refused_restore, runtime, policy, error)
    runtime.locks.pop(policy.uid, None)
    if restored:
        log.info(
            "%s/%s deleted: %s restored", policy.namespace, policy.name, spec.target.autoscaler
        )
