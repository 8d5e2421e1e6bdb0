"""One policy per HPA, never the operator itself (cachescale/controller/target/claims.py).

The rule on its own (any order of the same policies gives the same holder), then what a
refused policy does against the fake API server: it reports, posts one Warning Event and
writes nothing else; deleting it restores nothing; and once the holder is gone, it acts.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest

from cachescale.api.policy import ORIGINAL_ENVELOPE
from cachescale.api.reasons import Problem
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import evaluate
from cachescale.controller.runtime.handlers import restore_on_delete
from cachescale.controller.runtime.members import Runtime
from cachescale.controller.target.claims import (
    DEPLOYMENT_ENV,
    NAMESPACE_ENV,
    Claimant,
    ClaimKey,
    OperatorIdentity,
    claim_key,
    index_entry,
    refusal,
)
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, policy
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import (
    HPAS,
    POLICIES,
    ROOM_OVER_11,
    conditions,
    events,
    run,
    stack,
)
from tests.gather.gather_fakes import FakePrometheus

URL = "http://prometheus.test:9090"


def body(name: str, created: str, hpa: str = "vllm", deployment: str = "vllm") -> dict[str, Any]:
    """A stored policy: what kopf hands the index and the daemon."""
    found = policy(name, prometheus_url=URL, hpa_name=hpa, deployment_name=deployment)
    found["metadata"]["creationTimestamp"] = created
    return found


def indexed(*bodies: dict[str, Any]) -> dict[ClaimKey, list[Claimant]]:
    """What kopf's index holds for these policies."""
    claims: dict[ClaimKey, list[Claimant]] = {}
    for one in bodies:
        for key, value in index_entry(one).items():
            claims.setdefault(key, []).append(value)
    return claims


def holders(bodies: Iterable[dict[str, Any]]) -> list[str]:
    """The policies allowed to act."""
    everyone = list(bodies)
    claims = indexed(*everyone)
    return [b["metadata"]["name"] for b in everyone if refusal(b, claims, None) is None]


def test_the_oldest_policy_holds_the_hpa_and_ties_go_by_name() -> None:
    policies = [
        body("b", "2026-12-01T10:00:00Z"),
        body("a", "2026-12-01T10:00:00Z"),
        body("old", "2026-11-30T09:00:00Z"),
        body("z-other", "2026-12-01T11:00:00Z", hpa="other"),
    ]
    for order in itertools.permutations(policies):
        assert sorted(holders(order)) == ["old", "z-other"]
    assert sorted(holders(policies[:2])) == ["a"], "same second: the name decides"


def test_a_refused_policy_names_the_holder_and_the_fix() -> None:
    old, new = body("first", "2026-12-01T10:00:00Z"), body("second", "2026-12-01T10:05:00Z")
    refused = refusal(new, indexed(old, new), None)
    assert refused is not None
    assert refused.reason == Problem.TARGET_CLAIMED
    assert f"managed by policy {NAMESPACE}/first" in refused.message
    assert "delete one of them or point spec.target.hpaName at another HPA" in refused.message
    assert "\n" not in refused.message


def test_a_policy_not_yet_in_the_index_still_ranks_against_the_rest() -> None:
    old, new = body("first", "2026-12-01T10:00:00Z"), body("second", "2026-12-01T10:05:00Z")
    assert refusal(old, indexed(new), None) is None
    assert refusal(new, indexed(old), None) is not None


def test_a_policy_without_an_hpa_name_claims_nothing() -> None:
    nameless = body("x", "2026-12-01T10:00:00Z")
    del nameless["spec"]["target"]["hpaName"]
    assert claim_key(nameless) is None
    assert index_entry(nameless) == {}
    nameless["spec"]["target"] = "not a mapping"
    assert claim_key(nameless) is None
    assert refusal(nameless, {}, None) is None


def test_the_operators_own_deployment_is_refused_only_in_its_namespace() -> None:
    itself = OperatorIdentity.from_env({NAMESPACE_ENV: NAMESPACE, DEPLOYMENT_ENV: "cachescale"})
    assert itself == OperatorIdentity(NAMESPACE, "cachescale")
    aimed = body("evil", "2026-12-01T10:00:00Z", deployment="cachescale")
    refused = refusal(aimed, indexed(aimed), itself)
    assert refused is not None
    assert refused.reason == Problem.TARGET_IS_OPERATOR
    assert f"Deployment {NAMESPACE}/cachescale is the cachescale operator" in refused.message
    elsewhere = OperatorIdentity("cachescale-system", "cachescale")
    assert refusal(aimed, indexed(aimed), elsewhere) is None


@pytest.mark.parametrize("environ", [{}, {NAMESPACE_ENV: "x"}, {DEPLOYMENT_ENV: "y"}])
def test_out_of_cluster_the_operator_has_no_deployment_to_protect(
    environ: dict[str, str],
) -> None:
    assert OperatorIdentity.from_env(environ) is None


def test_a_refused_policy_reports_and_writes_nothing_else(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)  # Deployment, HPA and policy "vllm"
    selector = {"namespace": NAMESPACE, "model_name": "vllm"}
    late = policy(
        "second", prometheus_url=prometheus.url, extra={"metrics": {"selector": selector}}
    )
    cluster.put(POLICIES, late)
    first = body("first", "2026-12-01T10:00:00Z")
    second = body("second", "2026-12-01T10:05:00Z")
    claims = indexed(first, second)
    refused = refusal(second, claims, None)
    for _ in range(3):
        stored = cluster.get(POLICIES, "second")
        outcome = evaluate(operator, PolicyObject.of(stored), refused)
        assert outcome.reason == Problem.TARGET_CLAIMED
        clock.advance(10)
    assert conditions(cluster, "second")["Ready"] == ("False", "TargetClaimed")
    status = cluster.get(POLICIES, "second")["status"]
    assert status["state"] == "TargetClaimed"
    assert events(cluster) == [("Warning", "TargetClaimed")], "one Event, not one per round"
    paths = {str(r.url.path) for r in cluster.requests("patch")}
    assert paths == {
        f"/apis/cachescale.dev/v1alpha1/namespaces/{NAMESPACE}/cachescalingpolicies/second/status"
    }
    assert prometheus.queries == [], "a refused policy reads nothing"
    # The holder deleted (gone from the index): the next evaluations act.
    assert refusal(second, indexed(second), None) is None
    run(operator, cluster, clock, "second", rounds=40)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == ROOM_OVER_11


def test_deleting_a_refused_policy_restores_nothing(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=40)  # the holder reshapes the HPA
    reshaped = cluster.get(HPAS, "vllm")
    assert ORIGINAL_ENVELOPE in reshaped["metadata"]["annotations"]
    holder = body("vllm", "2026-12-01T10:00:00Z")
    loser = body("late", "2026-12-01T10:05:00Z")
    loser["metadata"]["uid"] = "uid-late"
    memo = SimpleNamespace(runtime=Runtime(operator))
    asyncio.run(restore_on_delete(body=loser, memo=memo, claims=indexed(holder, loser)))
    assert cluster.get(HPAS, "vllm") == reshaped
    assert cluster.requests("patch")[-1].url.path.endswith("/vllm/status")
