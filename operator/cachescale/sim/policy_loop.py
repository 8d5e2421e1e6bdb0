"""cachescale in the loop: the policy engine reshaping a simulated HPA's envelope.

``--autoscaler cachescale`` runs the same HPA as ``--autoscaler hpa``, but every policy
interval ``cachescale.decide.decide`` reads what a Prometheus scraping the pods would show
(``observe.ScrapedFleet``: windowed rates of the engines' counters, histogram quantiles)
and sets the HPA's min/max/target and the Deployment's ``--max-num-seqs``, as the operator
would in ``Enforce`` mode. It never reads the simulator's ground truth: per-request
outcomes exist only in the reports, after the run.

The operator arrives at ``policy_start_s`` (Prometheus scrapes from the start), so its
first window already holds data, as when cachescale is installed on a running fleet. A
``metrics_outage`` perturbation blinds it (no scrapes stored, every signal unknown) while
the HPA keeps scaling on its own pipeline; the first blind evaluation is retried, as the
operator retries a first failed read (``decide.engine.read_retried``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cachescale.api.spec import CacheScalingPolicySpec, Mode
from cachescale.decide import Decision, LearnedState, decide
from cachescale.decide.engine import read_retried
from cachescale.decide.envelope import Envelope
from cachescale.sim.autoscaler import FleetObservation, HPAAutoscaler, PolicyRecord, ScaleDecision
from cachescale.sim.observe import ScrapedFleet
from cachescale.sim.profiles import get_profile
from cachescale.sim.scenario import MetricsOutage, Scenario
from cachescale.snapshot import EngineSignals, FetchFailure, HPAState, Snapshot, WorkloadState

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated second 0 as a timestamp (decisions carry datetimes, the simulator seconds)."""
SIMULATED_PROMETHEUS = "http://prometheus.simulated:9090"


def scenario_policy(scenario: Scenario) -> CacheScalingPolicySpec:
    """The policy cachescale runs with: the scenario's ``policy`` over simulator defaults.

    Defaults: Enforce mode, the report's TTFT SLO and budget, and the HPA's own replica
    range as the budget's range.
    """
    hpa = scenario.autoscaler
    if hpa is None:
        raise ValueError(f"scenario {scenario.name} has a fixed fleet: nothing to autoscale")
    budget: dict[str, Any] = {"minReplicas": hpa.min_replicas, "maxReplicas": hpa.max_replicas}
    if scenario.report.budget_gpu_s_per_1k is not None:
        budget["gpuSecondsPer1kRequests"] = scenario.report.budget_gpu_s_per_1k
    defaults: dict[str, Any] = {
        "mode": Mode.ENFORCE.value,
        "target": {"deploymentName": "engine", "hpaName": "engine"},
        "metrics": {"prometheusUrl": SIMULATED_PROMETHEUS},
        "slo": {"ttftP95Seconds": scenario.report.slo_ttft_p95_s},
        "budget": budget,
    }
    return CacheScalingPolicySpec.model_validate(_merged(defaults, scenario.policy))


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


