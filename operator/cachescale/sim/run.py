"""The simulation loop: requests arrive, the router places them, the autoscaler ticks.

Time is simulated, never read from a clock. Requests come from the scenario's request stream
(:mod:`cachescale.sim.traffic`) in arrival order; before each one, every autoscaler sync
period that has elapsed is processed (pods advanced to that instant, the fleet reconciled,
the HPA fed the per-pod ``vllm:num_requests_waiting`` of ready pods, its recommendation
applied). The autoscaler sits behind a small protocol so the policy engine can be plugged in
beside the HPA and both runs can share one seed — same requests, same arrivals, different
decisions. Runs that share a request stream can ride one simulated fleet until their
autoscalers decide differently, when the simulation splits into exact copies
(``Simulation``); :mod:`cachescale.sim.drive` drives simulations to their end.

A scenario with closed-loop ``clients`` (:mod:`cachescale.sim.clients`) has no stream
drawn ahead: a client sends its next turn when its answer arrives, so the loop steps the
fleet from engine event to engine event, and each run has its own fleet and clients.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

from cachescale.sim.autoscaler import Autoscaler, PolicyRecord, ScaleDecision, fleet_observation
from cachescale.sim.clients import ClosedLoopClients
from cachescale.sim.fleet import Fleet, PodSpan
from cachescale.sim.request import SimRequest
from cachescale.sim.scenario import RollingRestart, Scenario, replica_profile
from cachescale.sim.streams import closed_loop_clients, open_stream

HPA_SYNC_PERIOD_S = 15.0
"""Default when the scenario has no autoscaler (the timeline is still sampled)."""


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
    pods: list[PodSpan]
    """Every pod the run made: when each held its GPUs."""
    samples: list[TimelineSample]
    dropped: int
    policy: list[PolicyRecord] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    """Every request's arrival time, routed or dropped: the offered load."""
    aborted: list[SimRequest] = field(default_factory=list)
    """Requests whose clients gave up waiting (``workload.client_timeout_s``)."""


@dataclass(eq=False)
class _Run:
    """One run riding a simulation's fleet: its own scenario, autoscaler and timeline."""

    index: int
    """Its place in ``run_together``'s arguments (0 for a simulation made alone)."""
    scenario: Scenario
    autoscaler: Autoscaler | None
    samples: list[TimelineSample] = field(default_factory=list)


