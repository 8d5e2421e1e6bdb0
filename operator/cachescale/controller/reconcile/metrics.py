"""The operator's own Prometheus metrics (``/metrics``), per policy.

Names and labels are the contract the Helm chart's alert rules and dashboard are built
on (``docs/metrics.md``). A signal that is unknown is an absent series, never 0: its
gauge is removed for that policy until it is known again. Deleting a policy removes all
its series. The operator's own health is not per policy: how long evaluations take, how
late they start and how many intervals were missed are one histogram or counter each
(per policy they would be most of the exposition, and rendering it at each scrape would
cost CPU in the number of policies), and
``cachescale_kube_requests_total{verb}`` counts the Kubernetes API requests it sent (the
``KubeApi``'s, by verb: get, list, patch, create, and the target informers' list and
watch; and the peering object's watch), so a steady state that reads nothing from the API
server can be checked (``controller/kube/indexes.py``). No ``_created`` series are exported
(``cachescale run`` turns them off): nothing reads them, and they doubled every counter's
lines.

The per-policy series are one record per policy, rendered to text at each scrape
(``policy_series.py``); the operator-wide ones are ordinary ``prometheus_client`` metrics,
registered in :attr:`OperatorMetrics.registry` after the per-policy collector and also in
a registry of their own. :meth:`OperatorMetrics.exposition` is the body ``/metrics``
serves (``controller/runtime/metrics_server.py``): the same bytes as the library's encoder
over the whole registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector

from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.controller.reconcile.fairness import NAMESPACE_LIMIT, WORKER_LIMIT
from cachescale.controller.reconcile.policy_series import (
    POLICY_GAUGES,
    PolicyRecord,
    PolicySeries,
    rendered_format,
)
from cachescale.decide import Decision
from cachescale.snapshot import Snapshot

KUBE_VERBS = ("get", "list", "patch", "create", "watch")
"""The verbs ``KubeApi`` sends (the informers' list and watch among them), and the
peering watch's (the label values of ``cachescale_kube_requests_total``)."""
_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)  # an operator-wide metric


SIGNAL_GAUGES = {
    "request_full_hit_share": "request_hit_share",
    "prefill_tokens_per_request": "prefill_tokens_per_request",
    "ttft_p95_seconds": "ttft_p95_seconds",
    "gpu_seconds_per_1k_requests": "gpu_seconds_per_1k_requests",
    "requests_per_second": "requests_per_second",
    "arrivals_per_second": "arrivals_per_second",
    "preemptions_per_second": "preemptions_per_second",
}
"""The gauge each exported signal (a field of ``EngineSignals``) is shown as; the hit
rate's is the warm pods' (``EngineSignals.warm_token_hit_rate``)."""


