"""PromQL for every engine signal, per engine profile, built from a policy's selector.

Why a module of its own: the query text is where correctness lives (metric names by
version, ``rate`` over counters so resets are handled, histograms read per scraped bucket
bound) and where injection could happen (a policy's label values are user input). So the
text is built here, and only here, from validated label names and escaped values (a
policy's ``Selector`` and its ``QueryScope``, from ``gather.selector``); nothing else in the
operator splices strings into PromQL.

Every query aggregates with ``sum by (<group labels>)`` (``+ pod`` for per-pod ones), where
the group labels are the selector's own label names plus ``model_name`` and ``namespace``.
That has two uses:

* A selector that matches two deployments (two models, or two namespaces) yields two
  groups instead of a silently mixed sum, and the signals layer reports the ambiguity.
* Several policies that read the same Prometheus, over the same window, with selectors on
  the same label names, can share one query per signal: ``QueryScope.shared`` matches the
  union of their values and ``split_by_selector`` hands each policy back its own series
  (both in ``gather.selector``).

An evaluation's queries (or a group's) travel as one request: ``combine`` tags each
query's series with its position in the batch and joins them with ``or``, so Prometheus
is asked once per batch, not once per signal, and each series comes back under the query
that produced it. Every value is the one the query alone returns: the tag is the only
label added, and no operand's series can match another's.

The series names per engine are ``gather.engine_series``'; the query that tells the
engine generation apart is ``gather.detection``'s.

Pure: builds strings; the HTTP side is ``gather.prometheus``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from cachescale.gather.engine_series import (
    CACHE_CONFIG_LABELS,
    SGLANG,
    SGLANG_COMPUTED,
    VLLM,
    VLLM_CACHE_CONFIG,
    VLLM_COMPUTED,
    VLLM_PROMPT_TOKENS,
    EngineCounter,
)
from cachescale.gather.selector import (
    NAMESPACE_LABEL,
    POD_LABEL,
    QUERY_TAG_LABEL,
    QueryScope,
    escape_regex,
)
from cachescale.snapshot import MetricsGeneration


class QueryKey(StrEnum):
    """Each query of an evaluation; ``POD_*`` ones are grouped per pod."""

    HITS_LOCAL = "hits_local"
    HITS_EXTERNAL = "hits_external"
    LOOKED_UP = "looked_up"
    REQUESTS = "requests"
    ARRIVALS = "arrivals"
    PREEMPTIONS = "preemptions"
    PREFILL_COMPUTED = "prefill_computed"
    COMPUTED_COUNT = "computed_count"
    COMPUTED_BUCKETS = "computed_buckets"
    TTFT_BUCKETS = "ttft_buckets"
    ITL_BUCKETS = "itl_buckets"
    KV_USAGE = "kv_usage"
    GPU_SECONDS = "gpu_seconds"
    PODS_HOLDING_GPUS = "pods_holding_gpus"
    CONTEXT_TOKENS = "context_tokens"
    POD_SAMPLES = "pod_samples"
    POD_HITS = "pod_hits"
    POD_LOOKED_UP = "pod_looked_up"
    POD_WAITING = "pod_waiting"
    POD_RUNNING = "pod_running"
    POD_KV_USAGE = "pod_kv_usage"
    POD_AGE = "pod_age"
    POD_CACHE_CONFIG = "pod_cache_config"


def combine(queries: Sequence[str]) -> str:
    """``queries`` (instant vectors) as one query: each operand's series tagged with its
    position in ``QUERY_TAG_LABEL`` (``label_replace`` from the always-empty label ""),
    then joined with ``or``. The tags keep every operand's label sets distinct, so ``or``
    drops nothing; the caller hands each series back to the query of its tag."""
    return "\nor\n".join(
        f'label_replace(\n{promql}\n, "{QUERY_TAG_LABEL}", "{position}", "", "")'
        for position, promql in enumerate(queries)
    )


@dataclass(frozen=True)
class Query:
    """One PromQL query and the series it reads (named in 'unknown' reasons)."""

    promql: str
    reads: str


def duration(seconds: float) -> str:
    """Seconds as a PromQL duration (``300s``; ``1500ms`` when not whole seconds)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


