"""A batch of policies evaluated together (``evaluate_many``, one grouped read) leaves
exactly what evaluating each alone (``evaluate``, its own queries) leaves.

Two kmock clusters hold the same policies, targets and pods; both operators read one
real Prometheus over the synthetic series of ``tests/gather/gather_dataset.py`` at its
evaluation time. One evaluates the policies one by one, the other as one batch, for a
few rounds. Outcomes, stored statuses, HPAs and Events must be equal, policy by policy:
healthy, saturated, missing and SGLang-only engines in one shared group, a ``pod``
selector (a group of its own), a Prometheus that is down, an invalid spec, a refusal,
a URL outside the allow list.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import Outcome, evaluate, evaluate_many
from cachescale.controller.target.claims import Refusal
from cachescale.decide import Decision, decide
from cachescale.gather.deadline import Deadline
from cachescale.gather.egress import AllowedUrls
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from tests.controller.cluster import (
    HPAS,
    NAMESPACE,
    POLICIES,
    Clock,
    FakeCluster,
    deployment,
    fake_cluster,
    hpa,
    pods,
    policy,
)
from tests.gather.conftest import synthetic_prometheus  # noqa: F401 (a fixture)
from tests.gather.gather_dataset import AT
from tests.gather.gather_fakes import closed_port_url

MODELS = ("steady", "reset", "legacy", "idle", "saturated", "missing", "sg")
"""Engines of the dataset in namespace llm (``missing`` exports nothing; ``sg`` is SGLang,
so a vLLM policy finds no profile)."""
REFUSED = Refusal(Problem.TARGET_CLAIMED, "HPA refused is held by llm/other")


class CountingClient(PrometheusClient):
    """A real client that counts the requests sent (views share the count)."""

    def __init__(self, config: PrometheusConfig) -> None:
        super().__init__(config)
        self.sent = [0]

    def _attempt(self, promql: str, at: datetime, deadline: Deadline) -> bytes:
        self.sent[0] += 1
        return super()._attempt(promql, at, deadline)


DOWN = closed_port_url()
"""A Prometheus nobody answers at (one address for both operators)."""


def stack(cluster: FakeCluster, prometheus: str) -> list[str]:
    """Every policy, its Deployment, HPA and pods; their names."""
    window = {"window": "5m"}
    specs: dict[str, dict[str, Any]] = {m: {"metrics": window} for m in MODELS}
    specs["pod-selector"] = {"metrics": {**window, "selector": {"pod": "steady-a"}}}
    specs["down"] = {"metrics": {**window, "prometheusUrl": DOWN}}
    specs["invalid"] = {"metrics": {"window": "1s"}}
    specs["refused"] = {"metrics": window}
    specs["not-allowed"] = {"metrics": {**window, "prometheusUrl": "http://elsewhere:9090"}}
    for name, extra in specs.items():
        cluster.put("apps/v1/deployments", deployment(name, replicas=2))
        cluster.put(HPAS, hpa(name, target=name))
        for pod in pods(name, 2, AT):
            cluster.put("v1/pods", pod)
        body = policy(
            name, prometheus_url=prometheus, deployment_name=name, hpa_name=name, extra=extra
        )
        cluster.put(POLICIES, body)
    return list(specs)


def operator(cluster: FakeCluster, clock: Clock, prometheus: str) -> Operator:
    return Operator(
        cluster.api,
        clock=clock,
        new_client=CountingClient,
        allowed_urls=AllowedUrls.parse([prometheus, DOWN]),
    )


def state(cluster: FakeCluster, names: list[str]) -> dict[str, object]:
    """What a user sees: each policy's status and HPA spec, and every Event's words."""
    events = sorted(
        (e["involvedObject"]["name"], e["type"], e["reason"], e["message"])
        for e in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
    )
    return {
        "statuses": {n: cluster.get(POLICIES, n).get("status") for n in names},
        "hpas": {n: cluster.get(HPAS, n)["spec"] for n in names},
        "events": events,
    }


def sent(operator: Operator, url: str) -> int:
    """Requests sent to the Prometheus at ``url``."""
    clients = operator._clients.values()
    return sum(c.sent[0] for c in clients if isinstance(c, CountingClient) and c._url == url)


@pytest.fixture
def other_cluster() -> Iterator[FakeCluster]:
    with fake_cluster() as running:
        yield running


def test_a_batch_leaves_what_evaluating_each_alone_leaves(
    cluster: FakeCluster,
    other_cluster: FakeCluster,
    synthetic_prometheus: str,  # noqa: F811 (the fixture imported above)
    caplog: pytest.LogCaptureFixture,
) -> None:
    names = stack(cluster, synthetic_prometheus)
    stack(other_cluster, synthetic_prometheus)
    one_clock, batch_clock = Clock(AT), Clock(AT)
    one = operator(cluster, one_clock, synthetic_prometheus)
    batch = operator(other_cluster, batch_clock, synthetic_prometheus)

    def refusal(name: str) -> Refusal | None:
        return REFUSED if name == "refused" else None

    for _ in range(3):
        alone: list[Outcome] = []
        for name in names:
            body = PolicyObject.of(cluster.get(POLICIES, name))
            alone.append(evaluate(one, body, refusal(name)))
        bodies = [PolicyObject.of(other_cluster.get(POLICIES, n)) for n in names]
        together = evaluate_many(batch, [(body, refusal(body.name)) for body in bodies])
        assert dict(zip(names, together, strict=True)) == dict(zip(names, alone, strict=True))
        assert state(other_cluster, names) == state(cluster, names)
        one_clock.advance(30)
        batch_clock.advance(30)
    reasons = {
        n: getattr(outcome, "reason", outcome) for n, outcome in zip(names, alone, strict=True)
    }
    assert reasons["invalid"] == Problem.INVALID_SPEC
    assert reasons["refused"] == Problem.TARGET_CLAIMED
    assert reasons["not-allowed"] == Problem.METRICS_URL_NOT_ALLOWED
    # Four vLLM 0.13 engines share one query set; the legacy engine and the pod selector
    # read alone, as they would anyway: about half the requests.
    assert sent(batch, synthetic_prometheus) < 0.6 * sent(one, synthetic_prometheus)
    # A failed read is also one line in the operator's log per batch, not one per policy.
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(logged) == 3
    assert all(
        line.startswith("signals of 1 policies could not be read: Prometheus is unreachable")
        for line in logged
    )


def test_a_bug_in_one_policy_is_that_policys_only(
    cluster: FakeCluster,
    synthetic_prometheus: str,  # noqa: F811 (the fixture imported above)
) -> None:
    stack(cluster, synthetic_prometheus)
    batch = operator(cluster, Clock(AT), synthetic_prometheus)

    def decide_or_fail(spec: CacheScalingPolicySpec, *args: Any) -> Decision:
        if spec.target.deployment_name == "reset":
            raise RuntimeError("a bug")
        return decide(spec, *args)

    batch.make_decision = decide_or_fail
    bodies = [PolicyObject.of(cluster.get(POLICIES, n)) for n in ("reset", "steady")]
    broken, healthy = evaluate_many(batch, [(body, None) for body in bodies])
    assert isinstance(broken, RuntimeError)
    assert isinstance(healthy, Outcome)
    assert healthy.decision is not None
    assert cluster.get(POLICIES, "steady")["status"]["lastDecision"]
