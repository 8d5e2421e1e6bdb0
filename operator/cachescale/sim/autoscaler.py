"""What an autoscaler sees of the simulated fleet on a tick, what it answers, and the HPA.

The simulation loop (:mod:`cachescale.sim.run`) calls every autoscaler through the
``Autoscaler`` protocol, once per sync period, with a ``FleetObservation``: what a
metrics pipeline and the scale subresource would show at that instant. The answer is a
``ScaleDecision`` (a replica count, and optionally a new ``--max-num-seqs``). The plain
Kubernetes HPA on a per-pod vLLM gauge (``HPAAutoscaler``) is the reference; the policy
engine and KEDA implement the same protocol beside it and record their evaluations as
``PolicyRecord``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cachescale.sim.fleet import Fleet, Pod
from cachescale.sim.hpa import HPAModel, HPASpec
from cachescale.sim.scenario import HPAMetric


@dataclass(frozen=True)
class FleetObservation:
    """What an autoscaler may look at on one tick (what a metrics pipeline would show)."""

    now_s: float
    replicas: int
    """The Deployment's spec.replicas (what an HPA reads from the scale subresource)."""
    ready_replicas: int
    starting_replicas: int
    """Pods created but not ready yet: they export no engine metrics."""
    waiting_per_ready_pod: tuple[float, ...]
    running_per_ready_pod: tuple[float, ...]
    pods: tuple[Pod, ...] = ()
    """Pods that exist (starting, ready or draining): what a Prometheus could scrape. A
    policy engine must read them only through a scrape model, never their ground truth."""
    max_num_seqs: int = 0
    """The Deployment's current ``--max-num-seqs`` (what new pods start with)."""
    rollout_in_progress: bool = False
    """Pods of an older revision still exist."""


@dataclass(frozen=True)
class ScaleDecision:
    """An autoscaler's answer on one tick."""

    desired_replicas: int
    reason: str
    max_num_seqs: int | None = None
    """A new ``--max-num-seqs`` for the Deployment (rolls every pod), or None."""


@dataclass(frozen=True)
class PolicyRecord:
    """One policy evaluation, as a report shows it (HPA-only runs have none)."""

    t_s: float
    state: str
    reason: str
    message: str
    min_replicas: int
    max_replicas: int
    target: float | None
    max_num_seqs: int | None
    hit_rate_seen: float | None
    """The windowed token hit rate the engine read (what Prometheus showed)."""
    baseline_hit_rate: float | None
    """The learned baseline after this evaluation."""
    ceiling: int | None
    """The cache-friendly batch ceiling B_max, when the policy can compute it."""
    alerts: tuple[str, ...]
    raised: tuple[str, ...]
    cleared: tuple[str, ...]
    cleared_messages: tuple[str, ...] = ()
    """What each cleared alert's Event says, in the order of ``cleared``."""


class Autoscaler(Protocol):
    """Anything that turns an observation into a replica count (HPA, policy engine)."""

    name: str
    sync_period_s: float

    def step(self, observation: FleetObservation) -> ScaleDecision:
        """Decide the replica count for this tick."""
        ...

    @property
    def records(self) -> list[PolicyRecord]:
        """Policy evaluations so far (empty for autoscalers without a policy)."""
        ...


class HPAAutoscaler:
    """The Kubernetes HPA on a per-pod vLLM gauge (queue length or batch size)."""

    name = "hpa"

    def __init__(self, model: HPAModel, metric: HPAMetric) -> None:
        self._model = model
        self._metric = metric
        self.sync_period_s = model.spec.sync_period_s

    @property
    def records(self) -> list[PolicyRecord]:
        """The plain HPA evaluates no policy."""
        return []

    @property
    def spec(self) -> HPASpec:
        """The HPA object as the user wrote it."""
        return self._model.spec

    @property
    def metric_name(self) -> str:
        """The per-pod metric's name as Prometheus exposes it."""
        return f"vllm:{self._metric}"

    def step(self, observation: FleetObservation) -> ScaleDecision:
        """One HPA sync."""
        return self.step_within(observation, None)

    def step_within(
        self, observation: FleetObservation, envelope: tuple[int, int, float] | None
    ) -> ScaleDecision:
        """One HPA sync inside ``(min, max, target)`` set by a policy engine (None: spec)."""
        low, high, target = envelope if envelope is not None else (None, None, None)
        decision = self._model.step(
            observation.now_s,
            observation.replicas,
            (
                observation.waiting_per_ready_pod
                if self._metric == "num_requests_waiting"
                else observation.running_per_ready_pod
            ),
            missing_pods=observation.starting_replicas,
            min_replicas=low,
            max_replicas=high,
            target=target,
        )
        return ScaleDecision(decision.desired_replicas, decision.reason)


def fleet_observation(fleet: Fleet, now_s: float) -> FleetObservation:
    """What an autoscaler sees of ``fleet`` on a tick at ``now_s``."""
    ready = fleet.ready_pods(now_s)
    return FleetObservation(
        now_s=now_s,
        replicas=fleet.desired_replicas,
        ready_replicas=len(ready),
        starting_replicas=sum(1 for pod in fleet.live_pods if pod.ready_s > now_s),
        waiting_per_ready_pod=tuple(float(pod.engine.num_waiting) for pod in ready),
        running_per_ready_pod=tuple(float(pod.engine.num_running) for pod in ready),
        pods=tuple(pod for pod in fleet.pods if pod.gone_s is None),
        max_num_seqs=fleet.max_num_seqs,
        rollout_in_progress=fleet.rollout_in_progress,
    )
