"""Simulations driven to their end: ``run`` one scenario, ``run_together`` several that
share a request stream, the runs that split off a shared fleet finished on spare CPUs.

Runs that share a request stream are made together: each request is generated once (its
prompt assembled and hashed), and runs whose fleets start alike ride one simulated fleet
until their autoscalers decide differently, when the simulation splits into exact copies
(:class:`~cachescale.sim.run.Simulation`). The engines are most of a run's cost, and an
HPA and cachescale usually agree until the incident a scenario is about.

After a split the copies share nothing but the stream, which each can draw by itself. So
where a CPU is spare and forking is safe (:mod:`cachescale.sim.forked`), a copy goes on in
a forked child (``_Branch``) to the end of the scenario and sends its runs' results back;
the parent goes on with the rest. The child draws the same requests from its own copy of
the stream, steps at the same instants and runs the same code on the same state, so every
result equals the one made in-process, request for request. What the copy held at the split
(finished and aborted requests, arrivals) the parent still holds: the child sends only
what came after. Where a CPU is spare, the open-loop stream itself is drawn by a forked
feeder and read through pipes (:mod:`cachescale.sim.stream_feed`), a child that splits
off reading its own pipe from where its parent was.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from itertools import tee

from cachescale.sim.autoscaler import Autoscaler
from cachescale.sim.collector import paused_collection
from cachescale.sim.forked import Forked, spare_cpus
from cachescale.sim.request import SimRequest
from cachescale.sim.run import RunResult, Simulation, fleet_key
from cachescale.sim.scenario import Scenario
from cachescale.sim.stream_feed import StreamFeed
from cachescale.sim.streams import open_stream, traffic_key

PROGRESS_STEP_S = 60.0
"""Simulated seconds between progress reports: the simulations advance in step by it."""


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
    *,
    processes: int | None = None,
) -> list[RunResult]:
    """``run`` for each (scenario, autoscaler) pair, drawing the shared requests once.

    The scenarios must share a request stream (``traffic_key``): they may differ in their fleet,
    autoscaler, policy and fleet events. Runs whose fleets start alike ride one simulated
    fleet until their autoscalers decide differently (``Simulation``); each run gets its
    own copy of every request an engine of its own serves. The simulations advance in
    step, so only a minute of requests is ever held for the slowest of them. Every result
    equals what ``run`` gives alone. An autoscaler whose run leaves a shared fleet goes on
    as a copy (with the copied pods it reads): read what it did from the results.

    At most ``processes`` processes work at once (None: one per CPU this process may use);
    a simulation that splits off goes on in a forked child while one is spare.
    """
    if not runs:
        return []
    first = runs[0][0]
    for scenario, _ in runs[1:]:
        if traffic_key(scenario) != traffic_key(first):
            raise ValueError(
                f"{scenario.name} does not share {first.name}'s workload: run them apart"
            )
    spare = spare_cpus() if processes is None else min(spare_cpus(), processes - 1)
    if first.clients is not None or not spare:  # closed loop: each fleet makes its requests
        return _in_order(_run_all(_simulations(runs, None), 0.0, first.duration_s, progress, spare))
    feed = StreamFeed(open_stream(first), readers=spare + 1)
    try:
        simulations = _simulations(runs, feed)
        return _in_order(_run_all(simulations, 0.0, first.duration_s, progress, spare, feed))
    finally:
        feed.close()


def _in_order(results: dict[int, RunResult]) -> list[RunResult]:
    return [results[index] for index in range(len(results))]


def _simulations(
    runs: Sequence[tuple[Scenario, Autoscaler | None]], feed: StreamFeed | None
) -> list[Simulation]:
    """One simulation per fleet that starts alike, each riding its branch of the stream
    (read from ``feed``, or drawn in-process); closed loop: one per run, each making its
    own requests."""
    first = runs[0][0]
    if first.clients is not None:
        return [Simulation(*pair, index=index) for index, pair in enumerate(runs)]
    cohorts: dict[Hashable, list[int]] = {}
    for index, (scenario, autoscaler) in enumerate(runs):
        cohorts.setdefault(fleet_key(scenario, autoscaler), []).append(index)
    simulations: list[Simulation] = []
    stream = feed.reader if feed is not None else open_stream(first)
    for (head, *riders), branch in zip(cohorts.values(), tee(stream, len(cohorts)), strict=True):
        simulation = Simulation(*runs[head], branch, index=head)
        for index in riders:
            simulation.ride(index, *runs[index])
        simulations.append(simulation)
    return simulations


def _run_all(
    simulations: list[Simulation],
    from_s: float,
    duration_s: float,
    progress: Callable[[float], None] | None,
    spare: int,
    feed: StreamFeed | None = None,
) -> dict[int, RunResult]:
    """Advance ``simulations`` in step from ``from_s`` to ``duration_s``, up to ``spare``
    of the ones split off on the way in forked children (which read the rest of the
    stream from ``feed`` when the simulations do); every run's result by index.

    The cyclic garbage collector is paused meanwhile (:mod:`cachescale.sim.collector`).
    """
    branches: list[_Branch] = []
    now_s = from_s
    try:
        with paused_collection():
            while now_s < duration_s:
                now_s += PROGRESS_STEP_S
                behind = list(simulations)
                while behind:
                    split = behind.pop().advance_to(now_s)
                    while split and len(branches) < spare:
                        branches.append(_Branch(split, simulations, now_s, duration_s, feed))
                    simulations.extend(split)
                    behind.extend(split)
                if progress is not None:
                    progress(min(1.0, now_s / duration_s))
        results = dict(pair for simulation in simulations for pair in simulation.results())
        for branch in branches:
            results.update(branch.results())
    except BaseException:
        for branch in branches:
            branch.cancel()
        raise
    return results


@dataclass(frozen=True)
class _Held:
    """What a simulation's runs held when it split off: the parent keeps these lists, and
    the child sends only what it added to them."""

    finished: list[SimRequest]
    aborted: list[SimRequest]
    arrivals_s: list[float]

    @classmethod
    def of(cls, simulation: Simulation) -> _Held:
        fleet = simulation.fleet
        return cls(list(fleet.finished), list(fleet.aborted), list(simulation.arrivals_s))

    def after(self, result: RunResult) -> RunResult:
        """``result`` without what was held at the split (in the child)."""
        return replace(
            result,
            finished=result.finished[len(self.finished) :],
            aborted=result.aborted[len(self.aborted) :],
            arrivals_s=result.arrivals_s[len(self.arrivals_s) :],
        )

    def before(self, result: RunResult) -> RunResult:
        """``result`` with what was held at the split put back in front (in the parent)."""
        return replace(
            result,
            finished=self.finished + result.finished,
            aborted=self.aborted + result.aborted,
            arrivals_s=self.arrivals_s + result.arrivals_s,
        )


class _Branch:
    """A simulation split off at the step ending at ``now_s``, finished in a forked child."""

    def __init__(
        self,
        split: list[Simulation],
        simulations: list[Simulation],
        now_s: float,
        duration_s: float,
        feed: StreamFeed | None,
    ) -> None:
        """Take the last of ``split`` (the simulations just split off) away to a child:
        the parent then holds nothing of it (a stream branch it never draws would keep
        every request the others draw), and the child drops the streams of the others.
        With a ``feed``, the child reads the rest of the stream from a pipe of its own."""
        twin = split.pop()
        self._held = held = _Held.of(twin)
        handed = feed.hand_over() if feed is not None else None

        def finish() -> list[tuple[int, RunResult]]:
            if feed is not None and handed is not None:
                feed.adopt(handed)
            for other in (*simulations, *split):  # the parent's: never advanced here
                other.drop_stream()
            results = _run_all([twin], now_s - PROGRESS_STEP_S, duration_s, None, 0)
            return [(index, held.after(result)) for index, result in results.items()]

        self._forked = Forked(finish)
        if feed is not None and handed is not None:
            feed.handed_over(handed)

    def results(self) -> list[tuple[int, RunResult]]:
        """The branch's runs' results, whole (waits for the child)."""
        return [(index, self._held.before(result)) for index, result in self._forked.result()]

    def cancel(self) -> None:
        """Kill the child (the parent failed: nobody will read its results)."""
        self._forked.cancel()
