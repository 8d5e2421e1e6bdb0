"""The per-policy series: one compact record per policy, rendered at each scrape.

They are not ``prometheus_client`` children: a child per series carries its own lock,
value and label dict, and a policy has about twenty series; a record holds only the values
and its labels' text, escaped once (the evidence: ``docs/design/operator-scale.md``).

:data:`FAMILIES` is the one list of families, in exposition order. They are rendered two
ways from it. :meth:`PolicySeries.render` writes the text ``/metrics`` serves directly, a
string per sample; :meth:`PolicySeries.collect` builds ``prometheus_client`` families (what
``generate_latest`` and ``get_sample_value`` read, and the reference the first must equal
byte for byte, in the Prometheus text format and in OpenMetrics). Building a family object
and a sample per series cost most of a scrape's CPU at thousands of policies.
:func:`rendered_format` says which of the library's encoders :meth:`~PolicySeries.render`
reproduces: both formats with the escapings that leave these names as they are
(``underscores``, the default, and ``allow-utf-8``); any other is rendered by the library.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cachescale.api.reasons import Diagnosis

ALERT_REASONS = (
    Diagnosis.PREFIX_COLLAPSE,
    Diagnosis.EVICTION_PRESSURE,
    Diagnosis.CACHE_DEGRADED,
    Diagnosis.OVER_BUDGET,
    Diagnosis.SLO_AT_RISK,
    Diagnosis.METRICS_UNAVAILABLE,
)
LABELS = ("namespace", "policy")

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


class Family(NamedTuple):
    """One per-policy family: its name (a counter's without ``_total``), help, type and
    the label its samples have beside ``namespace`` and ``policy`` (None: none)."""

    name: str
    documentation: str
    type: Literal["gauge", "counter"]
    label: str | None = None


GAUGES = tuple(Family(f"cachescale_{name}", doc, "gauge") for name, doc in POLICY_GAUGES)
ALERT = Family(
    "cachescale_alert_active", "1 while an alert of this reason is active.", "gauge", "reason"
)
LAST_EVALUATION = Family(
    "cachescale_last_evaluation_timestamp_seconds", "Unix time of the last evaluation.", "gauge"
)
DECISIONS = Family("cachescale_decisions", "Decisions by reason.", "counter", "reason")
ERRORS = Family(
    "cachescale_evaluation_errors", "Evaluations that failed, by kind.", "counter", "kind"
)
FAMILIES = (*GAUGES, ALERT, LAST_EVALUATION, DECISIONS, ERRORS)
"""Every per-policy family, in exposition order."""


_number: Callable[[float], str] = floatToGoString  # how the library writes a value
"""A sample's value as both formats write it (untyped in ``prometheus_client``)."""


def _label_value(value: str) -> str:
    """A label value escaped as both formats escape it (backslash, newline, quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass(slots=True)
class PolicyRecord:
    """One policy's exported numbers: a value per gauge (None: absent), the alerts active
    at its last decision (None before its first: no alert series), its last evaluation's
    time and its decisions and failures counted by reason and kind. ``labels`` is its
    ``namespace="…",policy="…"``, escaped."""

    labels: str
    gauges: list[float | None] = field(default_factory=lambda: [None] * len(POLICY_GAUGES))
    active_alerts: frozenset[str] | None = None
    last_evaluation: float | None = None
    decisions: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)


class _Heads(NamedTuple):
    """A family's ``# HELP`` and ``# TYPE`` lines and its samples' name, in one format."""

    lines: str
    sample: str


@functools.cache
def _heads(openmetrics_format: bool) -> tuple[_Heads, ...]:
    """Each family's heads as ``generate_latest`` writes them: the Prometheus text format
    names a counter's family ``<name>_total`` and escapes backslash and newline in help;
    OpenMetrics names it ``<name>`` and escapes quotes too."""
    heads = []
    for family in FAMILIES:
        sample = f"{family.name}_total" if family.type == "counter" else family.name
        if openmetrics_format:
            name, documentation = family.name, _label_value(family.documentation)
        else:
            name = sample
            documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines = f"# HELP {name} {documentation}\n# TYPE {name} {family.type}\n"
        heads.append(_Heads(lines, sample))
    return tuple(heads)


def rendered_format(encoder: Callable[[Collector], bytes]) -> bool | None:
    """Whether :meth:`PolicySeries.render` reproduces ``encoder`` (one of
    ``choose_encoder``'s) in OpenMetrics (True) or in the Prometheus text format (False);
    None when it does not (the library must render)."""
    function, keywords = encoder, {}
    if isinstance(encoder, functools.partial):
        if encoder.args:
            return None
        function, keywords = encoder.func, encoder.keywords
    if keywords.get("escaping", openmetrics.UNDERSCORES) not in _PLAIN_ESCAPINGS:
        return None
    if function is openmetrics.generate_latest and set(keywords) <= {"escaping", "version"}:
        return True  # the version changes only native histograms, which these are not
    if function is exposition.generate_latest and set(keywords) <= {"escaping"}:
        return False
    return None


_PLAIN_ESCAPINGS = (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8)
"""The escapings that leave names of the legacy character set, as all of these are, as
they are."""


class PolicySeries(Collector):
    """Every per-policy series, from one record per policy: a ``prometheus_client``
    collector, and a renderer of its text.

    One lock guards the records: evaluations update them, the exposition thread reads
    them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._policies: dict[tuple[str, str], PolicyRecord] = {}

    def update(self, key: tuple[str, str], change: Callable[[PolicyRecord], None]) -> None:
        """Apply ``change`` to the policy's record (made on first use), under the lock."""
        with self._lock:
            record = self._policies.get(key)
            if record is None:
                namespace, name = key
                labels = f'namespace="{_label_value(namespace)}",policy="{_label_value(name)}"'
                record = self._policies[key] = PolicyRecord(labels)
            change(record)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop the policy's record: none of its series is exported any more."""
        with self._lock:
            self._policies.pop(key, None)

    def render(self, openmetrics_format: bool) -> str:
        """Every family's text, as the library's encoder would write it (no ``# EOF``)."""
        heads = _heads(openmetrics_format)
        number = _number
        out: list[str] = []
        with self._lock:
            records = list(self._policies.values())
            for index, head in enumerate(heads[: len(GAUGES)]):
                out.append(head.lines)
                sample = head.sample
                out += [
                    f"{sample}{{{record.labels}}} {number(value)}\n"
                    for record in records
                    if (value := record.gauges[index]) is not None
                ]
            alert, last, decisions, errors = heads[len(GAUGES) :]
            out.append(alert.lines)
            for record in records:  # labels sorted by name: namespace, policy, reason
                if (active := record.active_alerts) is not None:
                    start = f"{alert.sample}{{{record.labels},reason="
                    out += [
                        f'{start}"{reason}"}} {"1.0" if reason in active else "0.0"}\n'
                        for reason in _ALERT_VALUES
                    ]
            out.append(last.lines)
            out += [
                f"{last.sample}{{{record.labels}}} {number(at)}\n"
                for record in records
                if (at := record.last_evaluation) is not None
            ]
            out.append(decisions.lines)
            for record in records:
                out += [
                    f'{decisions.sample}{{{record.labels},reason="{_label_value(reason)}"}} '
                    f"{number(count)}\n"
                    for reason, count in record.decisions.items()
                ]
            out.append(errors.lines)
            for record in records:  # kind sorts before namespace
                out += [
                    f'{errors.sample}{{kind="{_label_value(kind)}",{record.labels}}} '
                    f"{number(count)}\n"
                    for kind, count in record.errors.items()
                ]
        return "".join(out)

    def collect(self) -> Iterator[Metric]:
        """One ``prometheus_client`` family per per-policy metric, built under the lock."""
        with self._lock:
            records = list(self._policies.items())
            families = self._families(records)
        yield from families

    @staticmethod
    def _families(records: list[tuple[tuple[str, str], PolicyRecord]]) -> list[Metric]:
        def made(family: Family) -> GaugeMetricFamily | CounterMetricFamily:
            kind = GaugeMetricFamily if family.type == "gauge" else CounterMetricFamily
            labels = LABELS if family.label is None else (*LABELS, family.label)
            return kind(family.name, family.documentation, labels=labels)

        gauges = [made(family) for family in GAUGES]
        alert, last, decisions, errors = (
            made(f) for f in (ALERT, LAST_EVALUATION, DECISIONS, ERRORS)
        )
        for key, record in records:
            for family, value in zip(gauges, record.gauges, strict=True):
                if value is not None:
                    family.add_metric(key, value)
            if record.active_alerts is not None:
                for reason in _ALERT_VALUES:
                    active = 1.0 if reason in record.active_alerts else 0.0
                    alert.add_metric((*key, reason), active)
            if record.last_evaluation is not None:
                last.add_metric(key, record.last_evaluation)
            for decided, count in record.decisions.items():
                decisions.add_metric((*key, decided), count)
            for kind, count in record.errors.items():
                errors.add_metric((*key, kind), count)
        return [*gauges, alert, last, decisions, errors]


_ALERT_VALUES = tuple(reason.value for reason in ALERT_REASONS)
"""The ``reason`` of each alert series (legacy characters only: no escaping)."""
