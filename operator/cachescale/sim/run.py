"""The simulation loop: requests arrive, the router places them, the autoscaler ticks.

Time is simulated, never read from a clock. Requests come from the workload in arrival
order; before each one, every autoscaler sync period that has elapsed is processed (pods
advanced to that instant, the fleet reconciled, the HPA fed the per-pod
``vllm:num_requests_waiting`` of ready pods, its recommendation applied). The autoscaler
sits behind a small protocol so the policy engine can be plugged in beside the HPA and both
runs can share one seed — same requests, same arrivals, different decisions. Runs that
share a workload are made together (``run_together``): each request is generated once
(its prompt assembled and hashed) and every run gets its own copy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import tee
from typing import Protocol

from cachescale.sim.fleet import Fleet, Pod
from cachescale.sim.hpa import HPAModel, HPASpec
from cachescale.sim.profiles import get_profile
from cachescale.sim.request import SimRequest
from cachescale.sim.scenario import FLEET_EVENTS, HPAMetric, RollingRestart, Scenario
from cachescale.sim.workload import Perturbation, Workload

HPA_SYNC_PERIOD_S = 15.0
"""Default when the scenario has no autoscaler (the timeline is still sampled)."""


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


@dataclass(frozen=True)
class TimelineSample:
    """Fleet state at one autoscaler tick."""

    t_s: float
    replicas: int
    ready_replicas: int
    desired_replicas: int
    waiting: int
    running: int
    kv_usage: float | None
    preemptions_total: int
    reason: str


@dataclass
class RunResult:
    """Everything a report needs from one run."""

    scenario: Scenario
    autoscaler: str
    finished: list[SimRequest]
    pods: list[Pod]
    samples: list[TimelineSample]
    dropped: int
    policy: list[PolicyRecord] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    """Every request's arrival time, routed or dropped: the offered load."""
    aborted: list[SimRequest] = field(default_factory=list)
    """Requests whose clients gave up waiting (``workload.client_timeout_s``)."""


class Simulation:
    """A scenario in progress, advanced in simulated time by whoever drives it.

    ``run`` drives it to the end as fast as possible; the emulator drives it in step with
    the wall clock and serves the pods' metrics while it goes. Either way the same
    requests, ticks and decisions happen in the same order.
    """

    def __init__(
        self,
        scenario: Scenario,
        autoscaler: Autoscaler | None,
        requests: Iterator[SimRequest] | None = None,
    ) -> None:
        """``requests`` replaces the scenario's own workload: ``run_together`` passes each
        run a copy of one shared stream (which must be this scenario's workload)."""
        self.scenario = scenario
        self.autoscaler = autoscaler
        self.fleet = Fleet(
            get_profile(scenario.fleet.profile),
            scenario.fleet.max_num_seqs,
            scenario.fleet.router,
            scenario.fleet.pod_start_delay_s,
            scenario.fleet.replicas,
            client_timeout_s=scenario.workload.client_timeout_s,
        )
        self._requests = requests if requests is not None else iter(_workload(scenario))
        self._pending = next(self._requests, None)
        self._rollouts = sorted(
            p.at_s for p in scenario.perturbations if isinstance(p, RollingRestart)
        )
        self._sync_s = autoscaler.sync_period_s if autoscaler else HPA_SYNC_PERIOD_S
        self._next_tick = self._sync_s
        self.now_s = 0.0
        self.samples: list[TimelineSample] = []
        self.dropped = 0
        self.arrivals_s: list[float] = []

    def advance_to(self, until_s: float) -> None:
        """Route every request arriving before ``until_s`` and run every tick up to it."""
        until_s = min(until_s, self.scenario.duration_s)
        while True:
            request = self._pending
            arrival = request.arrival_s if request is not None else float("inf")
            if self._next_tick <= min(arrival, until_s):
                self._tick(self._next_tick)
                self._next_tick += self._sync_s
            elif request is not None and arrival < until_s:
                self.arrivals_s.append(arrival)
                if not self.fleet.route(request):
                    self.dropped += 1
                self._pending = next(self._requests, None)
            else:
                break
        self.fleet.advance_to(until_s)
        self.now_s = until_s

    def _tick(self, now_s: float) -> None:
        fleet = self.fleet
        fleet.advance_to(now_s)
        while self._rollouts and self._rollouts[0] <= now_s:
            self._rollouts.pop(0)
            fleet.start_rolling_restart(now_s)
        fleet.reconcile(now_s)
        self.samples.append(_sample(fleet, now_s, self.autoscaler))

    @property
    def done(self) -> bool:
        """Whether the scenario's duration has been simulated."""
        return self.now_s >= self.scenario.duration_s

    def result(self) -> RunResult:
        """What the reports need (meaningful once ``done``, usable at any time)."""
        return RunResult(
            scenario=self.scenario,
            autoscaler=self.autoscaler.name if self.autoscaler else "none",
            finished=self.fleet.finished,
            pods=self.fleet.pods,
            samples=self.samples,
            dropped=self.dropped,
            policy=self.autoscaler.records if self.autoscaler else [],
            arrivals_s=self.arrivals_s,
            aborted=self.fleet.aborted,
        )


