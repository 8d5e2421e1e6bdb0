"""The emulator's core: a simulation advanced by the wall clock, its pods behind endpoints.

:class:`Emulator` owns one :class:`~cachescale.sim.run.Simulation` and one lock. Advancing
the simulation, registering new pods, feeding finished requests to the per-pod ledgers and
taking a ground-truth snapshot all happen under the lock; every scrape collects under the
same lock (see ``endpoints``), so Prometheus only ever sees states between two steps.
Starting and stopping servers happens outside it; each scrape, under the lock, is noted in
the pod's ground truth with what it exported. A pod is served from the moment it is
ready (a real engine opens its port only once the weights are loaded) until it is gone
(drained and deleted); that set is what the file_sd file lists. Each is scraped as
``<deployment>-engine-N``, or, standing in for a real Deployment (``pod_names``, see
``pods_of``), as the real pod :func:`~cachescale.emulator.pods_of.assign` gives it at each
step: a replica without one is not served, and a replica whose pod changes keeps its
endpoint under the new name.

A client's completion (:meth:`Emulator.complete`, behind ``completions``) is submitted to
its pod's engine under the lock at the simulation's current time, exactly as the router
submits a simulated request; the serving thread then waits, on a condition tied to the
lock, for the pacing loop to simulate it to its end. It wakes the loop rather than
advancing the simulation itself, so only the loop ever moves simulated time.

:func:`run_in_real_time` is the pacing loop: it advances the simulation to
``elapsed wall time × speed`` in short steps, so the lock is never held long, and sleeps
between them. Tests can instead call :meth:`Emulator.advance_to` directly, with no clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from prometheus_client.registry import Collector

from cachescale.emulator.completions import CompletionError, completions_app
from cachescale.emulator.endpoints import PodEndpoint, serve
from cachescale.emulator.pods_of import assign
from cachescale.emulator.targets import Target
from cachescale.emulator.truth import FleetState, GroundTruth, PodTruth
from cachescale.sim.fleet import Pod
from cachescale.sim.hashing import hash_blocks
from cachescale.sim.request import SimRequest
from cachescale.sim.run import Simulation
from cachescale.sim.sglang_metrics import SglangReplicaCollector, SglangSeries
from cachescale.sim.vllm_metrics import VllmReplicaCollector

EngineKind = Literal["vllm", "sglang"]
ENGINES: tuple[EngineKind, ...] = ("vllm", "sglang")

TICK_S = 0.05
"""Wall seconds the pacing loop sleeps once the simulation has caught up with the clock."""
MAX_STEP_SIM_S = 5.0
"""Longest simulated stretch advanced under one lock hold (keeps scrapes responsive)."""
COMPLETION_TIMEOUT_S = 120.0
"""Wall seconds a client's completion may wait for the simulation to finish it."""


@dataclass(frozen=True)
class EmulatorSettings:
    """How the emulated pods present themselves."""

    model_name: str
    """The ``model_name`` label (the served model name)."""
    engine: EngineKind = "vllm"
    namespace: str = "llm"
    deployment: str = "vllm"
    """Prefix of the ``pod`` label: pod ``engine-3`` is served as ``<deployment>-engine-3``."""
    base_port: int | None = None
    """Pod ``engine-N`` listens on ``base_port + N``; None: any free port."""
    speed: float = 1.0
    """Simulated seconds per wall second."""
    truth_window_s: float = 60.0
    """Trailing window of the ground truth's recent requests and scrapes, in wall seconds."""
    prefix_caching_hash_algo: str = "sha256"
    """What vLLM's ``vllm:cache_config_info`` reports as the block hash (vLLM's default)."""


