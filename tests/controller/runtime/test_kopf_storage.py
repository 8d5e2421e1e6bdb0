"""kopf keeps no diff base, and a policy's finalizer always comes off: kopf writes nothing
to a policy but its finalizer and the delete handler's progress, sees no change on any
event, still adds the finalizer and runs the delete handler; a restore that keeps failing
is given up after a few attempts.

``controller/runtime/kopf_storage.py`` and ``handlers.restore_on_delete``, against kopf's own
cause detection (``kopf._core.reactor.processing``: a kopf release that changes it fails
here); the real API server's side of it is ``e2e/test_tenancy_size_limits.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kopf
import pytest
from kopf._core.actions.loggers import LocalObjectLogger, ObjectLogger
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.intents.causes import ChangingCause
from kopf._core.reactor.inventory import ResourceMemory
from kopf._core.reactor.processing import _detect_causes

from cachescale.api.policy import (
    ANNOTATION_PREFIX,
    GROUP,
    ORIGINAL_ENVELOPE,
    PLURAL,
    VERSION,
)
from cachescale.api.reasons import ConditionReason
from cachescale.controller.kube.client import KubeError
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.runtime import handlers
from cachescale.controller.runtime.handlers import (
    RESTORE_ATTEMPTS,
    configure,
    restore_on_delete,
)
from cachescale.controller.runtime.kopf_storage import (
    ANNOTATIONS_LIMIT,
    NoDiffBaseStorage,
    annotation_headroom,
)
from cachescale.controller.runtime.members import Runtime
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, policy
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import HPAS, POLICIES, run, stack
from tests.gather.gather_fakes import FakePrometheus

KEY = f"{ANNOTATION_PREFIX}/last-handled-configuration"
MARKER = f"{ANNOTATION_PREFIX}/kopf-managed"
RESOURCE = kopf.Resource(GROUP, VERSION, PLURAL)
restore: Any = restore_on_delete  # kopf types its handlers as its own protocols


def body_with(query: str = "sum(x)", *, finalizer: bool = True, **metadata: Any) -> dict[str, Any]:
    """A policy as kopf receives it: held by the operator's finalizer unless told not."""
    raw = policy(prometheus_url="http://prometheus:9090")
    raw["spec"]["metrics"]["demandQuery"] = query
    if finalizer:
        raw["metadata"]["finalizers"] = [kopf.OperatorSettings().persistence.finalizer]
    raw["metadata"].update(metadata)
    return raw


def older_diff_base(query: str) -> dict[str, str]:
    """The annotations an older version left: kopf's diff base of a spec with ``query``."""
    stock = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    body = kopf.Body(cast(kopf.RawBody, body_with(query)))
    patch = kopf.Patch()
    stock.store(body=body, patch=patch, essence=stock.build(body=body))
    return dict(patch["metadata"]["annotations"])


def cause_of(
    raw: dict[str, Any], settings: kopf.OperatorSettings | None = None, listed: bool = False
) -> ChangingCause:
    """The cause kopf's processing finds in a MODIFIED event of ``raw`` with the operator's
    handlers and settings (``listed``: first seen in the initial listing)."""
    if settings is None:
        settings = kopf.OperatorSettings()
        configure(settings)
    body = kopf.Body(cast(kopf.RawBody, raw))

    async def detect(settings: kopf.OperatorSettings) -> ChangingCause | None:
        found = _detect_causes(
            indexers=OperatorIndexers(),
            registry=kopf.get_default_registry(),
            settings=settings,
            resource=RESOURCE,
            raw_event=cast(kopf.RawEvent, {"type": "MODIFIED", "object": raw}),
            body=body,
            patch=kopf.Patch(),
            memory=ResourceMemory(noticed_by_listing=listed),  # needs a running loop
            local_logger=LocalObjectLogger(body=body, settings=settings),
            event_logger=ObjectLogger(body=body, settings=settings),
        )
        return found.changing_cause

    cause = asyncio.run(detect(settings))
    assert cause is not None, "the delete handler makes kopf look for changes"
    return cause


def handler_ids(cause: ChangingCause) -> set[str]:
    registry = kopf.get_default_registry()
    return {handler.id for handler in registry._changing.get_handlers(cause=cause)}


def test_the_operator_keeps_no_diff_base() -> None:
    settings = kopf.OperatorSettings()
    configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, NoDiffBaseStorage)


def test_no_handler_reads_the_diff_base() -> None:
    """The diff base may go only because no handler needs it: kopf runs ``on.delete`` from
    the deletion and the finalizer alone; a create, update or resume handler would read it,
    and a handler's extra fields (``field=``) would be in the essence kopf compares."""
    registry = kopf.get_default_registry()
    changing = registry._changing.get_all_handlers()
    assert changing, "the delete handler is registered"
    reasons = {reason for handler in changing for reason in (handler.reason,)}
    assert reasons == {kopf.Reason.DELETE}, reasons
    for kind in (registry._watching, registry._changing, registry._spawning):
        assert kind.get_extra_fields(resource=RESOURCE) == set()


def test_the_storage_never_writes() -> None:
    """No diff base and no marker, for a small spec, a 960 KB one (admitted before the CRD
    bounded its fields), or a policy an older version left a diff base on."""
    kept = NoDiffBaseStorage()
    for raw in (
        body_with(),
        body_with("v" * 960_000),
        body_with(annotations=older_diff_base("sum(old)")),
    ):
        body = kopf.Body(cast(kopf.RawBody, raw))
        patch = kopf.Patch()
        kept.store(body=body, patch=patch, essence=kept.build(body=body))
        assert not patch, patch