class _Builder:
    """Query text for one scope and window."""

    def __init__(self, scope: QueryScope, window_seconds: float) -> None:
        self._scope = scope
        self._window = duration(window_seconds)
        self._window_seconds = window_seconds
        self._by = ", ".join(scope.group_by)
        self._by_pod = ", ".join((*scope.group_by, POD_LABEL))
        self.selected: set[str] = set()
        """Every series name a query built so far selects under the scope."""

    def select(self, metric: str, extra: str = "") -> str:
        self.selected.add(metric)
        matchers = ",".join(part for part in (self._scope.matchers, extra) if part)
        return f"{metric}{{{matchers}}}" if matchers else metric

    def joined(self, metric: str, extra: str = "") -> str:
        """A series joined to the selected pods (no engine labels, so not selected by the
        scope's matchers), read in the scope's namespaces only."""
        matchers = ",".join(part for part in (self._scope.namespaces, extra) if part)
        return f"{metric}{{{matchers}}}" if matchers else metric

    def rate(self, counter: EngineCounter, *, per_pod: bool = False) -> str:
        by = self._by_pod if per_pod else self._by
        selected = self.select(counter.metric, counter.matchers)
        return f"sum by ({by}) (rate({selected}[{self._window}]))"

    def gauge(self, metric: str, aggregate: str, *, per_pod: bool = False) -> str:
        by = self._by_pod if per_pod else self._by
        return f"{aggregate} by ({by}) (avg_over_time({self.select(metric)}[{self._window}]))"

    def buckets(self, histograms: Sequence[str]) -> str:
        rates = " or ".join(
            f"rate({self.select(h + '_bucket')}[{self._window}])" for h in histograms
        )
        return f"sum by ({self._by}, le) ({rates})"

    def labels_selected(self) -> str:
        """The series of every name selected so far, counted per value of the group
        labels: which of those labels each policy's own series carry."""
        names = "|".join(escape_regex(name) for name in sorted(self.selected))
        matchers = ",".join(part for part in (f'__name__=~"{names}"', self._scope.matchers) if part)
        return f"count by ({self._by}) ({{{matchers}}})"

    def arrivals(self, finished: EngineCounter, in_system: Sequence[str]) -> str:
        """Requests arriving per second: every finished request plus the growth of the
        requests in the system (``delta`` of each gauge) over the window, never below 0."""
        growth = " + ".join(
            f"sum by ({self._by}) (delta({self.select(gauge)}[{self._window}]))"
            for gauge in in_system
        )
        return f"clamp_min({self.rate(finished)} + ({growth}) / {self._window_seconds:g}, 0)"

    def samples(self, metric: str) -> str:
        return f"max by ({self._by_pod}) (count_over_time({self.select(metric)}[{self._window}]))"

    def pods_of(self, metric: str) -> str:
        """``1`` per (namespace, pod) exporting ``metric``, carrying the group labels: the
        join that attaches kube-state-metrics series (which have no engine labels)."""
        extra = [label for label in self._scope.group_by if label != NAMESPACE_LABEL]
        carried = ", ".join(extra)
        keys = ", ".join((NAMESPACE_LABEL, POD_LABEL, *extra))
        return (
            f"on ({NAMESPACE_LABEL}, {POD_LABEL}) group_left ({carried}) "
            f"group by ({keys}) ({self.select(metric)})"
        )

    def info(self, metric: str, info: str, labels: Sequence[str]) -> str:
        """An info gauge's ``labels`` per pod, for the pods exporting ``metric`` (the join
        attaches the group labels an info series may lack, such as ``model_name``)."""
        keys = ", ".join((*self._scope.group_by, POD_LABEL, *labels))
        return f"max by ({keys}) ({self.joined(info)} * {self.pods_of(metric)})"

    def pod_age(self, metric: str) -> str:
        ready = (
            f"{self.joined('kube_pod_status_ready_time')} or on ({NAMESPACE_LABEL}, {POD_LABEL}) "
            f"{self.joined('kube_pod_start_time')}"
        )
        return f"max by ({self._by_pod}) ((time() - ({ready})) * {self.pods_of(metric)})"

    def target_pods(self, metric: str) -> str:
        """``1`` per (namespace, pod) of the target, carrying the group labels: every pod
        of the Deployments owning a pod that exports ``metric``, whether it exports yet or
        not (starting pods load weights before they export anything), found through
        kube-state-metrics' owner series (pod → ReplicaSet → Deployment → its ReplicaSets
        → their pods); and the exporting pods themselves, which covers pods no
        Deployment owns."""
        ns, pod = NAMESPACE_LABEL, POD_LABEL
        extra = [label for label in self._scope.group_by if label != ns]
        carried, labels = ", ".join(extra), ", ".join(("", *extra)) if extra else ""
        exporting = f"group by ({ns}, {pod}{labels}) ({self.select(metric)})"
        pod_owner = self.joined("kube_pod_owner", 'owner_kind="ReplicaSet"')
        set_owner = self.joined("kube_replicaset_owner", 'owner_kind="Deployment"')
        sets = (
            f"group by ({ns}, replicaset{labels}) (label_replace({pod_owner} * on ({ns}, "
            f'{pod}) group_left ({carried}) {exporting}, "replicaset", "$1", "owner_name", "(.+)"))'
        )
        deployments = (
            f"group by ({ns}, owner_name{labels}) "
            f"({set_owner} * on ({ns}, replicaset) group_left ({carried}) {sets})"
        )
        every_set = (
            f"group by ({ns}, owner_name{labels}) (label_replace({set_owner} * on ({ns}, "
            f'owner_name) group_left ({carried}) {deployments}, "owner_name", "$1", '
            '"replicaset", "(.+)"))'
        )
        owned = (
            f"group by ({ns}, {pod}{labels}) "
            f"({pod_owner} * on ({ns}, owner_name) group_left ({carried}) {every_set})"
        )
        return f"({owned} or on ({ns}, {pod}) {exporting})"

    def _scheduled(self) -> str:
        """``1`` per scheduled pod of the scope's namespaces (``0`` while pending)."""
        scheduled = self.joined("kube_pod_status_scheduled", 'condition="true"')
        return f"max by ({NAMESPACE_LABEL}, {POD_LABEL}) ({scheduled})"

    def _over_window(self, fleet: str, step_seconds: float) -> str:
        """A fleet expression averaged over subquery steps across the window."""
        steps = f"[{self._window}:{duration(step_seconds)}]"
        return f"avg_over_time((sum by ({self._by}) ({fleet})){steps})"

    def gpu_seconds(self, metric: str, step_seconds: float) -> str:
        """GPU-seconds held over the window by every scheduled pod of the target
        (starting, ready or terminating): the fleet's GPU requests, averaged over
        subquery steps, times the window."""
        requests = self.joined(
            "kube_pod_container_resource_requests", 'resource="nvidia_com_gpu",unit="integer"'
        )
        gpus = f"sum by ({NAMESPACE_LABEL}, {POD_LABEL}) ({requests})"
        carried = ", ".join(label for label in self._scope.group_by if label != NAMESPACE_LABEL)
        held = (
            f"{gpus} * on ({NAMESPACE_LABEL}, {POD_LABEL}) {self._scheduled()} "
            f"* on ({NAMESPACE_LABEL}, {POD_LABEL}) group_left ({carried}) "
            f"{self.target_pods(metric)}"
        )
        return f"{self._over_window(held, step_seconds)} * {self._window_seconds:g}"

    def pods_holding_gpus(self, metric: str, step_seconds: float) -> str:
        """The target's scheduled pods (starting, ready or terminating), averaged over the
        window: the replicas that cost GPUs, where the engine series see only the ready
        ones."""
        carried = ", ".join(label for label in self._scope.group_by if label != NAMESPACE_LABEL)
        held = (
            f"{self._scheduled()} * on ({NAMESPACE_LABEL}, {POD_LABEL}) group_left ({carried}) "
            f"{self.target_pods(metric)}"
        )
        return self._over_window(held, step_seconds)


