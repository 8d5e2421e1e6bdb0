"""The operator's own Prometheus metrics (``/metrics``), per policy.

Names and labels are the contract the Helm chart's alert rules and dashboard are built
on (``docs/metrics.md``). A signal that is unknown is an absent series, never 0: its
gauge is removed for that policy until it is known again. Deleting a policy removes all
its series. The operator's own health is not per policy: how long evaluations take, how
late they start and how many intervals were missed are one histogram or counter each
(per policy they were most of the exposition: at 1,000 policies, rendering /metrics for
each scrape took a fifth of the operator's CPU), and
``cachescale_kube_requests_total{verb}`` counts the Kubernetes API requests it sent (the
``KubeApi``'s, by verb: get, list, patch, create, and the target informers' list and
watch; and the peering object's watch), so a steady state that reads nothing from the API
server can be checked (``controller/indexes.py``). No ``_created`` series are exported
(``cachescale run`` turns them off): nothing reads them, and they doubled every counter's
lines.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
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


class OperatorMetrics:
    """Every series the operator exports, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._series: dict[
            tuple[str, str], dict[tuple[MetricWrapperBase, tuple[str, ...]], Any]
        ] = {}
        """Per policy, each series it has and its child (``collector.labels``, whose lookup
        validates the labels under a lock: some twenty per evaluation otherwise)."""

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, (*LABELS, *extra), registry=self.registry)

        self._signals = {
            "token_hit_rate": gauge(
                "cachescale_token_hit_rate", "Token-weighted prefix-cache hit rate on warm pods."
            ),
            "request_full_hit_share": gauge(
                "cachescale_request_hit_share", "Share of requests that skipped almost all prefill."
            ),
            "prefill_tokens_per_request": gauge(
                "cachescale_prefill_tokens_per_request", "Prompt tokens computed per request."
            ),
            "ttft_p95_seconds": gauge(
                "cachescale_ttft_p95_seconds", "Time to first token, 95th percentile, seconds."
            ),
            "gpu_seconds_per_1k_requests": gauge(
                "cachescale_gpu_seconds_per_1k_requests",
                "GPU-seconds per 1,000 successful requests.",
            ),
            "requests_per_second": gauge(
                "cachescale_requests_per_second", "Successful requests per second (served)."
            ),
            "arrivals_per_second": gauge(
                "cachescale_arrivals_per_second",
                "Requests arriving per second (offered): every finish reason plus queue growth.",
            ),
            "preemptions_per_second": gauge(
                "cachescale_preemptions_per_second", "Engine preemptions per second."
            ),
        }
        self._slo = gauge(
            "cachescale_slo_ttft_p95_seconds", "The policy's TTFT p95 objective, seconds."
        )
        self._budget = gauge(
            "cachescale_budget_gpu_seconds_per_1k_requests",
            "The policy's GPU-s per 1k requests budget.",
        )
        self._replicas = gauge("cachescale_replicas", "Current replicas of the Deployment.")
        self._desired_max = gauge(
            "cachescale_replicas_desired_max", "The maxReplicas cachescale decided."
        )
        self._hpa_wanted = gauge(
            "cachescale_hpa_wanted_replicas", "Replicas the HPA's own metric asks for (estimate)."
        )
        self._max_num_seqs = gauge(
            "cachescale_max_num_seqs", "The engine's batch ceiling (--max-num-seqs)."
        )
        self._alert = gauge(
            "cachescale_alert_active", "1 while an alert of this reason is active.", ("reason",)
        )
        self._last = gauge(
            "cachescale_last_evaluation_timestamp_seconds", "Unix time of the last evaluation."
        )
        self._decisions = Counter(
            "cachescale_decisions",
            "Decisions by reason.",
            (*LABELS, "reason"),
            registry=self.registry,
        )
        self._errors = Counter(
            "cachescale_evaluation_errors",
            "Evaluations that failed, by kind.",
            (*LABELS, "kind"),
            registry=self.registry,
        )
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
        """The scheduler's punctuality, over all policies (``controller/scheduler.py``)."""
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

    def started_late(self, seconds: float) -> None:
        """A policy's evaluation started ``seconds`` after its due time."""
        self._lateness.observe(seconds)

    def missed_intervals(self, count: int) -> None:
        """``count`` more whole intervals passed without a policy's evaluation starting."""
        self._missed.inc(count)

    def observe(
        self,
        namespace: str,
        name: str,
        spec: CacheScalingPolicySpec,
        snapshot: Snapshot,
        decision: Decision,
    ) -> None:
        """Export one decision's numbers."""
        key = (namespace, name)
        signals = snapshot.signals
        warm = signals.warm_token_hit_rate(float(spec.cache.pod_warmup_seconds))
        values = {name_: m.value for name_, m in signals.signals().items()}
        values["token_hit_rate"] = warm.value
        for signal, metric in self._signals.items():
            self._set_or_remove(metric, key, values.get(signal))
        self._labels(self._slo, *key).set(spec.slo.ttft_p95_seconds)
        self._labels(self._budget, *key).set(spec.budget.gpu_seconds_per_1k_requests)
        self._labels(self._replicas, *key).set(snapshot.workload.replicas)
        self._labels(self._desired_max, *key).set(decision.envelope.max_replicas)
        self._set_or_remove(self._hpa_wanted, key, decision.hpa_wanted_replicas)
        self._set_or_remove(self._max_num_seqs, key, decision.max_num_seqs)
        active = {a.reason for a in decision.alerts}
        for reason in ALERT_REASONS:
            self._labels(self._alert, *key, reason.value).set(1 if reason.value in active else 0)
        self._labels(self._decisions, *key, decision.reason).inc()

    def evaluated(self, namespace: str, name: str, seconds: float, at: float) -> None:
        """Record one evaluation's duration (in the operator-wide histogram) and time."""
        self._duration.observe(seconds)
        self._labels(self._last, namespace, name).set(at)

    def kube_request(self, verb: str) -> None:
        """Count one request sent to the API server (``KubeApi``'s ``on_request``)."""
        self._kube_requests.labels(verb).inc()

    def failed(self, namespace: str, name: str, kind: str) -> None:
        """Count a failed evaluation."""
        self._labels(self._errors, namespace, name, kind).inc()

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted policy."""
        for collector, labels in self._series.pop((namespace, name), {}):
            with contextlib.suppress(KeyError):
                collector.remove(*labels)

    def _labels(self, collector: MetricWrapperBase, *labels: str) -> Any:
        """``collector.labels(...)``, remembered so ``forget`` can remove it."""
        children = self._series.setdefault((labels[0], labels[1]), {})
        child = children.get((collector, labels))
        if child is None:
            child = children[collector, labels] = collector.labels(*labels)
        return child

    def _set_or_remove(self, gauge: Gauge, key: tuple[str, str], value: float | None) -> None:
        """Set the gauge, or remove its series when the value is unknown (never 0; a
        removed child is no longer exported, so it is forgotten too)."""
        if value is None:
            self._series.get(key, {}).pop((gauge, key), None)
            with contextlib.suppress(KeyError):
                gauge.remove(*key)
        else:
            self._labels(gauge, *key).set(value)
