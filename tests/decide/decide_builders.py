"""Snapshots, specs and memories for decision tests, healthy unless told otherwise.

A healthy fleet: 11 ready 2-GPU pods, all warm, serving 32 req/s at a 0.85 token hit rate,
TTFT p95 0.5 s, 680 GPU-s/1k against a 780 budget; the baseline already learned.
Every test states only what differs from that. ``run`` evaluates a sequence of snapshots
as the operator would, one interval apart; ``condition`` reads one status condition.
``slo_first``, ``capped_at_budget`` and ``short_fleet`` are the SLO guard's situations
that several test files share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import Decision, decide
from cachescale.decide.learned import LearnedBaseline, LearnedState, ReplicaMark
from cachescale.snapshot import (
    EngineSignals,
    HPAState,
    HumanRequests,
    Measured,
    MetricsGeneration,
    PodSignals,
    Snapshot,
    Unit,
    WorkloadState,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
INTERVAL = timedelta(seconds=30)


def spec(**overrides: Any) -> CacheScalingPolicySpec:
    """A Hold policy: SLO 1 s, budget 780 GPU-s/1k, replicas 4..40, wire-format overrides."""
    wire: dict[str, Any] = {
        "mode": "Enforce",
        "target": {"deploymentName": "llm", "hpaName": "llm"},
        "metrics": {"prometheusUrl": "http://prometheus:9090"},
        "slo": {"ttftP95Seconds": 1.0},
        "budget": {"gpuSecondsPer1kRequests": 780, "minReplicas": 4, "maxReplicas": 40},
    }
    for key, value in overrides.items():
        wire[key] = {**wire.get(key, {}), **value} if isinstance(value, dict) else value
    return CacheScalingPolicySpec.model_validate(wire)


BATCHING = {
    "manageMaxNumSeqs": True,
    "minNumSeqs": 16,
    "maxNumSeqs": 256,
    "model": {"layers": 32, "kvHeads": 32, "headDim": 128, "weightsGiB": 12.55},
    "gpu": {"memoryGiB": 80, "gpuMemoryUtilization": 0.9},
    "cacheReserveGiB": 9,
}
"""Llama-2-7B on an A100-80GB: B_max = 50 at 2,048 context tokens."""


def known(value: float, unit: Unit) -> Measured:
    return Measured.known(value, unit)


def pod(name: str, age_s: float, hit_rate: float | None, volume: float = 1000.0) -> PodSignals:
    rate = (
        known(hit_rate, Unit.RATIO)
        if hit_rate is not None
        else Measured.unknown("only 1 sample(s) of this pod in the window", Unit.RATIO)
    )
    return PodSignals(
        pod=name,
        age_seconds=known(age_s, Unit.SECONDS),
        token_hit_rate=rate,
        prompt_tokens_looked_up_per_second=known(volume, Unit.TOKENS_PER_SECOND),
        waiting_requests=known(0, Unit.REQUESTS),
        running_requests=known(20, Unit.REQUESTS),
        kv_cache_usage_ratio=known(0.5, Unit.RATIO),
    )


def signals(
    *,
    hit: float | None = 0.85,
    warm_pods: int = 11,
    cold_pods: int = 0,
    cold_hit: float = 0.1,
    at: datetime = T0,
    **values: float | None,
) -> EngineSignals:
    """Healthy engine signals; ``values`` override fleet signals by field name (None:
    unknown); ``hit`` is every warm pod's (and the fleet's) token hit rate."""
    fleet: dict[str, float | None] = {
        "token_hit_rate_local": hit,
        "request_full_hit_share": 0.6,
        "prefill_tokens_per_request": 400.0,
        "ttft_p50_seconds": 0.2,
        "ttft_p95_seconds": 0.5,
        "ttft_p99_seconds": 0.8,
        "itl_p95_seconds": 0.05,
        "requests_per_second": 32.0,
        "preemptions_per_second": 0.0,
        "waiting_requests_per_pod": 0.0,
        "running_requests_per_pod": 20.0,
        "kv_cache_usage_ratio": 0.5,
        "gpu_seconds_per_1k_requests": 680.0,
        "context_tokens_per_request": 2048.0,
    }
    fleet.update(values)
    base = EngineSignals.all_unknown("unset", observed_at=at, window_seconds=300)
    measured = {
        name: (
            known(value, base.signals()[name].unit)
            if value is not None
            else Measured.unknown("series absent", base.signals()[name].unit)
        )
        for name, value in fleet.items()
    }
    pods = [pod(f"warm-{i}", 3600.0, hit) for i in range(warm_pods)]
    pods += [pod(f"cold-{i}", 60.0, cold_hit) for i in range(cold_pods)]
    return EngineSignals(
        profile=MetricsGeneration.VLLM_0_13,
        observed_at=at,
        window_seconds=300,
        token_hit_rate_with_external=Measured.unknown("no connector", Unit.RATIO),
        full_hit_max_computed_tokens=200.0,
        pods=tuple(pods),
        **measured,  # type: ignore[arg-type]
    )


def workload(
    *,
    replicas: int = 11,
    ready: int | None = None,
    cold_pods: int = 0,
    hpa: tuple[int, int, float] = (4, 40, 24.0),
    max_num_seqs: int | None = 32,
    rollout: bool = False,
) -> WorkloadState:
    ready = replicas if ready is None else ready
    ages = (3600.0,) * (ready - cold_pods) + (60.0,) * cold_pods
    return WorkloadState(
        replicas=replicas,
        ready_replicas=ready,
        pod_ages_seconds=ages,
        gpus_per_pod=2,
        hpa=HPAState(hpa[0], hpa[1], hpa[2], "vllm:num_requests_running"),
        max_num_seqs=max_num_seqs,
        rollout_in_progress=rollout,
    )


def snapshot(
    engine: EngineSignals | None = None,
    fleet: WorkloadState | None = None,
    human: HumanRequests | None = None,
) -> Snapshot:
    return Snapshot(engine or signals(), fleet or workload(), human or HumanRequests())


def learned(**overrides: Any) -> LearnedState:
    """A memory after an hour of healthy evaluations (baseline 0.85, 400 tokens, 32 req/s)."""
    baseline = LearnedBaseline(
        token_hit_rate=0.85,
        prefill_tokens_per_request=400.0,
        gpu_seconds_per_1k_requests=680.0,
        requests_per_second=32.0,
        updated_at=T0 - INTERVAL,
        evaluations=120,
    )
    fields: dict[str, Any] = {
        "baseline": baseline,
        "data_since": T0 - timedelta(hours=1),
        "pre_collapse": ReplicaMark(replicas=11, requests_per_second=32.0, at=T0 - INTERVAL),
    }
    fields.update(overrides)
    return LearnedState(**fields)


def run(
    policy: CacheScalingPolicySpec,
    snapshots: Sequence[Snapshot],
    memory: LearnedState | None = None,
    start: datetime = T0,
) -> list[Decision]:
    """Evaluate ``snapshots`` one interval apart, threading the memory through."""
    decisions = []
    memory = memory if memory is not None else learned()
    for index, state in enumerate(snapshots):
        decision = decide(policy, state, memory, start + index * INTERVAL)
        memory = decision.memory
        decisions.append(decision)
    return decisions


def run_applied(policy: CacheScalingPolicySpec, snapshots: Sequence[Snapshot]) -> list[Decision]:
    """``run``, each evaluation reading the HPA's minReplicas as the one before left it."""
    decisions: list[Decision] = []
    memory = learned()
    for index, state in enumerate(snapshots):
        if decisions:
            hpa = replace(state.workload.hpa, min_replicas=decisions[-1].envelope.min_replicas)
            state = replace(state, workload=replace(state.workload, hpa=hpa))
        decision = decide(policy, state, memory, T0 + index * INTERVAL)
        memory = decision.memory
        decisions.append(decision)
    return decisions