def build_queries(
    profile: MetricsGeneration,
    scope: QueryScope,
    window_seconds: float,
    *,
    kube_state_metrics: bool = False,
    ksm_step_seconds: float = 30.0,
) -> dict[QueryKey, Query]:
    """Every query of one evaluation for ``profile``.

    With ``kube_state_metrics`` the batch also reads pod ages, GPU-seconds and the pods
    holding GPUs from kube-state-metrics, joined to the engine series on ``namespace`` and
    ``pod`` (the last two through the pods' owners, so pods not exporting yet count).
    """
    b = _Builder(scope, window_seconds)
    return _queries(profile, b, kube_state_metrics, ksm_step_seconds)


SERIES_LABELS = "series_labels"
"""The name of ``label_query`` in a batch (beside the ``QueryKey`` ones)."""


def label_query(
    profile: MetricsGeneration,
    scope: QueryScope,
    window_seconds: float,
    *,
    kube_state_metrics: bool = False,
    ksm_step_seconds: float = 30.0,
) -> str:
    """Every series ``build_queries`` selects under ``scope`` (same arguments), counted by
    the scope's group labels. For selectors on different label sets sharing ``scope``, it
    shows whether a policy's series carry a label only the others match on: if none do,
    every aggregate of its series is the one its own queries compute."""
    b = _Builder(scope, window_seconds)
    _queries(profile, b, kube_state_metrics, ksm_step_seconds)
    return b.labels_selected()


