"""Grouped gathering: one query per signal for every policy that can share it.

Why: ``gather_signals`` sends one detection query and a batch of about 21 queries per
policy per evaluation, so Prometheus load grows with the number of policies. Policies that
read the same Prometheus over the same window, with selectors on the same label names,
differ only in label values; ``QueryScope.shared`` reads all of them with one regex per
label, and ``split_by_selector`` hands each policy back exactly the series its own query
would have returned (every query aggregates ``by`` the selector's label names, so no
aggregate mixes two policies). The cost then grows with the number of groups.

How a call to ``GroupedGatherer.gather`` proceeds, for the policies due now:

* **Plan** (pure, ``plan`` in ``gather/grouping.py``, which ``cachescale groups`` shows
  offline): policies are grouped by client (the controller keeps one per
  URL and credentials), window, kube-state-metrics use and selector label names. A
  selector on ``pod`` is not groupable (the fleet-level queries aggregate ``pod`` away, so
  a shared result could not be split on it): it gets a group of its own. A group of one
  distinct selector reads with its own exact matchers, as ``gather_signals`` does.
* **Detect** per group and engine: one detection query for the members whose profile is
  not cached; a detected profile is cached per policy for ``ttl_seconds`` (clock
  injected), so a steady group sends no detection query at all. "No profile" is not
  cached: a deployment that has not started yet is looked for again next time.
* **Read** per group and detected profile: one query per signal; each member's slice goes
  through ``compute_signals``, exactly as in ``gather_signals``. A member's own
  ``demandQuery`` (user PromQL) is still sent alone, as it is per policy by nature.

Failures stay where they happen. Every member gets its own outcome: its signals (unknowns
keep their per-policy reasons, e.g. "has no data for <its selector>" while its group-mates
have data), or the ``AmbiguousSeriesError`` of its own selector, or the
``PrometheusError`` of its group. A group's reads share one deadline (the client's
timeout) and fail together, as one policy's reads do; groups run on their own threads
with their own deadlines, so a Prometheus that is down, slow or answering garbage fails
only the groups that read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from threading import Lock
from typing import TypeVar

from cachescale.api.spec import Engine
from cachescale.gather.grouping import DEFAULT_MAX_GROUP_SIZE as DEFAULT_MAX_GROUP_SIZE
from cachescale.gather.grouping import Group, scope_of
from cachescale.gather.grouping import PolicyRead as PolicyRead
from cachescale.gather.grouping import plan as plan
from cachescale.gather.prometheus import PrometheusClient, PrometheusError
from cachescale.gather.promql import (
    Detection,
    QueryKey,
    ResultSeries,
    Selector,
    build_queries,
    detect_profile,
    detection_query,
)
from cachescale.gather.signals import (
    AmbiguousSeriesError,
    compute_signals,
    read_demand,
)
from cachescale.snapshot import EngineSignals, MetricsGeneration

K = TypeVar("K", bound=Hashable)

Outcome = EngineSignals | PrometheusError | AmbiguousSeriesError
"""What one policy gets: its signals, or the error ``gather_signals`` would have raised."""

DEFAULT_DETECTION_TTL_SECONDS = 300.0
"""How long a detected profile is trusted: an engine upgrade is seen within this."""


@dataclass
class DetectionCache:
    """Detected profiles per (client, engine, selector), each trusted for ``ttl_seconds``
    on ``clock`` (monotonic by default). Thread-safe: groups run concurrently."""

    ttl_seconds: float = DEFAULT_DETECTION_TTL_SECONDS
    clock: Callable[[], float] = time.monotonic
    _entries: dict[tuple[PrometheusClient, Engine, Selector], tuple[float, Detection]] = field(
        default_factory=dict
    )
    _lock: Lock = field(default_factory=Lock)

    def get(self, client: PrometheusClient, engine: Engine, selector: Selector) -> Detection | None:
        """The cached detection, if still fresh."""
        with self._lock:
            entry = self._entries.get((client, engine, selector))
        if entry is None or self.clock() - entry[0] >= self.ttl_seconds:
            return None
        return entry[1]

    def put(
        self, client: PrometheusClient, engine: Engine, selector: Selector, found: Detection
    ) -> None:
        """Remember a detected profile (a detection without one is not cached)."""
        if found.profile is None:
            return
        with self._lock:
            self._entries[(client, engine, selector)] = (self.clock(), found)

    def prune(self) -> None:
        """Forget expired entries (deleted policies leave theirs behind otherwise)."""
        now = self.clock()
        with self._lock:
            for key in [k for k, (at, _) in self._entries.items() if now - at >= self.ttl_seconds]:
                del self._entries[key]


def _slices(
    results: Mapping[QueryKey, Sequence[ResultSeries]], names: Sequence[str]
) -> dict[tuple[str, ...], dict[QueryKey, list[ResultSeries]]]:
    """A shared batch's series by their values of the selectors' label ``names``: each
    policy's slice is the entry of its own values (what ``split_by_selector`` returns,
    found in one pass over the results instead of one per policy)."""
    slices: dict[tuple[str, ...], dict[QueryKey, list[ResultSeries]]] = {}
    for key, series in results.items():
        for s in series:
            values = tuple(s.labels.get(name, "") for name in names)
            if values not in slices:
                slices[values] = {k: [] for k in results}
            slices[values][key].append(s)
    return slices


class GroupedGatherer:
    """Reads the signals of many policies with one query per signal per group.

    One instance lives as long as the operator (it holds the detection cache); ``gather``
    is called once per interval with the policies due in it."""

    def __init__(
        self,
        cache: DetectionCache | None = None,
        *,
        max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
        parallel_groups: int = 4,
    ) -> None:
        self.cache = cache or DetectionCache()
        self._max_group_size = max_group_size
        self._parallel_groups = parallel_groups

    def gather(
        self, reads: Sequence[PolicyRead[K, PrometheusClient]], at: datetime
    ) -> dict[K, Outcome]:
        """Every policy's outcome at ``at``; one group's failure is only its members'."""
        self.cache.prune()
        groups = plan(reads, self._max_group_size)
        outcomes: dict[K, Outcome] = {}
        if len(groups) <= 1 or self._parallel_groups <= 1:
            for group in groups:
                outcomes.update(self.gather_group(group, at))
            return outcomes
        with ThreadPoolExecutor(min(self._parallel_groups, len(groups))) as pool:
            for result in pool.map(lambda group: self.gather_group(group, at), groups):
                outcomes.update(result)
        return outcomes

    def gather_group(self, group: Group[K, PrometheusClient], at: datetime) -> dict[K, Outcome]:
        """One group's outcomes, all its reads within one deadline of its client."""
        client = group.client.until(group.client.deadline())
        try:
            return self._read(client, group, at)
        except PrometheusError as error:
            return {member.key: error for member in group.members}

    def _read(
        self, client: PrometheusClient, group: Group[K, PrometheusClient], at: datetime
    ) -> dict[K, Outcome]:
        detections = self._detect(client, group, at)
        outcomes: dict[K, Outcome] = {}
        by_profile: dict[MetricsGeneration, list[PolicyRead[K, PrometheusClient]]] = {}
        for member in group.members:
            found = detections[member.request.engine, member.request.selector]
            if found.profile is None:
                outcomes[member.key] = EngineSignals.all_unknown(
                    found.reason, observed_at=at, window_seconds=member.request.window_seconds
                )
            else:
                by_profile.setdefault(found.profile, []).append(member)
        for profile, members in by_profile.items():
            selectors = tuple(dict.fromkeys(m.request.selector for m in members))
            first = members[0].request
            queries = build_queries(
                profile,
                scope_of(selectors),
                first.window_seconds,
                kube_state_metrics=first.kube_state_metrics,
                ksm_step_seconds=first.ksm_step_seconds,
            )
            results = client.query_many({key: query.promql for key, query in queries.items()}, at)
            names = selectors[0].names
            slices = _slices(results, names) if len(selectors) > 1 else {}
            nothing: dict[QueryKey, list[ResultSeries]] = {key: [] for key in results}
            for member in members:
                request = member.request
                own: Mapping[QueryKey, Sequence[ResultSeries]] = results
                if len(selectors) > 1:
                    values = tuple(value for _, value in request.selector.labels)
                    own = slices.get(values, nothing)
                demand, mine = None, queries
                if request.demand_query is not None:
                    mine = {k: q for k, q in queries.items() if k is not QueryKey.ARRIVALS}
                    demand = read_demand(client, request.demand_query, at)
                found = detections[request.engine, request.selector]
                try:
                    outcomes[member.key] = compute_signals(
                        request, found, mine, own, at, demand=demand
                    )
                except AmbiguousSeriesError as error:
                    outcomes[member.key] = error
        return outcomes

    def _detect(
        self, client: PrometheusClient, group: Group[K, PrometheusClient], at: datetime
    ) -> dict[tuple[Engine, Selector], Detection]:
        """Each (engine, selector)'s profile: cached, or from one query per engine."""
        found: dict[tuple[Engine, Selector], Detection] = {}
        missing: dict[Engine, dict[Selector, None]] = {}
        for member in group.members:
            engine, selector = member.request.engine, member.request.selector
            if (engine, selector) in found or selector in missing.get(engine, {}):
                continue
            cached = self.cache.get(group.client, engine, selector)
            if cached is not None:
                found[engine, selector] = cached
            else:
                missing.setdefault(engine, {})[selector] = None
        for engine, wanted in missing.items():
            selectors = tuple(wanted)
            series = client.query(detection_query(engine, scope_of(selectors)), at)
            for selector in selectors:
                mine: Sequence[ResultSeries] = series
                if len(selectors) > 1:
                    mine = [s for s in series if selector.matches(s.labels)]
                detection = detect_profile(engine, selector, mine)
                self.cache.put(group.client, engine, selector, detection)
                found[engine, selector] = detection
        return found