class OperatorMetrics:
    """Every series the operator exports, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        """Every series: what ``generate_latest`` and ``get_sample_value`` read."""
        self._policies = PolicySeries()
        self.registry.register(self._policies)
        self._fleet = CollectorRegistry()
        """The operator-wide series alone, also in :attr:`registry` (after the policies')."""
        self._kube_requests = self._fleet_wide(
            Counter(
                "cachescale_kube_requests",
                "Kubernetes API requests the operator sent, by verb (retries included; its "
                "informers' lists and watches too, kopf's own are not counted).",
                ("verb",),
                registry=self._fleet,
            )
        )
        for verb in KUBE_VERBS:  # every verb exported from the start, at 0
            self._kube_requests.labels(verb)
        self._duration = self._fleet_wide(
            Histogram(
                "cachescale_evaluation_duration_seconds",
                "Time one evaluation took, over all policies.",
                registry=self._fleet,
            )
        )
        self._add_scheduler_metrics()

    def _add_scheduler_metrics(self) -> None:
        """The scheduler's punctuality, over all policies (``reconcile/scheduler.py``)."""
        self._lateness = self._fleet_wide(
            Histogram(
                "cachescale_evaluation_lateness_seconds",
                "Seconds from a policy's due time to the start of its evaluation.",
                buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
                registry=self._fleet,
            )
        )
        self._missed = self._fleet_wide(
            Counter(
                "cachescale_evaluation_missed_intervals",
                "Whole intervals that passed without a due policy's evaluation starting.",
                registry=self._fleet,
            )
        )
        self._waiting = self._fleet_wide(
            Gauge(
                "cachescale_evaluation_jobs_waiting",
                "Gather groups due and held back by a scheduler limit: each of their namespaces "
                "runs --max-concurrent-per-namespace jobs (limit=namespace), or no worker is "
                "free for them (limit=workers).",
                ("limit",),
                registry=self._fleet,
            )
        )
        for limit in (NAMESPACE_LIMIT, WORKER_LIMIT):  # both exported from the start, at 0
            self._waiting.labels(limit)

    def _fleet_wide(self, metric: _Metric) -> _Metric:
        """``metric`` (made in the fleet-wide registry), registered in :attr:`registry` too."""
        self.registry.register(metric)
        return metric

    def exposition(self, encoder: Callable[[Collector], bytes]) -> bytes:
        """Every series in the format of ``encoder`` (one of ``choose_encoder``'s): the
        bytes it writes for :attr:`registry`, the per-policy series rendered by
        :class:`PolicySeries` when it can (``rendered_format``)."""
        openmetrics = rendered_format(encoder)
        if openmetrics is None:
            return encoder(self.registry)
        return self._policies.render(openmetrics).encode() + encoder(self._fleet)

    def started_late(self, seconds: float) -> None:
        """A policy's evaluation started ``seconds`` after its due time."""
        self._lateness.observe(seconds)

    def missed_intervals(self, count: int) -> None:
        """``count`` more whole intervals passed without a policy's evaluation starting."""
        self._missed.inc(count)

    def jobs_waiting(self, by_limit: Mapping[str, int]) -> None:
        """The groups due now and held back, by the scheduler limit that holds them."""
        for limit in (NAMESPACE_LIMIT, WORKER_LIMIT):
            self._waiting.labels(limit).set(by_limit.get(limit, 0))

    def observe(
        self,
        namespace: str,
        name: str,
        spec: CacheScalingPolicySpec,
        snapshot: Snapshot,
        decision: Decision,
    ) -> None:
        """Export one decision's numbers."""
        signals = snapshot.signals
        values = {
            SIGNAL_GAUGES[n]: m.value for n, m in signals.signals().items() if n in SIGNAL_GAUGES
        }
        values["token_hit_rate"] = signals.warm_token_hit_rate(
            float(spec.cache.pod_warmup_seconds)
        ).value
        baseline = decision.memory.baseline
        values |= {
            "baseline_token_hit_rate": baseline.token_hit_rate,
            "baseline_prefill_tokens_per_request": baseline.prefill_tokens_per_request,
            "baseline_gpu_seconds_per_1k_requests": baseline.gpu_seconds_per_1k_requests,
            "slo_ttft_p95_seconds": spec.slo.ttft_p95_seconds,
            "budget_gpu_seconds_per_1k_requests": spec.budget.gpu_seconds_per_1k_requests,
            "replicas": snapshot.workload.replicas,
            "replicas_desired_max": decision.envelope.max_replicas,
            "hpa_wanted_replicas": decision.hpa_wanted_replicas,
            "max_num_seqs": decision.max_num_seqs,
        }
        gauges = [
            None if (value := values.get(gauge)) is None else float(value)
            for gauge, _ in POLICY_GAUGES
        ]
        active = frozenset(alert.reason for alert in decision.alerts)

        def record(series: PolicyRecord) -> None:
            series.gauges = gauges
            series.active_alerts = active
            series.decisions[decision.reason] = series.decisions.get(decision.reason, 0.0) + 1

        self._policies.update((namespace, name), record)

    def evaluated(self, namespace: str, name: str, seconds: float, at: float) -> None:
        """Record one evaluation's duration (in the operator-wide histogram) and time."""
        self._duration.observe(seconds)

        def record(series: PolicyRecord) -> None:
            series.last_evaluation = float(at)

        self._policies.update((namespace, name), record)

    def kube_request(self, verb: str) -> None:
        """Count one request sent to the API server (``KubeApi``'s ``on_request``)."""
        self._kube_requests.labels(verb).inc()

    def failed(self, namespace: str, name: str, kind: str) -> None:
        """Count a failed evaluation."""

        def record(series: PolicyRecord) -> None:
            series.errors[kind] = series.errors.get(kind, 0.0) + 1

        self._policies.update((namespace, name), record)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted policy."""
        self._policies.forget((namespace, name))
