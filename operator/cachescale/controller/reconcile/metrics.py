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

The per-policy series are not ``prometheus_client`` children: :class:`PolicySeries` keeps
one compact record per policy and renders the families at each scrape. A child per
series carries its own lock, value and label dict, and a policy has about twenty series;
a record holds only the values, and the exposition is the same (the evidence:
``docs/design/operator-scale.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.controller.reconcile.fairness import NAMESPACE_LIMIT, WORKER_LIMIT
from cachescale.decide import Decision
from cachescale.snapshot import Snapshot

ALERT_REASONS = (
    Diagnosis.PREFIX_COLLAPSE,
    Diagnosis.EVICTION_PRESSURE,
    Diagnosis.CACHE_DEGRADED,
    Diagnosis.OVER_BUDGET,
    Diagnosis.SLO_AT_RISK,
    Diagnosis.METRICS_UNAVAILABLE,
)
LABELS = ("namespace", "policy")
KUBE_VERBS = ("get", "list", "patch", "create", "watch")
"""The verbs ``KubeApi`` sends (the informers' list and watch among them), and the
peering watch's (the label values of ``cachescale_kube_requests_total``)."""


POLICY_GAUGES = (
    ("token_hit_rate", "Token-weighted prefix-cache hit rate on warm pods."),
    ("request_hit_share", "Share of requests that skipped almost all prefill."),
    ("prefill_tokens_per_request", "Prompt tokens computed per request."),
    ("ttft_p95_seconds", "Time to first token, 95th percentile, seconds."),
    ("gpu_seconds_per_1k_requests", "GPU-seconds per 1,000 successful requests."),
    ("requests_per_second", "Successful requests per second (served)."),
    (
        "arrivals_per_second",
        "Requests arriving per second (offered): every finish reason plus queue growth.",
    ),
    ("preemptions_per_second", "Engine preemptions per second."),
    ("baseline_token_hit_rate", "The learned healthy warm-pod token hit rate."),
    ("baseline_prefill_tokens_per_request", "The learned healthy prefill tokens per request."),
    ("baseline_gpu_seconds_per_1k_requests", "The learned healthy GPU-s per 1k requests."),
    ("slo_ttft_p95_seconds", "The policy's TTFT p95 objective, seconds."),
    ("budget_gpu_seconds_per_1k_requests", "The policy's GPU-s per 1k requests budget."),
    ("replicas", "Current replicas of the Deployment."),
    ("replicas_desired_max", "The maxReplicas cachescale decided."),
    ("hpa_wanted_replicas", "Replicas the HPA's own metric asks for (estimate)."),
    ("max_num_seqs", "The engine's batch ceiling (--max-num-seqs)."),
)
"""Each per-policy gauge (``cachescale_<name>``) and its help, in exposition order."""
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


@dataclass(slots=True)
class _PolicySeries:
    """One policy's exported numbers: a value per gauge (None: absent), the alerts active
    at its last decision (None before its first: no alert series), its last evaluation's
    time and its decisions and failures counted by reason and kind."""

    gauges: list[float | None] = field(default_factory=lambda: [None] * len(POLICY_GAUGES))
    active_alerts: frozenset[str] | None = None
    last_evaluation: float | None = None
    decisions: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)