def condition(decision: Decision, kind: ConditionType) -> tuple[ConditionStatus, str]:
    verdict = next(c for c in decision.conditions if c.type is kind)
    return verdict.status, verdict.reason


# --- scenarios shared by the envelope, SLO guard, floor and alert tests -----------------


def slo_first(
    on_collapse: str,
    p95s: list[float],
    served: float = 28.0,
    applied: bool = False,
    waiting: float = 3.0,
    running: float = 40.0,
    ready: int = 12,
    metric: str = "vllm:num_requests_running",
    cold_pods: int = 0,
    arrivals: float | None = 32.0,
) -> list[Decision]:
    """A collapse on 12 settled pods capped by the budget (780 × 32 / 2000 = 12) that
    serve 28 of the 32 arriving req/s (``waiting`` per pod), with TTFT p95 going through
    ``p95s``. ``applied``: each evaluation reads the HPA as the one before left it."""

    def at(p95: float) -> Snapshot:
        engine = signals(
            hit=0.04,
            ttft_p95_seconds=p95,
            requests_per_second=served,
            arrivals_per_second=arrivals,
            waiting_requests_per_pod=waiting,
            gpu_seconds_per_1k_requests=1100.0,
            prefill_tokens_per_request=2000,
            running_requests_per_pod=running,
        )
        fleet = workload(replicas=12, ready=ready, cold_pods=cold_pods, hpa=(4, 12, 24.0))
        fleet = replace(fleet, hpa=replace(fleet.hpa, metric_name=metric))
        return snapshot(engine, fleet)

    policy = spec(cache={"onCollapse": on_collapse})
    states = [at(p95) for p95 in p95s]
    return run_applied(policy, states) if applied else run(policy, states)


