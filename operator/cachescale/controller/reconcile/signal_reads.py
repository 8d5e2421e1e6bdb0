"""The read phase of an evaluation: which Prometheus a policy reads and what it asks
(``read``), and the signals that come back, read alone or taken out of a batch's grouped
read.

A read that fails ends in signals, not in an exception: a Prometheus that cannot be
reached or answers wrongly, credentials that cannot be read, a malformed selector or one
that matches more series than it should all make every signal unknown, with the reason
(``unknown``), so the decision freezes instead of guessing. Any other exception out of a
grouped read is a bug, and is raised as a read alone would raise it. A Prometheus the
operator may not use is not a failed read but a refusal (``EgressRefused``, raised by
``read``), and so is a read beyond the policy's namespace: its selector always matches
its own namespace and may name no other (``SelectorOutsideNamespace``), and its
``demandQuery`` is sent only when the cluster owner allows it, each selector forced to
that namespace (``DemandQueryNotAllowed``; ``gather/demand_scope.py``). ``evaluation.py``
runs the phases; the queries themselves are ``gather/``'s.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.controller.reconcile.prometheus_access import (
    EgressRefused,
    PrometheusCredentialsError,
    prometheus_config,
)
from cachescale.controller.target.workload import Target
from cachescale.gather.demand_scope import DemandOutsideNamespace, DemandQueryRefused, confine
from cachescale.gather.grouped import Outcome as GroupedOutcome
from cachescale.gather.prometheus import PrometheusClient
from cachescale.gather.prometheus_errors import PrometheusError
from cachescale.gather.selector import OutsideNamespace, Selector, SelectorError, policy_selector
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import SignalRequest
from cachescale.snapshot import EngineSignals, FetchFailure

if TYPE_CHECKING:
    from cachescale.controller.reconcile.context import Operator, PolicyObject, Prepared

log = logging.getLogger("cachescale.operator")


def read(
    operator: Operator, policy: PolicyObject, spec: CacheScalingPolicySpec, target: Target
) -> tuple[PrometheusClient, SignalRequest]:
    """Which Prometheus to read, and what: ``EgressRefused`` when the operator may not
    use it; a ``PrometheusError``, ``PrometheusCredentialsError`` or ``SelectorError``
    when it cannot. The namespace rules are checked first: a refused read reads no
    Secret either."""
    selector, demand = scoped(operator, policy.namespace, spec)
    config = prometheus_config(operator, policy.namespace, spec)
    request = SignalRequest(
        engine=spec.target.engine,
        selector=selector,
        window_seconds=spec.metrics.window_seconds,
        gpus_per_pod=target.state.gpus_per_pod or None,
        pods_holding_gpus=target.pods_holding_gpus,
        pod_ages_seconds=target.pod_ages,
        demand_query=demand,
    )
    return operator.prometheus(config), request


def scoped(
    operator: Operator, namespace: str, spec: CacheScalingPolicySpec
) -> tuple[Selector, str | None]:
    """The selector and demand query a policy in ``namespace`` reads with, both confined
    to ``namespace``; ``EgressRefused`` when either would reach beyond it, or the policy
    has a demand query and the operator was not started with ``--allow-demand-query``."""
    try:
        selector = policy_selector(spec.metrics.selector, namespace)
    except OutsideNamespace as error:
        raise EgressRefused(Problem.SELECTOR_OUTSIDE_NAMESPACE, str(error)) from error
    query = spec.metrics.demand_query
    if query is None:
        return selector, None
    if not operator.allow_demand_query:
        raise EgressRefused(
            Problem.DEMAND_QUERY_NOT_ALLOWED,
            "metrics.demandQuery is set, but the operator does not send a policy's own PromQL: "
            "nothing was fetched; remove demandQuery, or ask the operator's admin to enable it "
            "(chart value policies.allowDemandQuery, --allow-demand-query)",
        )
    try:
        return selector, confine(query, namespace)
    except DemandOutsideNamespace as error:
        raise EgressRefused(Problem.SELECTOR_OUTSIDE_NAMESPACE, str(error)) from error
    except DemandQueryRefused as error:
        raise EgressRefused(Problem.DEMAND_QUERY_NOT_ALLOWED, str(error)) from error


def read_alone(operator: Operator, step: Prepared) -> EngineSignals:
    """One policy's signals through ``Operator.read_signals`` (its own queries)."""
    if step.read is None:
        assert step.known is not None
        return step.known
    try:
        return operator.read_signals(*step.read, step.now)
    except (PrometheusError, AmbiguousSeriesError, SelectorError) as error:
        return unknown(error, step.now, step.spec.metrics.window_seconds)


def signals_of(step: Prepared, read: GroupedOutcome | Exception | None) -> EngineSignals:
    """One policy's signals out of a batch's grouped ``read`` (an exception that is not a
    read failure is a bug: raised, as ``read_alone`` would raise it)."""
    if step.read is None:
        assert step.known is not None
        return step.known
    assert read is not None
    if isinstance(read, EngineSignals):
        return read
    if isinstance(read, PrometheusError | AmbiguousSeriesError | SelectorError):
        return unknown(read, step.now, step.spec.metrics.window_seconds)
    raise read


def unknown(error: Exception, now: datetime, window: float) -> EngineSignals:
    """Every signal unknown, for the reason ``error`` gives."""
    if isinstance(error, PrometheusError):
        failure = error.failure
    elif isinstance(error, PrometheusCredentialsError):
        failure = FetchFailure.CREDENTIALS_UNREADABLE
    else:
        failure = FetchFailure.QUERY_ERROR
    return EngineSignals.all_unknown(
        str(error), observed_at=now, window_seconds=window, failure=failure
    )


def log_read_failures(read: Mapping[int, GroupedOutcome | Exception]) -> None:
    """One warning per distinct failure of a batch's reads, with how many policies it
    failed: each policy's status says it too, but a group failing at once (a Prometheus
    down, a batch past its deadline) is one event to whoever reads the operator's log."""
    failures = Counter(str(outcome) for outcome in read.values() if isinstance(outcome, Exception))
    for message, count in failures.items():
        log.warning("signals of %d policies could not be read: %s", count, message)