class Simulation:
    """A scenario in progress, advanced in simulated time by whoever drives it.

    ``run`` drives it to the end as fast as possible; the emulator drives it in step with
    the wall clock and serves the pods' metrics while it goes. Either way the same
    requests, ticks and decisions happen in the same order.

    Runs whose fleets are bound to stay the same may ride one simulation
    (``run_together``): its fleet serves the shared request stream once, each autoscaler
    reads it and decides on every tick, and when their decisions would change the fleet
    differently the simulation splits, the runs that decided otherwise going on with an
    exact copy of it. Until then the fleet is the one each of them would have alone.
    """

    def __init__(
        self,
        scenario: Scenario,
        autoscaler: Autoscaler | None,
        shared_requests: Iterator[SimRequest] | None = None,
        *,
        index: int = 0,
    ) -> None:
        """``shared_requests`` replaces the scenario's own request stream with a branch
        of a stream other simulations draw from too (an ``itertools.tee`` branch of this
        scenario's stream): every request is copied before an engine writes into it.
        ``index`` is the run's place among ``run_together``'s."""
        self.scenario = scenario
        engine = scenario.fleet.engine
        self.fleet = Fleet(
            replica_profile(scenario),
            scenario.fleet.max_num_seqs,
            scenario.fleet.router,
            scenario.fleet.pod_start_delay_s,
            scenario.fleet.replicas,
            client_timeout_s=scenario.workload.client_timeout_s,
            max_model_len=None if engine is None else engine.max_model_len,
        )
        self._runs = [_Run(index, scenario, autoscaler)]
        self._shared = shared_requests
        self._clients = closed_loop_clients(scenario)
        self._answered = (0, 0)
        """Finished and aborted requests already told to the clients."""
        self._requests: Iterator[SimRequest] = iter(())  # closed loop: the clients send
        if shared_requests is not None:
            self._requests = map(_own_copy, shared_requests)
        elif self._clients is None:
            self._requests = iter(open_stream(scenario))
        self._pending = next(self._requests, None)
        self._rollouts = _rollouts(scenario)
        self._sync_s = autoscaler.sync_period_s if autoscaler else HPA_SYNC_PERIOD_S
        self._next_tick = self._sync_s
        self.now_s = 0.0
        self.dropped = 0
        self.arrivals_s: list[float] = []

    def ride(self, index: int, scenario: Scenario, autoscaler: Autoscaler | None) -> None:
        """Take another run on this fleet from the start (its fleet must start alike)."""
        first = self._runs[0]
        if self._shared is None or self.now_s > 0.0:
            raise ValueError("a run rides a simulation on a shared stream, from the start")
        if fleet_key(scenario, autoscaler) != fleet_key(first.scenario, first.autoscaler):
            raise ValueError(f"{scenario.name}'s fleet does not start as {first.scenario.name}'s")
        self._runs.append(_Run(index, scenario, autoscaler))

    def advance_to(self, until_s: float) -> list[Simulation]:
        """Route every request arriving before ``until_s`` and run every tick up to it.

        Returns the simulations split off on the way (runs whose autoscalers decided
        otherwise), each at the tick it split at: advance them as well.
        """
        until_s = min(until_s, self.scenario.duration_s)
        if self._clients is not None:
            return self._advance_closed(until_s, self._clients)
        split: list[Simulation] = []
        while True:
            request = self._pending
            arrival = request.arrival_s if request is not None else float("inf")
            if self._next_tick <= min(arrival, until_s):
                tick = self._next_tick
                self._next_tick += self._sync_s
                split.extend(self._tick(tick))
            elif request is not None and arrival < until_s:
                self.arrivals_s.append(arrival)
                if not self.fleet.route(request):
                    self.dropped += 1
                self._pending = next(self._requests, None)
            else:
                break
        self.fleet.advance_to(until_s)
        self.now_s = until_s
        return split

    def _advance_closed(self, until_s: float, clients: ClosedLoopClients) -> list[Simulation]:
        """``advance_to`` for closed-loop clients: the fleet is stepped from engine event
        to engine event, so each answer reaches its client when it is given and the next
        turn is sent then (after the think time)."""
        fleet = self.fleet
        split: list[Simulation] = []
        while True:
            arrival = clients.next_arrival_s()
            event = fleet.next_event_s()
            if self._next_tick <= min(arrival, event, until_s):
                tick = self._next_tick
                self._next_tick += self._sync_s
                split.extend(self._tick(tick))
                self._answer(clients, tick)
            elif event < until_s and event <= arrival:
                fleet.advance_to(event)
                self._answer(clients, event)
            elif arrival < until_s:
                request = clients.take()
                self.arrivals_s.append(arrival)
                if not fleet.route(request):
                    self.dropped += 1
                    clients.dropped(request, arrival)
                self._answer(clients, arrival)
            else:
                break
        fleet.advance_to(until_s)
        self._answer(clients, until_s)
        self.now_s = until_s
        return split

    def _answer(self, clients: ClosedLoopClients, now_s: float) -> None:
        """Tell the clients of every request finished or aborted since the last call."""
        finished, aborted = self.fleet.finished, self.fleet.aborted
        for done in (finished[self._answered[0] :], aborted[self._answered[1] :]):
            for request in done:
                clients.answered(request, now_s)
        self._answered = (len(finished), len(aborted))

    def _tick(self, now_s: float) -> list[Simulation]:
        fleet = self.fleet
        fleet.advance_to(now_s)
        while self._rollouts and self._rollouts[0] <= now_s:
            self._rollouts.pop(0)
            fleet.start_rolling_restart(now_s)
        fleet.reconcile(now_s)
        found = _sample(fleet, now_s)  # the tick's sample, as found before any decision
        if self._runs[0].autoscaler is None:  # a fixed fleet: every run here has none
            for run in self._runs:
                run.samples.append(found)
            return []
        observation = fleet_observation(fleet, now_s)
        decisions: dict[Hashable, list[tuple[_Run, ScaleDecision]]] = {}
        for run in self._runs:
            decision = cast("Autoscaler", run.autoscaler).step(observation)
            decisions.setdefault(_effect(decision, fleet), []).append((run, decision))
        alike = list(decisions.values())
        # Split before carrying anything out: a twin copies the fleet as the tick found it.
        split = [self._split([run for run, _ in group]) for group in alike[1:]]
        for simulation, group in zip([self, *split], alike, strict=True):
            simulation._apply([decision for _, decision in group], found)
        return split

    def _apply(self, decisions: list[ScaleDecision], found: TimelineSample) -> None:
        """Carry out the decisions of this simulation's runs (one each, in order), which
        change the fleet alike; record each run's sample of the tick."""
        fleet = self.fleet
        decision = decisions[0]
        if decision.max_num_seqs is not None and decision.max_num_seqs != fleet.max_num_seqs:
            fleet.change_max_num_seqs(decision.max_num_seqs, found.t_s)
        fleet.scale_to(decision.desired_replicas, found.t_s)
        for run, own in zip(self._runs, decisions, strict=True):
            run.samples.append(
                replace(found, desired_replicas=fleet.desired_replicas, reason=own.reason)
            )

    def _split(self, leaving: list[_Run]) -> Simulation:
        """A copy of this simulation carrying ``leaving`` away: the fleet (every engine,
        cache and queued request), the autoscalers of ``leaving`` with the pods they
        refer to, and a branch of the request stream at the same point. Finished and
        aborted requests are shared (nothing writes them again)."""
        assert self._shared is not None, "only a simulation on a shared stream carries runs"
        branch = copy.copy(self._shared)  # a tee branch: the same stream from here
        memo: dict[int, Any] = {
            id(self._shared): branch,
            id(self._requests): map(_own_copy, branch),
            id(self.scenario): self.scenario,
        }
        for done in (self.fleet.finished, self.fleet.aborted):
            memo.update((id(request), request) for request in done)
        for run in leaving:
            memo[id(run.scenario)] = run.scenario
        staying = [run for run in self._runs if run not in leaving]
        self._runs = leaving
        try:
            twin: Simulation = copy.deepcopy(self, memo)
        finally:
            self._runs = staying
        return twin

    def drop_stream(self) -> None:
        """Stop drawing the shared request stream, for good: a forked child finishing
        another simulation holds a copy of this one it never advances, and a stream branch
        never drawn would keep every request the others draw."""
        self._shared = None
        self._requests = iter(())
        self._pending = None

    @property
    def done(self) -> bool:
        """Whether the scenario's duration has been simulated."""
        return self.now_s >= self.scenario.duration_s

    def results(self) -> list[tuple[int, RunResult]]:
        """Each run's index and result (meaningful once ``done``, usable at any time)."""
        return [
            (
                run.index,
                RunResult(
                    scenario=run.scenario,
                    autoscaler=run.autoscaler.name if run.autoscaler else "none",
                    finished=list(self.fleet.finished),
                    pods=[pod.span() for pod in self.fleet.pods],
                    samples=run.samples,
                    dropped=self.dropped,
                    policy=run.autoscaler.records if run.autoscaler else [],
                    arrivals_s=list(self.arrivals_s),
                    aborted=list(self.fleet.aborted),
                ),
            )
            for run in self._runs
        ]


