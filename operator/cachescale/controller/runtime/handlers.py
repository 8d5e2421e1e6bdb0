"""The kopf side: the handlers kopf calls for the policies, and kopf's settings.

kopf watches the policies, holds their finalizers and pauses the operator when a peer
with a higher priority is active; the scheduler (``controller/reconcile/scheduler.py``)
decides when each policy is evaluated. Every watch event of a ``CacheScalingPolicy``
reaches :func:`membership`, which makes the policy a member of the runtime
(``members.py``: registered with the scheduler, or its body refreshed) and drops it once
it is being deleted or has left the watch (deleted, or relabelled out of
``--policy-selector``). With ``--peering`` the operator follows kopf's pause itself
(``controller/kube/peering.py``): on a pause every policy is unregistered and nothing is
submitted, and kopf's relisting on resume registers each policy that still exists.

On delete, :func:`restore_on_delete` puts the HPA's original envelope back once any
evaluation under way has ended (``members.Guard``); a restore that keeps failing is given
up after ``RESTORE_ATTEMPTS``, with a Warning Event, so the finalizer always comes off.

kopf keeps no diff base (``kopf_storage.py``): on a policy it writes only its finalizer and,
during a deletion, the progress of the delete handler, in annotations under
``cachescale.dev`` (the status schema is strict and written only by us, through the status
subresource).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import kopf

from cachescale.api.policy import ANNOTATION_PREFIX, GROUP, PLURAL, VERSION
from cachescale.api.reasons import ConditionReason
from cachescale.api.spec import TargetSpec
from cachescale.controller.kube.client import KubeError
from cachescale.controller.reconcile.context import PolicyObject
from cachescale.controller.runtime.kopf_storage import NoDiffBaseStorage, annotation_headroom
from cachescale.controller.runtime.members import Runtime
from cachescale.controller.target.actions import restore_envelope
from cachescale.controller.target.claims import Claimant, ClaimKey, index_entry, refusal
from cachescale.controller.target.workload import TargetError

log = logging.getLogger("cachescale.operator")


def configure(settings: kopf.OperatorSettings, scanning: bool = True) -> None:
    """kopf settings: progress in annotations, no diff base, quiet posting, and namespace/CRD
    scanning only where RBAC allows it (the peering priority is chosen before kopf
    starts: ``controller/runtime/serve.py``)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = NoDiffBaseStorage()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.scanning.disabled = not scanning


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