def test_a_changed_spec_is_no_change_to_kopf() -> None:
    """A policy whose spec changed since an older version stored its diff base: kopf's own
    storage finds an update, the operator's nothing (no handling cycle, nothing stored)."""
    raw = body_with("sum(new)", annotations=older_diff_base("sum(old)"))
    stock = kopf.OperatorSettings()
    stock.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    assert cause_of(raw, stock).reason == kopf.Reason.UPDATE
    assert cause_of(raw).reason == kopf.Reason.NOOP
    assert cause_of(body_with()).reason == kopf.Reason.NOOP, "nor a new one a creation"


def test_a_listed_policy_is_resumed_with_nothing_to_run() -> None:
    """At start-up kopf resumes each listed policy once: no handler is selected, and with
    nothing changed nothing is stored."""
    cause = cause_of(body_with(), listed=True)
    assert cause.reason == kopf.Reason.RESUME
    assert handler_ids(cause) == set()
    assert cause.old == cause.new


def test_kopf_still_adds_the_finalizer() -> None:
    """A policy without the finalizer: the delete handler matches it, so kopf adds the
    finalizer (``process_resource_causes`` asks ``requires_finalizer`` of the cause, which
    the diff base does not change)."""
    cause = cause_of(body_with(finalizer=False))
    assert kopf.get_default_registry()._changing.requires_finalizer(cause=cause)


def test_a_deletion_runs_the_delete_handler() -> None:
    cause = cause_of(body_with(deletionTimestamp="2024-01-01T00:00:00Z"))
    assert cause.reason == kopf.Reason.DELETE
    assert handler_ids(cause) == {restore.__qualname__}, handler_ids(cause)


def test_headroom_counts_keys_and_values() -> None:
    raw = {"metadata": {"annotations": {"ab": "cde", "é": "x"}}}
    assert annotation_headroom(raw) == ANNOTATIONS_LIMIT - 5 - 3


@pytest.fixture
def failing_restore(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every restore fails with an API error; the list counts the attempts."""
    attempts: list[int] = []

    def fail(*_: Any) -> bool:
        attempts.append(1)
        raise KubeError(503, "the API server is unavailable")

    monkeypatch.setattr(handlers, "restore_envelope", fail)
    return attempts


def warnings(cluster: FakeCluster) -> list[tuple[str, str]]:
    return [
        (e["reason"], e["message"])
        for e in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        if e["type"] == "Warning"
    ]


def test_a_failing_restore_is_retried_then_given_up_with_an_event(
    cluster: FakeCluster, clock: Clock, failing_restore: list[int]
) -> None:
    raw = policy(prometheus_url="http://prometheus:9090")
    body = kopf.Body(cast(kopf.RawBody, raw))
    memo = kopf.Memo(runtime=Runtime(Operator(cluster.api, clock=clock)))
    for retry in range(RESTORE_ATTEMPTS - 1):
        with pytest.raises(kopf.TemporaryError):
            asyncio.run(restore(body=body, memo=memo, claims={}, retry=retry))
    assert warnings(cluster) == []
    asyncio.run(restore(body=body, memo=memo, claims={}, retry=RESTORE_ATTEMPTS - 1))
    assert len(failing_restore) == RESTORE_ATTEMPTS
    ((reason, message),) = warnings(cluster)
    assert reason == ConditionReason.RESTORE_ABANDONED
    assert f"after {RESTORE_ATTEMPTS} attempts" in message
    assert "HTTP 503" in message


def test_a_policy_without_room_for_kopfs_progress_is_not_retried(
    cluster: FakeCluster, clock: Clock, failing_restore: list[int]
) -> None:
    """kopf records a retry's progress in an annotation: with no room for it the retry
    would never come, so the first failure is the last."""
    raw = policy(prometheus_url="http://prometheus:9090")
    raw["metadata"]["annotations"] = {"note": "n" * (ANNOTATIONS_LIMIT - 1024)}
    body = kopf.Body(cast(kopf.RawBody, raw))
    memo = kopf.Memo(runtime=Runtime(Operator(cluster.api, clock=clock)))
    asyncio.run(restore(body=body, memo=memo, claims={}, retry=0))
    assert len(failing_restore) == 1
    assert [reason for reason, _ in warnings(cluster)] == [ConditionReason.RESTORE_ABANDONED]


def test_a_policy_over_a_tightened_limit_still_restores_its_hpa(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    """A policy admitted before a limit was tightened (a 3,000-character demandQuery) is
    refused by the model now, but it may have reshaped its HPA: the restore reads only
    its target, and puts the envelope back."""
    stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=40)
    reshaped = cluster.get(HPAS, "vllm")
    assert reshaped["spec"]["maxReplicas"] != 40, "the policy reshaped its HPA"
    raw = cluster.get(POLICIES, "vllm")
    raw["spec"]["metrics"]["demandQuery"] = "sum(x)" + " " * 3000
    body = kopf.Body(cast(kopf.RawBody, raw))
    asyncio.run(restore(body=body, memo=kopf.Memo(runtime=Runtime(operator)), claims={}))
    restored = cluster.get(HPAS, "vllm")
    assert restored["spec"]["maxReplicas"] == 40
    assert ORIGINAL_ENVELOPE not in restored["metadata"].get("annotations", {})