class CachescaleAutoscaler:
    """The HPA, with cachescale's decision engine reconciling its envelope."""

    name = "cachescale"

    def __init__(
        self, hpa: HPAAutoscaler, policy: CacheScalingPolicySpec, scenario: Scenario
    ) -> None:
        self._hpa = hpa
        self._policy = policy
        self.sync_period_s = hpa.sync_period_s
        self._gpus_per_pod = float(get_profile(scenario.fleet.profile).gpus_per_replica)
        self._outages = [p for p in scenario.perturbations if isinstance(p, MetricsOutage)]
        self._scraped = ScrapedFleet()
        self._memory = LearnedState()
        self._failed_reads = 0
        spec = hpa.spec
        self._envelope = Envelope(spec.min_replicas, spec.max_replicas, spec.target_average_value)
        self._next_evaluation_s = max(scenario.policy_start_s, policy.metrics.interval_seconds)
        self._records: list[PolicyRecord] = []

    @property
    def records(self) -> list[PolicyRecord]:
        """Every evaluation so far."""
        return self._records

    def step(self, observation: FleetObservation) -> ScaleDecision:
        """Scrape, evaluate the policy when due, then run the HPA inside the envelope."""
        now_s = observation.now_s
        blind = any(outage.covers(now_s) for outage in self._outages)
        if not blind:
            self._scraped.scrape(observation.pods, now_s)
        max_num_seqs = None
        if now_s + 1e-9 >= self._next_evaluation_s:
            self._next_evaluation_s += self._policy.metrics.interval_seconds
            decision = self._evaluate(observation, blind)
            if decision is not None and self._policy.mode is Mode.ENFORCE:
                self._envelope = decision.envelope
                if decision.max_num_seqs != observation.max_num_seqs:
                    max_num_seqs = decision.max_num_seqs
        envelope = self._envelope
        target = envelope.target_average_value or self._hpa.spec.target_average_value
        scaled = self._hpa.step_within(
            observation, (envelope.min_replicas, envelope.max_replicas, target)
        )
        return ScaleDecision(scaled.desired_replicas, scaled.reason, max_num_seqs)

    def _evaluate(self, observation: FleetObservation, blind: bool) -> Decision | None:
        """Decide, or None when the read failed and is retried (``read_retried``), as the
        operator does: nothing decided, nothing recorded."""
        now_s = observation.now_s
        signals = self._signals(observation, blind)
        self._failed_reads = self._failed_reads + 1 if blind else 0
        if read_retried(signals, self._failed_reads, self._memory):
            return None
        snapshot = Snapshot(signals, self._workload(observation))
        decision = decide(self._policy, snapshot, self._memory, EPOCH + timedelta(seconds=now_s))
        self._memory = decision.memory
        self._records.append(_record(now_s, decision, snapshot))
        return decision

    def _signals(self, observation: FleetObservation, blind: bool) -> EngineSignals:
        window = self._policy.metrics.window_seconds
        observed_at = EPOCH + timedelta(seconds=observation.now_s)
        if blind:
            return EngineSignals.all_unknown(
                f"Prometheus is unreachable at {SIMULATED_PROMETHEUS} (simulated outage)",
                observed_at=observed_at,
                window_seconds=window,
                failure=FetchFailure.UNREACHABLE,
            )
        return self._scraped.signals(observation.now_s, window, observed_at=observed_at)

    def _workload(self, observation: FleetObservation) -> WorkloadState:
        now_s = observation.now_s
        envelope = self._envelope
        return WorkloadState(
            replicas=observation.replicas,
            ready_replicas=observation.ready_replicas,
            pod_ages_seconds=tuple(
                pod.age_s(now_s) for pod in observation.pods if pod.is_ready(now_s)
            ),
            gpus_per_pod=self._gpus_per_pod,
            hpa=HPAState(
                min_replicas=envelope.min_replicas,
                max_replicas=envelope.max_replicas,
                target_average_value=envelope.target_average_value,
                metric_name=self._hpa.metric_name,
            ),
            max_num_seqs=observation.max_num_seqs,
            rollout_in_progress=observation.rollout_in_progress,
        )


def _record(now_s: float, decision: Decision, snapshot: Snapshot) -> PolicyRecord:
    envelope = decision.envelope
    return PolicyRecord(
        t_s=now_s,
        state=decision.state.value,
        reason=decision.reason,
        message=decision.message,
        min_replicas=envelope.min_replicas,
        max_replicas=envelope.max_replicas,
        target=envelope.target_average_value,
        max_num_seqs=decision.max_num_seqs,
        hit_rate_seen=snapshot.signals.token_hit_rate_local.value,
        baseline_hit_rate=decision.memory.baseline.token_hit_rate,
        ceiling=decision.ceiling,
        alerts=tuple(a.reason for a in decision.alerts),
        raised=tuple(f"{c.reason}: {c.message}" for c in decision.raised),
        cleared=tuple(c.reason for c in decision.cleared),
        cleared_messages=tuple(c.message for c in decision.cleared),
    )