@dataclass(frozen=True)
class TargetChanges:
    """Pods that started or stopped being served in one step."""

    added: tuple[Target, ...] = ()
    removed: tuple[Target, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass(eq=False)
class _PodState:
    pod: Pod
    label: str
    truth: PodTruth
    sglang: SglangSeries | None


class Emulator:
    """A simulation whose ready pods each serve ``/metrics`` on their own port."""

    def __init__(
        self,
        simulation: Simulation,
        settings: EmulatorSettings,
        pod_names: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        """``pod_names``: the real pods' names now, oldest first, to scrape the served
        replicas as (None: ``<deployment>-engine-N``)."""
        self.simulation = simulation
        self.settings = settings
        self._pod_names = pod_names
        self._assigned: dict[int, str] = {}
        """Replica id → the real pod it is scraped as (with ``pod_names``)."""
        self.lock = threading.Lock()
        self.stepped = threading.Condition(self.lock)
        """Notified (under the lock) after every simulation step."""
        self.wake = threading.Event()
        """Set by a client's completion: the pacing loop steps without finishing its nap."""
        self._completion_ids = 0
        scenario = simulation.scenario
        self.truth = GroundTruth(
            header={
                "scenario": scenario.name,
                "seed": scenario.seed,
                "engine": settings.engine,
                "namespace": settings.namespace,
                "speed": settings.speed,
            },
            window_sim_s=settings.truth_window_s * settings.speed,
        )
        self._pods: dict[int, _PodState] = {}
        """By engine replica id (what a finished request names)."""
        self._endpoints: dict[str, tuple[Target, PodEndpoint]] = {}
        """By the replica's own label (``<deployment>-engine-N``)."""
        self._finished_seen = 0

    # -- simulation (under the lock) -------------------------------------------------------

    def advance_to(self, t_s: float) -> TargetChanges:
        """Simulate up to ``t_s`` and start or stop servers to match the served pods."""
        with self.lock:
            self.simulation.advance_to(t_s)
            self._observe()
            served = [state for state in self._pods.values() if self._is_served(state.pod)]
            self.stepped.notify_all()
        return self._sync_endpoints(self._served_as(served))

    def _observe(self) -> None:
        for pod in self.simulation.fleet.pods:
            if pod.engine.replica_id not in self._pods:
                self._add_pod(pod)
        finished = self.simulation.fleet.finished
        for request in finished[self._finished_seen :]:
            assert request.replica is not None
            state = self._pods[request.replica]
            state.truth.record(request)
            if state.sglang is not None:
                state.sglang.record_finished(request)
        self._finished_seen = len(finished)
        for state in self._pods.values():
            if state.sglang is not None and state.pod.gone_s is None:
                state.sglang.sample_engine(state.pod.engine)

    def _add_pod(self, pod: Pod) -> None:
        label = f"{self.settings.deployment}-{pod.name}"
        sglang = SglangSeries() if self.settings.engine == "sglang" else None
        truth = self.truth.add_pod(label, pod)
        self._pods[pod.engine.replica_id] = _PodState(pod, label, truth, sglang)

    def _is_served(self, pod: Pod) -> bool:
        return pod.ready_s <= self.simulation.now_s and pod.gone_s is None

    def complete(
        self, replica: int, tokens: bytes, salt: str, timeout_s: float = COMPLETION_TIMEOUT_S
    ) -> SimRequest:
        """Serve one client completion on pod ``replica``'s engine: the prompt ``tokens``
        (int32 ids) with one output token, through the engine's prefix cache as any
        simulated request; returns it finished (its ``cached_tokens`` filled in)."""
        with self.lock:
            state = self._pods[replica]
            simulation, engine = self.simulation, state.pod.engine
            if simulation.done or not self._is_served(state.pod):
                raise CompletionError(503, "the pod no longer serves: the scenario has ended")
            block_size = simulation.fleet.profile.block_size
            self._completion_ids += 1
            request = SimRequest(
                request_id=-self._completion_ids,  # apart from the workload's ids (>= 0)
                arrival_s=simulation.now_s,
                tenant=salt,
                prefix_group=-1,
                prompt_tokens=len(tokens) // 4,
                output_tokens=1,
                block_hashes=hash_blocks(tokens, block_size, salt.encode()),
                max_tokens=1,  # it stops by length, as its reply says
            )
            try:
                engine.submit(request, simulation.now_s)
            except ValueError as error:  # a prompt larger than the KV pool
                raise CompletionError(400, str(error)) from None
            self.wake.set()
            deadline = time.monotonic() + timeout_s
            while request.finished_s is None:
                left = deadline - time.monotonic()
                if left <= 0 or simulation.done:
                    raise CompletionError(504, "the simulation did not finish the request")
                self.stepped.wait(left)
            return request

    def truth_snapshot(self) -> dict[str, Any]:
        """The ground truth now, consistent with what a scrape would return now."""
        with self.lock:
            simulation, fleet = self.simulation, self.simulation.fleet
            state = FleetState(
                live_replicas=len(fleet.live_pods),
                ready_replicas=len(fleet.ready_pods(simulation.now_s)),
                desired_replicas=fleet.desired_replicas,
                dropped_requests=simulation.dropped,
            )
            served = {label: target.pod for label, (target, _) in self._endpoints.items()}
            return self.truth.snapshot(
                simulation.now_s, time.time(), simulation.done, state, served
            )

    # -- endpoints (outside the lock) ------------------------------------------------------

    def _collector(self, state: _PodState) -> Collector:
        engine, series = state.pod.engine, state.pod.series
        if state.sglang is not None:
            return SglangReplicaCollector(engine, series, state.sglang, self.settings.model_name)
        return VllmReplicaCollector(
            engine, series, self.settings.model_name, self.settings.prefix_caching_hash_algo
        )

    def _served_as(self, served: list[_PodState]) -> dict[str, tuple[_PodState, str]]:
        """The replicas to serve now, by their own label, with the pod name each is
        scraped as."""
        if self._pod_names is None:
            return {state.label: (state, state.label) for state in served}
        by_id = {state.pod.engine.replica_id: state for state in served}
        self._assigned = assign(self._assigned, list(by_id), self._pod_names())
        return {
            by_id[replica].label: (by_id[replica], pod) for replica, pod in self._assigned.items()
        }

    def _start(self, state: _PodState, pod: str) -> Target:
        base = self.settings.base_port
        port = 0 if base is None else base + state.pod.engine.replica_id
        completions = completions_app(
            partial(self.complete, state.pod.engine.replica_id), self.settings.model_name
        )
        endpoint = serve(
            self._collector(state), self.lock, port, partial(self._scraped, state), completions
        )
        target = Target(self.settings.namespace, pod, endpoint.address)
        self._endpoints[state.label] = (target, endpoint)
        return target

    def _scraped(self, state: _PodState) -> None:
        """Note a scrape of ``state``'s pod in its ground truth (called under the lock)."""
        state.truth.record_scrape(self.simulation.now_s, time.time())

    def _stop(self, label: str) -> Target:
        target, endpoint = self._endpoints.pop(label)
        endpoint.stop()
        return target

    def _sync_endpoints(self, wanted: dict[str, tuple[_PodState, str]]) -> TargetChanges:
        """Stop, rename and start endpoints to serve ``wanted`` (a rename is reported as
        the old target removed and the new one added, at the same address)."""
        removed = [self._stop(label) for label in sorted(set(self._endpoints) - set(wanted))]
        added = []
        for label, (state, pod) in wanted.items():
            if label not in self._endpoints:
                added.append(self._start(state, pod))
                continue
            target, endpoint = self._endpoints[label]
            if target.pod != pod:
                self._endpoints[label] = (replace(target, pod=pod), endpoint)
                removed.append(target)
                added.append(self._endpoints[label][0])
        return TargetChanges(tuple(added), tuple(removed))

    def targets(self) -> list[Target]:
        """The pods being served now, sorted."""
        return sorted(target for target, _ in self._endpoints.values())

    def close(self) -> TargetChanges:
        """Stop every server; returns them as removed."""
        return TargetChanges(removed=tuple(self._stop(label) for label in sorted(self._endpoints)))


def run_in_real_time(
    emulator: Emulator,
    stop: threading.Event,
    on_step: Callable[[TargetChanges], None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Keep the simulation at ``elapsed wall time × speed`` until it ends or ``stop`` is set.

    ``on_step`` sees every step's target changes (the caller rewrites files, prints).
    """
    simulation = emulator.simulation
    started = clock()
    while not (stop.is_set() or simulation.done):
        due_s = (clock() - started) * emulator.settings.speed
        on_step(emulator.advance_to(min(due_s, simulation.now_s + MAX_STEP_SIM_S)))
        if simulation.now_s >= due_s:
            emulator.wake.wait(TICK_S)  # a client's completion cuts the nap short
        emulator.wake.clear()