class PolicySeries(Collector):
    """Every per-policy series, rendered at each scrape from one record per policy.

    One lock guards the records: evaluations update them, the exposition thread reads
    them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._policies: dict[tuple[str, str], _PolicySeries] = {}

    def update(self, key: tuple[str, str], change: Callable[[_PolicySeries], None]) -> None:
        """Apply ``change`` to the policy's record (made on first use), under the lock."""
        with self._lock:
            record = self._policies.get(key)
            if record is None:
                record = self._policies[key] = _PolicySeries()
            change(record)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop the policy's record: none of its series is exported any more."""
        with self._lock:
            self._policies.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        """One family per per-policy metric, built from the records under the lock."""
        with self._lock:
            records = list(self._policies.items())
            families = self._families(records)
        yield from families

    @staticmethod
    def _families(records: list[tuple[tuple[str, str], _PolicySeries]]) -> list[Metric]:
        gauges = [
            GaugeMetricFamily(f"cachescale_{name}", doc, labels=LABELS)
            for name, doc in POLICY_GAUGES
        ]
        alert = GaugeMetricFamily(
            "cachescale_alert_active",
            "1 while an alert of this reason is active.",
            labels=(*LABELS, "reason"),
        )
        last = GaugeMetricFamily(
            "cachescale_last_evaluation_timestamp_seconds",
            "Unix time of the last evaluation.",
            labels=LABELS,
        )
        decisions = CounterMetricFamily(
            "cachescale_decisions", "Decisions by reason.", labels=(*LABELS, "reason")
        )
        errors = CounterMetricFamily(
            "cachescale_evaluation_errors",
            "Evaluations that failed, by kind.",
            labels=(*LABELS, "kind"),
        )
        for key, record in records:
            for family, value in zip(gauges, record.gauges, strict=True):
                if value is not None:
                    family.add_metric(key, value)
            if record.active_alerts is not None:
                for reason in ALERT_REASONS:
                    active = 1.0 if reason.value in record.active_alerts else 0.0
                    alert.add_metric((*key, reason.value), active)
            if record.last_evaluation is not None:
                last.add_metric(key, record.last_evaluation)
            for decided, count in record.decisions.items():
                decisions.add_metric((*key, decided), count)
            for kind, count in record.errors.items():
                errors.add_metric((*key, kind), count)
        return [*gauges, alert, last, decisions, errors]


class OperatorMetrics:
    """Every series the operator exports, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._policies = PolicySeries()
        self.registry.register(self._policies)
        self._kube_requests = Counter(
            "cachescale_kube_requests",
            "Kubernetes API requests the operator sent, by verb (retries included; its "
            "informers' lists and watches too, kopf's own are not counted).",
            ("verb",),
            registry=self.registry,
        )
        for verb in KUBE_VERBS:  # every verb exported from the start, at 0
            self._kube_requests.labels(verb)
        self._duration = Histogram(
            "cachescale_evaluation_duration_seconds",
            "Time one evaluation took, over all policies.",
            registry=self.registry,
        )
        self._add_scheduler_metrics()

    def _add_scheduler_metrics(self) -> None:
        """The scheduler's punctuality, over all policies (``reconcile/scheduler.py``)."""
        self._lateness = Histogram(
            "cachescale_evaluation_lateness_seconds",
            "Seconds from a policy's due time to the start of its evaluation.",
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self._missed = Counter(
            "cachescale_evaluation_missed_intervals",
            "Whole intervals that passed without a due policy's evaluation starting.",
            registry=self.registry,
        )
        self._waiting = Gauge(
            "cachescale_evaluation_jobs_waiting",
            "Gather groups due and held back by a scheduler limit: each of their namespaces "
            "runs --max-concurrent-per-namespace jobs (limit=namespace), or no worker is "
            "free for them (limit=workers).",
            ("limit",),
            registry=self.registry,
        )
        for limit in (NAMESPACE_LIMIT, WORKER_LIMIT):  # both exported from the start, at 0
            self._waiting.labels(limit)

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

        def record(series: _PolicySeries) -> None:
            series.gauges = gauges
            series.active_alerts = active
            series.decisions[decision.reason] = series.decisions.get(decision.reason, 0.0) + 1

        self._policies.update((namespace, name), record)

    def evaluated(self, namespace: str, name: str, seconds: float, at: float) -> None:
        """Record one evaluation's duration (in the operator-wide histogram) and time."""
        self._duration.observe(seconds)

        def record(series: _PolicySeries) -> None:
            series.last_evaluation = float(at)

        self._policies.update((namespace, name), record)

    def kube_request(self, verb: str) -> None:
        """Count one request sent to the API server (``KubeApi``'s ``on_request``)."""
        self._kube_requests.labels(verb).inc()

    def failed(self, namespace: str, name: str, kind: str) -> None:
        """Count a failed evaluation."""

        def record(series: _PolicySeries) -> None:
            series.errors[kind] = series.errors.get(kind, 0.0) + 1

        self._policies.update((namespace, name), record)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted policy."""
        self._policies.forget((namespace, name))