def _own_copy(request: SimRequest) -> SimRequest:
    """A request as the stream made it: the stream's own object never reaches an engine,
    so its outcome fields are still unset (the block hashes are shared: engines only read
    them)."""
    return replace(request)


def fleet_key(scenario: Scenario, autoscaler: Autoscaler | None) -> Hashable:
    """Everything a fleet's course depends on besides the requests and the decisions:
    runs with equal keys start with the same fleet, ticked at the same instants."""
    return (
        scenario.fleet.model_dump_json(),
        tuple(_rollouts(scenario)),
        autoscaler.sync_period_s if autoscaler else None,
    )


def _rollouts(scenario: Scenario) -> list[float]:
    return sorted(p.at_s for p in scenario.perturbations if isinstance(p, RollingRestart))


def _effect(decision: ScaleDecision, fleet: Fleet) -> Hashable:
    """What carrying out ``decision`` does to ``fleet``: equal effects, equal fleets."""
    rolls = decision.max_num_seqs is not None and decision.max_num_seqs != fleet.max_num_seqs
    return (decision.desired_replicas, decision.max_num_seqs if rolls else None)


def _sample(fleet: Fleet, now_s: float) -> TimelineSample:
    """The fleet as a tick finds it (an autoscaler's run overwrites the desired replicas,
    after its decision, and the reason)."""
    ready = fleet.ready_pods(now_s)
    live = fleet.live_pods
    return TimelineSample(
        t_s=now_s,
        replicas=len(live),
        ready_replicas=len(ready),
        desired_replicas=fleet.desired_replicas,
        waiting=sum(pod.engine.num_waiting for pod in live),
        running=sum(pod.engine.num_running for pod in live),
        kv_usage=sum(pod.engine.kv_usage for pod in ready) / len(ready) if ready else None,
        preemptions_total=sum(pod.engine.num_preemptions_total for pod in fleet.pods),
        reason="FixedFleet",
    )
