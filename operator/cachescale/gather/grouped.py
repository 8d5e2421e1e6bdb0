"""Grouped gathering: one request for every policy that can share it.

Why: ``gather_signals`` sends one detection query and a batch of about 20 queries (one
request, ``promql.combine``) per policy per evaluation, so Prometheus load grows with the
number of policies. Policies that read the same Prometheus over the same window differ in
label values (and sometimes in the labels they select on); ``QueryScope.shared`` reads
all of them with one regex per common label, grouping by every label any of them selects
on, and ``split_by_selector`` hands each policy back exactly the series its own query
would have returned (no aggregate mixes two policies). The cost then grows with the
number of groups.

How a call to ``GroupedGatherer.gather`` proceeds, for the policies due now:

* **Plan** (pure, ``plan`` in ``gather/grouping.py``, which ``cachescale groups`` shows
  offline): policies are grouped by client (the controller keeps one per URL and
  credentials), window, kube-state-metrics use and the model labels their selectors match
  on (``sharing_key``). A selector on ``pod`` is not groupable (the fleet-level queries
  aggregate ``pod`` away, so a shared result could not be split on it): it gets a group of
  its own. A group of one distinct selector reads with its own exact matchers, as
  ``gather_signals`` does.
* **Detect** per group and engine: one detection query for the members whose profile is
  not cached; a detected profile is cached per policy for ``ttl_seconds`` (clock
  injected), so a steady group sends no detection query at all. "No profile" is not
  cached: a deployment that has not started yet is looked for again next time.
* **Read** per group and detected profile: one batch (one query per signal, sent as one
  request); each member's slice goes through ``compute_signals``, exactly as in
  ``gather_signals``. A batch mixing label sets also counts its series by the group
  labels (``label_query``): a member whose series carry a label only others select on
  (its share would be grouped more finely than its own answer), or every member of a
  mixed batch Prometheus rejects, is read again with selectors on its own label names. A
  member's own ``demandQuery`` (user PromQL) is still sent alone, as it is per policy by
  nature.

Failures stay where they happen. Every member gets its own outcome: its signals (unknowns
keep their per-policy reasons, e.g. "has no data for <its selector>" while its group-mates
have data), or the ``AmbiguousSeriesError`` of its own selector, or the
``PrometheusError`` of its group. A group's reads share one deadline (the client's
timeout) and fail together, as one policy's reads do; groups run on their own threads
with their own deadlines, so a Prometheus that is down, slow or answering garbage fails
only the groups that read it.

A group that runs out of time is read again smaller before any member is marked unknown:
a query over fewer selectors scans fewer series, so a chunk too large for the deadline is
not all of it lost. Its selectors are cut in two halves, read side by side, each with a
fresh deadline; that happens once (``SPLIT_ON_TIMEOUT``), so a batch waits at most two
deadlines for a slow Prometheus, and a half that times out again is its members' timeout.
A group of one selector is one policy's read and is not retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from threading import Lock
from typing import TypeVar

from cachescale.api.spec import Engine
from cachescale.gather.detection import Detection, detect_profile, detection_query
from cachescale.gather.grouping import DEFAULT_MAX_GROUP_SIZE as DEFAULT_MAX_GROUP_SIZE
from cachescale.gather.grouping import SHARING_LABELS, Group, scope_of
from cachescale.gather.grouping import PolicyRead as PolicyRead
from cachescale.gather.grouping import plan as plan
from cachescale.gather.prometheus import PrometheusClient
from cachescale.gather.prometheus_errors import (
    PrometheusError,
    PrometheusQueryError,
    PrometheusTimeout,
)
from cachescale.gather.promql import SERIES_LABELS, QueryKey, build_queries, label_query
from cachescale.gather.reading import read_demand
from cachescale.gather.selector import ResultSeries, Selector
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import compute_signals
from cachescale.snapshot import EngineSignals, MetricsGeneration

K = TypeVar("K", bound=Hashable)
Q = TypeVar("Q", bound=Hashable)
C = TypeVar("C")

Outcome = EngineSignals | PrometheusError | AmbiguousSeriesError
"""What one policy gets: its signals, or the error ``gather_signals`` would have raised."""

SPLIT_ON_TIMEOUT = 1
"""Times a group that ran out of time is read again as two halves (module docstring)."""

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


def _carries_labels_of_others(
    selector: Selector, every_name: Set[str], labels: Sequence[ResultSeries]
) -> bool:
    """Whether any series ``selector`` reads (``label_query``'s answer, or the part of it
    with the selector's values of the common labels) has a value for a label name only
    other selectors of the batch match on (``every_name``: the names any of them matches
    on): the batch then groups its series more finely than its own queries do, and its
    share is not its answer."""
    others = every_name - set(selector.names) - set(SHARING_LABELS)
    mine = (series for series in labels if selector.matches(series.labels))
    return any(series.labels.get(name) for series in mine for name in others)


def _halves(group: Group[K, C]) -> tuple[Group[K, C], Group[K, C]] | None:
    """``group`` cut in two by its distinct selectors (the members of one selector stay
    together), or None for a group of one selector."""
    selectors = group.selectors
    if len(selectors) < 2:
        return None
    first = frozenset(selectors[: len(selectors) // 2])
    return (
        Group(group.client, tuple(m for m in group.members if m.request.selector in first)),
        Group(group.client, tuple(m for m in group.members if m.request.selector not in first)),
    )


def _slices(
    results: Mapping[Q, Sequence[ResultSeries]], names: Sequence[str]
) -> dict[tuple[str, ...], dict[Q, list[ResultSeries]]]:
    """A shared batch's series by their values of the label ``names`` every selector
    matches on: each policy's slice is the entry of its own values (what
    ``split_by_selector`` returns when the selectors share all their names, found in one
    pass over the results instead of one per policy)."""
    slices: dict[tuple[str, ...], dict[Q, list[ResultSeries]]] = {}
    blanks = ("",) * len(names)  # a label absent counts as ""
    values_of = _values_of(names)
    for key, series in results.items():
        for s in series:
            try:
                values = values_of(s.labels)
            except KeyError:
                values = tuple(map(s.labels.get, names, blanks))
            found = slices.get(values)
            if found is None:
                found = slices[values] = {k: [] for k in results}
            found[key].append(s)
    return slices


def _values_of(names: Sequence[str]) -> Callable[[Mapping[str, str]], tuple[str, ...]]:
    """A label set's values of ``names``, as a tuple (``KeyError`` when one is absent)."""
    if len(names) == 1:
        name = names[0]
        return lambda labels: (labels[name],)
    return itemgetter(*names) if names else lambda _: ()


