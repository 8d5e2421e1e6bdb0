"""Namespaces are walls for Prometheus: what a policy in ``llm`` makes the operator send.

Every query carries ``namespace="llm"`` on every vector selector, whatever the policy's
selector says (``gather/selector.policy_selector``); a selector naming another namespace
and a ``demandQuery`` the cluster owner did not allow are refused before anything is
fetched; an allowed one is sent rewritten to the policy's namespace
(``gather/demand_scope.py``). The queries are checked as Prometheus received them, each
parsed with the same PromQL parser the rewrite uses.
"""

from __future__ import annotations

from typing import Any

import promql_parser as pp
import pytest

from cachescale.api.reasons import Problem
from cachescale.controller.reconcile.context import Operator
from tests.controller.cluster import NAMESPACE, POLICIES, Clock, FakeCluster
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import conditions, events, run, stack
from tests.gather.gather_fakes import FakePrometheus


def namespaces_selected(query: str) -> list[str]:
    """For each vector selector of ``query``: its namespace matchers, as written."""
    found: list[str] = []

    def visit(node: Any) -> bool:
        if isinstance(node, pp.VectorSelector):
            on = [str(m) for m in node.matchers.matchers if m.name == "namespace"]
            found.append(",".join(on) if on else "(none)")
        return True

    pp.walk(pp.parse(query), pre_visit=visit)
    return found


def refused_with(cluster: FakeCluster, reason: Problem) -> str:
    status = cluster.get(POLICIES, "vllm")["status"]
    assert conditions(cluster)["Ready"] == ("False", reason)
    assert conditions(cluster)["MetricsAvailable"] == ("False", reason)
    assert ("Warning", reason) in events(cluster)
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    return str(ready["message"])


@pytest.mark.parametrize(
    "selector",
    [{"model_name": "vllm"}, {}, {"namespace": NAMESPACE, "model_name": "vllm"}],
    ids=["no-namespace-key", "empty", "own-namespace"],
)
def test_every_query_selects_only_the_policys_namespace(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    selector: dict[str, str],
) -> None:
    stack(cluster, engines, prometheus, clock, extra={"metrics": {"selector": selector}})
    run(operator, cluster, clock, rounds=2)
    assert prometheus.queries
    for query in prometheus.queries:
        selected = namespaces_selected(query)
        assert selected, query
        assert set(selected) == {f'namespace="{NAMESPACE}"'}, query


@pytest.mark.parametrize(
    "selector",
    [{"namespace": "tenant-b"}, {"namespace": "tenant-b", "model_name": "vllm"}],
)
def test_a_selector_naming_another_namespace_is_refused_and_nothing_fetched(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    selector: dict[str, str],
) -> None:
    stack(cluster, engines, prometheus, clock, extra={"metrics": {"selector": selector}})
    run(operator, cluster, clock, rounds=2)
    message = refused_with(cluster, Problem.SELECTOR_OUTSIDE_NAMESPACE)
    assert message.startswith("metrics.selector names namespace 'tenant-b'")
    assert "\n" not in message
    assert prometheus.queries == []


SECRET_QUERY = 'sum(SECRETMETRIC{namespace="tenant-b"})'
DEMAND = "sum(rate(gateway_requests_total[5m]))"


def test_a_demand_query_is_refused_unless_the_cluster_owner_allows_it(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock, extra={"metrics": {"demandQuery": DEMAND}})
    run(operator, cluster, clock, rounds=2)
    message = refused_with(cluster, Problem.DEMAND_QUERY_NOT_ALLOWED)
    assert "policies.allowDemandQuery" in message
    assert "--allow-demand-query" in message
    assert prometheus.queries == []


def test_an_allowed_demand_query_is_sent_confined_and_a_foreign_one_refused(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    operator.allow_demand_query = True
    stack(cluster, engines, prometheus, clock, extra={"metrics": {"demandQuery": DEMAND}})
    run(operator, cluster, clock, rounds=2)
    sent = f'sum(rate(gateway_requests_total{{namespace="{NAMESPACE}"}}[5m]))'
    assert sent in prometheus.queries
    assert DEMAND not in prometheus.queries
    for query in prometheus.queries:
        assert set(namespaces_selected(query)) == {f'namespace="{NAMESPACE}"'}, query

    prometheus.queries.clear()
    body = cluster.get(POLICIES, "vllm")
    body["spec"]["metrics"]["demandQuery"] = SECRET_QUERY
    cluster.put(POLICIES, body)
    run(operator, cluster, clock)
    message = refused_with(cluster, Problem.SELECTOR_OUTSIDE_NAMESPACE)
    assert 'SECRETMETRIC{namespace="tenant-b"}' in message
    assert prometheus.queries == []
