"""A policy's finalizer always comes off: kopf's diff base never makes its annotations too
large to write, and a restore that keeps failing is given up after a few attempts.

``controller/runtime/kopf_storage.py`` and ``handlers.restore_on_delete``; the real API server's
side of it is ``e2e/test_tenancy_size_limits.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import kopf
import pytest

from cachescale.api.policy import ANNOTATION_PREFIX, ORIGINAL_ENVELOPE
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
    ANNOTATION_BUDGET,
    ANNOTATIONS_LIMIT,
    BoundedDiffBaseStorage,
    annotation_headroom,
)
from cachescale.controller.runtime.members import Runtime
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, policy
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import HPAS, POLICIES, run, stack
from tests.gather.gather_fakes import FakePrometheus

KEY = f"{ANNOTATION_PREFIX}/last-handled-configuration"
restore: Any = restore_on_delete  # kopf types its handlers as its own protocols


def storage() -> BoundedDiffBaseStorage:
    return BoundedDiffBaseStorage(prefix=ANNOTATION_PREFIX, key="last-handled-configuration")


def body_with(spec_text: str = "x", annotations: dict[str, str] | None = None) -> kopf.Body:
    raw = {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": "p", "namespace": "llm", "annotations": annotations or {}},
        "spec": {"demandQuery": spec_text},
    }
    return kopf.Body(cast(kopf.RawBody, raw))


def stored(body: kopf.Body) -> kopf.Patch:
    """The patch kopf would send after handling ``body``: its diff base stored."""
    patch = kopf.Patch()
    kept = storage()
    kept.store(body=body, patch=patch, essence=kept.build(body=body))
    return patch


def test_the_operator_uses_the_bounded_storage() -> None:
    settings = kopf.OperatorSettings()
    configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, BoundedDiffBaseStorage)


def test_no_handler_reads_the_diff_base() -> None:
    """The diff base may be left out only because no handler needs it: kopf runs
    ``on.delete`` from the deletion and the finalizer alone; a create, update or resume
    handler would read it."""
    registry = kopf.get_default_registry()
    changing = registry._changing.get_all_handlers()
    assert changing, "the delete handler is registered"
    reasons = {reason for handler in changing for reason in (handler.reason,)}
    assert reasons == {kopf.Reason.DELETE}, reasons


def test_a_small_spec_is_stored_as_kopf_would() -> None:
    patch = stored(body_with("sum(rate(x[5m]))"))
    essence = json.loads(patch["metadata"]["annotations"][KEY])
    assert essence["spec"] == {"demandQuery": "sum(rate(x[5m]))"}


def test_a_spec_too_large_for_the_annotations_is_not_stored() -> None:
    """A 960 KB spec (admitted before the CRD bounded its fields): nothing is written, and
    a diff base stored before is removed, so the PATCH that also removes the finalizer
    is one the API server accepts."""
    huge = "v" * 960_000
    assert KEY not in stored(body_with(huge)).get("metadata", {}).get("annotations", {})
    patch = stored(body_with(huge, {KEY: '{"spec":{}}\n'}))
    assert patch["metadata"]["annotations"][KEY] is None


def test_the_authors_own_annotations_count() -> None:
    """The essence holds the policy's annotations too, so its size is near twice theirs:
    the diff base is left out once the whole would pass the budget."""
    fits = {"note": "n" * (ANNOTATION_BUDGET // 2 - 4096)}
    assert KEY in stored(body_with("x", fits))["metadata"]["annotations"]
    too_many = {"note": "n" * (ANNOTATION_BUDGET // 2 + 1024)}
    assert KEY not in stored(body_with("x", too_many)).get("metadata", {}).get("annotations", {})


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
