"""What ``decide`` reads besides the policy: the engine signals and the workload's state.

The gather layer fills these from Prometheus and the Kubernetes API; the simulator fills
them from its own scrape model and fleet. Either way they are plain frozen values, so the
decision code stays pure and a test can write any situation down by hand. Anything the
reader could not establish is ``None`` (or an unknown ``Measured`` inside the signals),
never a made-up 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cachescale.snapshot import EngineSignals


@dataclass(frozen=True, slots=True)
class HPAState:
    """The HorizontalPodAutoscaler as it is now (``spec`` and ``status``)."""

    min_replicas: int
    max_replicas: int
    target_average_value: float | None
    """Target of its per-pod queue metric; None when it has no such metric."""
    metric_name: str | None = None
    """That metric, e.g. ``vllm:num_requests_waiting``."""


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """The serving Deployment and its HPA, as read at the evaluation."""

    replicas: int
    """``spec.replicas`` (what the HPA last set)."""
    ready_replicas: int
    pod_ages_seconds: tuple[float, ...]
    """Seconds since each ready pod became ready."""
    gpus_per_pod: float
    """GPUs one pod requests (``nvidia.com/gpu`` in the engine container's requests)."""
    hpa: HPAState
    max_num_seqs: int | None = None
    """The engine's current batch ceiling from its args; None when the flag is absent."""
    generation: int = 0
    rollout_in_progress: bool = False
    """Pods of an older revision still exist (a rollout, or a restart we caused)."""

    def warm_replicas(self, warmup_seconds: float) -> int:
        """Ready pods at least ``warmup_seconds`` old (their caches had time to fill)."""
        return sum(1 for age in self.pod_ages_seconds if age >= warmup_seconds)


@dataclass(frozen=True, slots=True)
class HumanRequests:
    """What a human asked for through annotations on the policy (times they were set)."""

    acknowledge_at: datetime | None = None
    """Acknowledge the active collapse alert: stop holding, keep the alert visible."""
    rebaseline_at: datetime | None = None
    """Accept the current hit rate and costs as the new baseline."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one evaluation knows about the world."""

    signals: EngineSignals
    workload: WorkloadState
    human: HumanRequests = HumanRequests()