def _own_share(
    share: Mapping[Q, Sequence[ResultSeries]], selector: Selector, sliced_on: Sequence[str]
) -> Mapping[Q, Sequence[ResultSeries]]:
    """``split_by_selector(share, selector)`` for ``share``, the slice of ``selector``'s
    values of the label names ``sliced_on`` (``_slices``): only its other labels are left
    to compare, and with none left the slice is its own already."""
    rest = tuple((name, value) for name, value in selector.labels if name not in sliced_on)
    if not rest:
        return share
    return {
        key: [s for s in series if all(s.labels.get(n, "") == v for n, v in rest)]
        for key, series in share.items()
    }


class GroupedGatherer:
    """Reads the signals of many policies with one batch per group and profile.

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

    def gather_group(
        self, group: Group[K, PrometheusClient], at: datetime, splits: int = SPLIT_ON_TIMEOUT
    ) -> dict[K, Outcome]:
        """One group's outcomes, all its reads within one deadline of its client; when
        that runs out, the group's two halves' (``splits`` times: module docstring)."""
        client = group.client.until(group.client.deadline())
        try:
            return self._read(client, group, at)
        except PrometheusTimeout as error:
            halves = _halves(group)
            if splits <= 0 or halves is None:
                return {member.key: error for member in group.members}
        except PrometheusError as error:
            return {member.key: error for member in group.members}
        outcomes: dict[K, Outcome] = {}
        with ThreadPoolExecutor(len(halves)) as pool:
            for result in pool.map(lambda half: self.gather_group(half, at, splits - 1), halves):
                outcomes.update(result)
        return outcomes

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
            outcomes.update(self._read_batch(client, profile, members, detections, at))
        return outcomes

    def _read_batch(
        self,
        client: PrometheusClient,
        profile: MetricsGeneration,
        members: Sequence[PolicyRead[K, PrometheusClient]],
        detections: Mapping[tuple[Engine, Selector], Detection],
        at: datetime,
    ) -> dict[K, Outcome]:
        """The outcomes of ``members`` (one profile) from one batch; a member whose share
        of a batch mixing label sets is not its own answer is read again apart."""
        selectors = tuple(dict.fromkeys(m.request.selector for m in members))
        mixed = len({selector.names for selector in selectors}) > 1
        first, scope = members[0].request, scope_of(selectors)
        window, ksm, step = first.window_seconds, first.kube_state_metrics, first.ksm_step_seconds
        queries = build_queries(
            profile, scope, window, kube_state_metrics=ksm, ksm_step_seconds=step
        )
        batch: dict[object, str] = {key: query.promql for key, query in queries.items()}
        if mixed:
            batch[SERIES_LABELS] = label_query(
                profile, scope, window, kube_state_metrics=ksm, ksm_step_seconds=step
            )
        try:
            answers = client.query_many(batch, at)
        except PrometheusQueryError:
            if not mixed:
                raise
            return self._apart(client, members, at)  # e.g. a pod exporting two label sets
        results = {key: answers[key] for key in queries}
        common = [name for name in selectors[0].names if all(name in s.names for s in selectors)]
        slices = _slices(results, common) if len(selectors) > 1 else {}
        nothing: dict[QueryKey, list[ResultSeries]] = {key: [] for key in results}
        labels = _slices({SERIES_LABELS: answers[SERIES_LABELS]}, common) if mixed else {}
        every_name = {name for selector in selectors for name in selector.names}
        outcomes: dict[K, Outcome] = {}
        apart = []
        for member in members:
            request = member.request
            own: Mapping[QueryKey, Sequence[ResultSeries]] = results
            values = tuple(dict(request.selector.labels)[name] for name in common)
            if len(selectors) > 1:
                own = slices.get(values, nothing)
            if mixed:
                counted = labels.get(values, {SERIES_LABELS: []})[SERIES_LABELS]
                if _carries_labels_of_others(request.selector, every_name, counted):
                    apart.append(member)
                    continue
                own = _own_share(own, request.selector, common)
            demand, mine = None, queries
            if request.demand_query is not None:
                mine = {k: q for k, q in queries.items() if k is not QueryKey.ARRIVALS}
                demand = read_demand(client, request.demand_query, at)
            found = detections[request.engine, request.selector]
            try:
                outcomes[member.key] = compute_signals(request, found, mine, own, at, demand=demand)
            except AmbiguousSeriesError as error:
                outcomes[member.key] = error
        outcomes.update(self._apart(client, apart, at))
        return outcomes

    def _apart(
        self,
        client: PrometheusClient,
        members: Sequence[PolicyRead[K, PrometheusClient]],
        at: datetime,
    ) -> dict[K, Outcome]:
        """``members`` read in groups of selectors on the same label names only (their
        profiles are cached by now: no detection query)."""
        outcomes: dict[K, Outcome] = {}
        for group in plan(members, self._max_group_size, across_label_sets=False):
            outcomes.update(self._read(client, group, at))
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