def dearer_cache_without_a_queue(
    running_per_pod: float, ttft_p95_seconds: float = 2.5
) -> EngineSignals:
    """No collapse, a dearer cache (800 GPU-s/1k against the 780 budget): all 32 arriving
    req/s served with no queue, at ``ttft_p95_seconds`` (by default over the 1 s SLO)."""
    return signals(
        ttft_p95_seconds=ttft_p95_seconds,
        arrivals_per_second=32.0,
        waiting_requests_per_pod=0.2,
        running_requests_per_pod=running_per_pod,
        gpu_seconds_per_1k_requests=800.0,
    )


def capped_at_budget(running_per_pod: float, on_collapse: str = "Hold") -> list[Decision]:
    """``dearer_cache_without_a_queue`` for two evaluations on 12 pods, capped at the
    budget's 12 (780 × 32 / 2000)."""
    engine = dearer_cache_without_a_queue(running_per_pod)
    policy = spec(cache={"onCollapse": on_collapse})
    return run(policy, [snapshot(engine, workload(replicas=12, hpa=(4, 12, 24.0)))] * 2)


def short_fleet(
    *,
    waiting: float = 3.0,
    served: float = 28.0,
    arrivals: float | None = 32.0,
    ready: int = 12,
    running: float = 40.0,
    hpa_max: int = 12,
    metric: str = "vllm:num_requests_running",
    p95: float = 2.5,
) -> Snapshot:
    """12 settled pods, ``ready`` of them ready, serving ``served`` of the ``arrivals``
    req/s with ``waiting`` requests per pod and ``running`` in each batch, at a TTFT p95 of
    ``p95``; the HPA scales 4..``hpa_max`` on ``metric`` at a target of 24."""
    engine = signals(
        ttft_p95_seconds=p95,
        requests_per_second=served,
        arrivals_per_second=arrivals,
        waiting_requests_per_pod=waiting,
        running_requests_per_pod=running,
    )
    fleet = workload(replicas=12, ready=ready, hpa=(4, hpa_max, 24.0))
    return snapshot(engine, replace(fleet, hpa=replace(fleet.hpa, metric_name=metric)))


def collapse_run(hits: Sequence[float], **kwargs: float | None) -> list[Decision]:
    """The default policy through one evaluation per warm hit rate in ``hits``."""
    return run(spec(), [snapshot(signals(hit=hit, **kwargs)) for hit in hits])