PROGRESS_STEP_S = 60.0
"""Simulated seconds between progress reports."""


def run(
    scenario: Scenario,
    autoscaler: Autoscaler | None,
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    """Simulate ``scenario`` for its duration under ``autoscaler`` (None: fixed fleet)."""
    return run_together([(scenario, autoscaler)], progress)[0]


def run_together(
    runs: Sequence[tuple[Scenario, Autoscaler | None]],
    progress: Callable[[float], None] | None = None,
) -> list[RunResult]:
    """``run`` for each (scenario, autoscaler) pair, drawing the shared requests once.

    The scenarios must share a workload (``workload_key``): they may differ in their fleet,
    autoscaler, policy and fleet events. Each run gets its own copy of every request (the
    engine writes outcomes into it); the runs advance in step, so only a minute of requests
    is ever held for the slowest of them. Every result equals what ``run`` gives alone.
    """
    if not runs:
        return []
    first = runs[0][0]
    for scenario, _ in runs[1:]:
        if workload_key(scenario) != workload_key(first):
            raise ValueError(
                f"{scenario.name} does not share {first.name}'s workload: run them apart"
            )
    streams = tee(_workload(first), len(runs))
    simulations = [
        Simulation(scenario, autoscaler, map(_own_copy, stream))
        for (scenario, autoscaler), stream in zip(runs, streams, strict=True)
    ]
    now_s = 0.0
    while now_s < first.duration_s:
        now_s += PROGRESS_STEP_S
        for simulation in simulations:
            simulation.advance_to(now_s)
        if progress is not None:
            progress(min(1.0, now_s / first.duration_s))
    return [simulation.result() for simulation in simulations]


def workload_key(scenario: Scenario) -> Hashable:
    """Everything the request stream depends on: scenarios with equal keys draw the same
    requests at the same instants, whatever their fleets and autoscalers do."""
    return (
        scenario.workload.model_dump_json(),
        scenario.seed,
        scenario.duration_s,
        tuple(p.model_dump_json() for p in _workload_perturbations(scenario)),
    )


def _workload_perturbations(scenario: Scenario) -> list[Perturbation]:
    return [p for p in scenario.perturbations if not isinstance(p, FLEET_EVENTS)]


def _workload(scenario: Scenario) -> Workload:
    return Workload(
        scenario.workload,
        seed=scenario.seed,
        perturbations=_workload_perturbations(scenario),
        until_s=scenario.duration_s,
    )


def _own_copy(request: SimRequest) -> SimRequest:
    """A request as the workload made it: the stream's own object never reaches an engine,
    so its outcome fields are still unset (the block hashes are shared: engines only read
    them)."""
    return replace(request)


def _sample(fleet: Fleet, now_s: float, autoscaler: Autoscaler | None) -> TimelineSample:
    ready = fleet.ready_pods(now_s)
    live = fleet.live_pods
    reason = "FixedFleet"
    if autoscaler is not None:
        observation = FleetObservation(
            now_s=now_s,
            replicas=fleet.desired_replicas,
            ready_replicas=len(ready),
            starting_replicas=sum(1 for pod in live if pod.ready_s > now_s),
            waiting_per_ready_pod=tuple(float(pod.engine.num_waiting) for pod in ready),
            running_per_ready_pod=tuple(float(pod.engine.num_running) for pod in ready),
            pods=tuple(pod for pod in fleet.pods if pod.gone_s is None),
            max_num_seqs=fleet.max_num_seqs,
            rollout_in_progress=fleet.rollout_in_progress,
        )
        decision = autoscaler.step(observation)
        if decision.max_num_seqs is not None and decision.max_num_seqs != fleet.max_num_seqs:
            fleet.change_max_num_seqs(decision.max_num_seqs, now_s)
        fleet.scale_to(decision.desired_replicas, now_s)
        reason = decision.reason
    return TimelineSample(
        t_s=now_s,
        replicas=len(live),
        ready_replicas=len(ready),
        desired_replicas=fleet.desired_replicas,
        waiting=sum(pod.engine.num_waiting for pod in live),
        running=sum(pod.engine.num_running for pod in live),
        kv_usage=sum(pod.engine.kv_usage for pod in ready) / len(ready) if ready else None,
        preemptions_total=sum(pod.engine.num_preemptions_total for pod in fleet.pods),
        reason=reason,
    )