def _queries(
    profile: MetricsGeneration, b: _Builder, kube_state_metrics: bool, ksm_step_seconds: float
) -> dict[QueryKey, Query]:
    fam = SGLANG if profile is MetricsGeneration.SGLANG_0_5_20 else VLLM
    queries = {
        QueryKey.HITS_LOCAL: Query(b.rate(fam.hits_local), fam.hits_local.metric),
        QueryKey.HITS_EXTERNAL: Query(b.rate(fam.hits_external), fam.hits_external.metric),
        QueryKey.LOOKED_UP: Query(b.rate(fam.looked_up), fam.looked_up.metric),
        QueryKey.REQUESTS: Query(b.rate(fam.requests), fam.requests.metric),
        QueryKey.ARRIVALS: Query(
            b.arrivals(fam.finished, (fam.waiting, fam.running)),
            f"{fam.finished.metric} + {fam.waiting} + {fam.running}",
        ),
        QueryKey.PREEMPTIONS: Query(b.rate(fam.preemptions), fam.preemptions.metric),
        QueryKey.KV_USAGE: Query(b.gauge(fam.kv_usage, "avg"), fam.kv_usage),
        QueryKey.CONTEXT_TOKENS: Query(
            f"{b.rate(fam.prompt_tokens)} + {b.rate(fam.generation_tokens)}",
            f"{fam.prompt_tokens.metric} + {fam.generation_tokens.metric}",
        ),
        QueryKey.POD_SAMPLES: Query(b.samples(fam.running), fam.running),
        QueryKey.POD_HITS: Query(b.rate(fam.hits_local, per_pod=True), fam.hits_local.metric),
        QueryKey.POD_LOOKED_UP: Query(b.rate(fam.looked_up, per_pod=True), fam.looked_up.metric),
        QueryKey.POD_WAITING: Query(b.gauge(fam.waiting, "sum", per_pod=True), fam.waiting),
        QueryKey.POD_RUNNING: Query(b.gauge(fam.running, "sum", per_pod=True), fam.running),
        QueryKey.POD_KV_USAGE: Query(b.gauge(fam.kv_usage, "avg", per_pod=True), fam.kv_usage),
    }
    # The latency buckets: the signals layer computes the quantiles from them, as
    # histogram_quantile would (one operand per histogram instead of one per quantile).
    queries[QueryKey.TTFT_BUCKETS] = Query(b.buckets((fam.ttft,)), fam.ttft + "_bucket")
    queries[QueryKey.ITL_BUCKETS] = Query(b.buckets(fam.itl), fam.itl[0] + "_bucket")
    queries.update(_prefill_queries(profile, b))
    if profile is not MetricsGeneration.SGLANG_0_5_20:  # SGLang exports no equivalent
        queries[QueryKey.POD_CACHE_CONFIG] = Query(
            b.info(fam.running, VLLM_CACHE_CONFIG, CACHE_CONFIG_LABELS), VLLM_CACHE_CONFIG
        )
    if kube_state_metrics:
        queries[QueryKey.POD_AGE] = Query(b.pod_age(fam.running), "kube_pod_status_ready_time")
        queries[QueryKey.GPU_SECONDS] = Query(
            b.gpu_seconds(fam.running, ksm_step_seconds), "kube_pod_container_resource_requests"
        )
        queries[QueryKey.PODS_HOLDING_GPUS] = Query(
            b.pods_holding_gpus(fam.running, ksm_step_seconds), "kube_pod_status_scheduled"
        )
    return queries


def _prefill_queries(profile: MetricsGeneration, b: _Builder) -> dict[QueryKey, Query]:
    """Prefill tokens computed (and, from vLLM 0.13, the per-request histogram)."""
    if profile is MetricsGeneration.VLLM_0_13:
        return {
            QueryKey.PREFILL_COMPUTED: Query(
                b.rate(EngineCounter(VLLM_COMPUTED + "_sum")), VLLM_COMPUTED + "_sum"
            ),
            QueryKey.COMPUTED_COUNT: Query(
                b.rate(EngineCounter(VLLM_COMPUTED + "_count")), VLLM_COMPUTED + "_count"
            ),
            QueryKey.COMPUTED_BUCKETS: Query(
                b.buckets((VLLM_COMPUTED,)), VLLM_COMPUTED + "_bucket"
            ),
        }
    if profile is MetricsGeneration.VLLM_0_9_2:
        prompt, hits = b.rate(EngineCounter(VLLM_PROMPT_TOKENS)), b.rate(VLLM.hits_local)
        reads = f"{VLLM_PROMPT_TOKENS} - {VLLM.hits_local.metric}"
        return {QueryKey.PREFILL_COMPUTED: Query(f"{prompt} - {hits}", reads)}
    return {QueryKey.PREFILL_COMPUTED: Query(b.rate(SGLANG_COMPUTED), SGLANG_COMPUTED.metric)}
