"""Every query a policy's scope builds selects only its namespace (``gather/selector.py``).

``policy_selector`` always adds the policy's namespace and refuses another; a scope's
queries carry it on every vector selector, the series joined in from kube-state-metrics
and info gauges included; a shared scope matches exactly its members' namespaces, and
splitting a shared result back gives each policy only its own namespace's series.
Checked by parsing each query with a real PromQL parser, not by searching its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import promql_parser as pp
import pytest

from cachescale.api.spec import Engine
from cachescale.gather.detection import detection_query
from cachescale.gather.promql import build_queries, combine, label_query
from cachescale.gather.selector import (
    OutsideNamespace,
    QueryScope,
    Selector,
    policy_selector,
    split_by_selector,
)
from cachescale.snapshot import MetricsGeneration


def namespace_matchers(query: str) -> set[tuple[str, str]]:
    """Each vector selector's namespace matcher as (operator, value); ("none", "")
    for a selector without one."""
    found: set[tuple[str, str]] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, pp.VectorSelector):
            on = [m for m in node.matchers.matchers if m.name == "namespace"]
            found.update((str(m.op), m.value) for m in on)
            if len(on) != 1:
                found.add(("none" if not on else "several", ""))
        return True

    pp.walk(pp.parse(query), pre_visit=visit)
    return found


def every_query(scope: QueryScope) -> list[str]:
    queries = [detection_query(engine, scope) for engine in Engine]
    for profile in MetricsGeneration:
        built = build_queries(profile, scope, 300, kube_state_metrics=True)
        queries += [q.promql for q in built.values()]
        queries.append(label_query(profile, scope, 300, kube_state_metrics=True))
        queries.append(combine([q.promql for q in built.values()]))
    return queries


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ({}, {"namespace": "tenant-a"}),
        ({"model_name": "m"}, {"model_name": "m", "namespace": "tenant-a"}),
        ({"namespace": "tenant-a", "app": "x"}, {"app": "x", "namespace": "tenant-a"}),
    ],
)
def test_a_policys_selector_always_matches_its_namespace(
    written: dict[str, str], read: dict[str, str]
) -> None:
    assert policy_selector(written, "tenant-a") == Selector.of(read)


@pytest.mark.parametrize("named", ["tenant-b", "", "x" * 300])
def test_a_selector_naming_another_namespace_is_refused(named: str) -> None:
    with pytest.raises(OutsideNamespace) as refused:
        policy_selector({"namespace": named, "model_name": "m"}, "tenant-a")
    message = str(refused.value)
    assert message.startswith("metrics.selector names namespace ")
    assert "(tenant-a)" in message
    assert len(message) < 300


def test_every_query_of_one_policy_selects_only_its_namespace() -> None:
    scope = QueryScope.for_selector(policy_selector({"model_name": "m"}, "tenant-a"))
    assert scope.namespaces == 'namespace="tenant-a"'
    for query in every_query(scope):
        assert namespace_matchers(query) == {("MatchOp.Equal", "tenant-a")}, query


def test_a_shared_scope_selects_exactly_its_members_namespaces() -> None:
    selectors = [
        policy_selector({"model_name": "m"}, "tenant-a"),
        policy_selector({"model_name": "m"}, "tenant-b"),
    ]
    scope = QueryScope.shared(selectors)
    assert scope.namespaces == 'namespace=~"tenant-a|tenant-b"'
    for query in every_query(scope):
        assert namespace_matchers(query) == {("MatchOp.Re", "tenant-a|tenant-b")}, query


@dataclass(frozen=True)
class _Series:
    labels: dict[str, str]
    value: float


def test_a_shared_result_splits_back_to_each_policys_own_namespace() -> None:
    """Two tenants serving the same model name: each gets only its own namespace's series,
    and a series of a third namespace (which the regex never selects) goes to neither."""
    a = policy_selector({"model_name": "m"}, "tenant-a")
    b = policy_selector({"model_name": "m"}, "tenant-b")
    results = {
        "hits": [
            _Series({"model_name": "m", "namespace": "tenant-a"}, 1.0),
            _Series({"model_name": "m", "namespace": "tenant-b"}, 2.0),
            _Series({"model_name": "m", "namespace": "tenant-c"}, 3.0),
            _Series({"model_name": "m"}, 4.0),
        ]
    }
    assert [s.value for s in split_by_selector(results, a)["hits"]] == [1.0]
    assert [s.value for s in split_by_selector(results, b)["hits"]] == [2.0]
