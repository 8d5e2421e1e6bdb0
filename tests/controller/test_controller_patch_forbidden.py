"""A patch the operator may not make (HTTP 403: the chart grants ``patch`` per namespace,
``rbac.enforceNamespaces``, and none by default): a policy in Enforce mode says, in one
line of its ``ApiConflict`` Warning Event, what it could not patch, which chart value
grants it and what to do meanwhile, and never the API server's own message (which names
the operator's ServiceAccount and verbs)
(``controller/target/actions.py``, ``PatchForbiddenError``)."""

from __future__ import annotations

import kmock
import pytest
from kmock._internal.rendering import Response

from cachescale.api.reasons import Problem
from cachescale.api.spec import TargetSpec
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.target.actions import (
    PatchForbiddenError,
    apply_envelope,
    apply_max_num_seqs,
    restore_envelope,
)
from cachescale.decide.envelope import Envelope
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, deployment, hpa
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import (
    DEPLOYMENTS,
    HPAS,
    POLICIES,
    ROOM_OVER_11,
    SETTLE,
    run,
    stack,
)
from tests.controller.target.test_actions import NOW
from tests.gather.gather_fakes import FakePrometheus

TARGET = TargetSpec(deployment_name="vllm", hpa_name="vllm")
SERVER_SAYS = (
    'horizontalpodautoscalers.autoscaling "vllm" is forbidden: User '
    '"system:serviceaccount:cachescale:cachescale" cannot patch resource'
)
GRANT = "the cluster owner grants it per namespace with the chart value rbac.enforceNamespaces"


def forbid(cluster: FakeCluster, resource: str) -> None:
    """Every patch of ``resource`` answered 403, as the chart's default RBAC does (kmock's
    emulator still keeps the patched object: what was stored says nothing here)."""
    forbidden = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": SERVER_SAYS}
    cluster.react(
        cluster.emulator["patch", kmock.resource(resource)],
        Response(status=403, payload=forbidden),
    )


def test_a_forbidden_hpa_patch_names_the_hpa_and_the_chart_value(cluster: FakeCluster) -> None:
    cluster.put(HPAS, hpa())
    forbid(cluster, HPAS)
    with pytest.raises(PatchForbiddenError) as refused:
        apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(3, 12, 19.2), "llm/vllm")
    assert str(refused.value) == (
        f"the operator may not patch HorizontalPodAutoscaler vllm in namespace {NAMESPACE} "
        f"(HTTP 403): {GRANT}"
    )
    assert refused.value.status == 403
    assert len(cluster.requests("patch")) == 1  # a 403 is not retried as a conflict is
    # Restoring on delete needs the same grant, and says so the same way.
    with pytest.raises(PatchForbiddenError, match=r"rbac\.enforceNamespaces"):
        restore_envelope(cluster.api, NAMESPACE, TARGET)


def test_a_forbidden_deployment_patch_names_the_deployment(cluster: FakeCluster) -> None:
    cluster.put(DEPLOYMENTS, deployment(args=["--model", "m", "--max-num-seqs", "64"]))
    forbid(cluster, DEPLOYMENTS)
    with pytest.raises(PatchForbiddenError) as refused:
        apply_max_num_seqs(cluster.api, NAMESPACE, TARGET, 48, NOW)
    assert str(refused.value).startswith(
        f"the operator may not patch Deployment vllm in namespace {NAMESPACE} (HTTP 403): "
    )


def test_an_enforce_policy_refused_a_patch_says_the_fix_in_its_warning_event(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)
    forbid(cluster, HPAS)
    run(operator, cluster, clock, rounds=SETTLE)  # it would lower maxReplicas to 12
    warnings = [
        e["message"]
        for e in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        if e["type"] == "Warning" and e["reason"] == Problem.API_CONFLICT
    ]
    assert warnings, "no ApiConflict Warning Event"
    for message in warnings:
        assert message.startswith("could not apply "), message
        assert message.endswith(
            f": the operator may not patch HorizontalPodAutoscaler vllm in namespace "
            f"{NAMESPACE} (HTTP 403): {GRANT}; until then use mode: Advise"
        ), message
        assert "\n" not in message
        assert "serviceaccount" not in message.lower()
        assert "forbidden" not in message
    # The status is still written: the decision is reported, only not applied.
    assert cluster.get(POLICIES, "vllm")["status"]["lastDecision"]["maxReplicas"] == ROOM_OVER_11
