"""The round trips of one evaluation's signals: Prometheus in, ``EngineSignals`` out.

``gather.signals`` turns query results into measurements and is pure; this module fetches
those results. One evaluation is three steps: detect the engine's metric generation, send
the batch of queries built for it, then the policy's own demand query if it has one, all
within one deadline. A deadline that runs out anywhere fails the whole gathering
(``DeadlineReached``, a ``PrometheusTimeout``), so every signal is unknown with the time
spent, never partly read and partly guessed: a batch cut short could leave a ratio's
numerator without its denominator, and an evaluation without data decides nothing
(``decide`` freezes on it). A failure of the demand query alone makes only the arrival
rate unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cachescale.gather.deadline import Deadline
from cachescale.gather.detection import Detection
from cachescale.gather.promql import Query, QueryKey, build_queries
from cachescale.gather.selector import QueryScope, ResultSeries
from cachescale.gather.signals import (
    DEMAND_QUERY_FIELD,
    SignalRequest,
    compute_signals,
    demand_from_result,
)
from cachescale.snapshot import EngineSignals, Measured, Unit

if TYPE_CHECKING:
    from cachescale.gather.prometheus import PrometheusClient


def gather_signals(
    client: PrometheusClient,
    request: SignalRequest,
    at: datetime | None = None,
    deadline: Deadline | None = None,
) -> EngineSignals:
    """Read every signal of ``request`` at ``at`` (default: now), all within ``deadline``
    (default: one of the client's timeout, starting now).

    Raises a ``PrometheusError`` when Prometheus cannot be read (``DeadlineReached`` when
    the deadline runs out first) and ``AmbiguousSeriesError`` when the selector matches
    more than one deployment.
    """
    at = at or datetime.now(UTC)
    reading = read_queries(client, request, at, deadline)
    if reading.detection.profile is None:
        return EngineSignals.all_unknown(
            reading.detection.reason, observed_at=at, window_seconds=request.window_seconds
        )
    return compute_signals(
        request, reading.detection, reading.queries, reading.results, at, demand=reading.demand
    )


@dataclass(frozen=True)
class Reading:
    """One evaluation's answers, before ``compute_signals`` turns them into a snapshot
    (``cachescale report`` also counts the pods in them)."""

    detection: Detection
    queries: Mapping[QueryKey, Query]
    results: Mapping[QueryKey, Sequence[ResultSeries]]
    demand: Measured | None = None
    """The answer to the policy's demand query, when it has one."""


def read_queries(
    client: PrometheusClient,
    request: SignalRequest,
    at: datetime,
    deadline: Deadline | None = None,
) -> Reading:
    """The round trips of one evaluation at ``at``: detect the profile, then the batch,
    then the demand query if any, all within ``deadline`` (default: one of the client's
    timeout, starting now). No queries are sent when no profile is detected."""
    client = client.until(deadline or client.deadline())
    detection = client.detect(request.engine, request.selector, at)
    if detection.profile is None:
        return Reading(detection, {}, {})
    queries = build_queries(
        detection.profile,
        QueryScope.for_selector(request.selector),
        request.window_seconds,
        kube_state_metrics=request.kube_state_metrics,
        ksm_step_seconds=request.ksm_step_seconds,
    )
    demand = None
    if request.demand_query is not None:
        del queries[QueryKey.ARRIVALS]  # the user's query replaces the estimate
    results = client.query_many({key: query.promql for key, query in queries.items()}, at)
    if request.demand_query is not None:
        demand = read_demand(client, request.demand_query, at)
    return Reading(detection, queries, results, demand)


def read_demand(client: PrometheusClient, promql: str, at: datetime) -> Measured:
    """The demand query's answer; a failure of this one query makes only arrivals unknown
    (the deadline running out fails the whole gathering, as it would for any query)."""
    from cachescale.gather.prometheus_errors import DeadlineReached, PrometheusError

    try:
        series = client.query(promql, at)
    except DeadlineReached:
        raise
    except PrometheusError as error:
        return Measured.unknown(f"{DEMAND_QUERY_FIELD} failed: {error}", Unit.REQUESTS_PER_SECOND)
    return demand_from_result(series)
