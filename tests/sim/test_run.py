"""Runs made together from one request stream equal the same runs made apart.

``run_together`` draws each request once; runs whose fleets start alike ride one fleet
until their autoscalers decide differently, and then each goes on with an exact copy of
it. Nothing a run does after that may leak into another (an engine writes outcomes into
its requests), and neither the shared stretch nor the chunked stepping may change a
single decision.
"""

from __future__ import annotations

import json

import pytest

from cachescale.commands.simulate import build_autoscaler
from cachescale.sim.drive import run, run_together
from cachescale.sim.fleet import Fleet
from cachescale.sim.present import run_json
from cachescale.sim.request import SimRequest
from cachescale.sim.run import RunResult
from cachescale.sim.scenario import Scenario, load_builtin


def short(name: str, **updates: object) -> Scenario:
    return load_builtin(name).model_copy(update={"duration_s": 900.0, **updates})


def fingerprint(result: RunResult) -> tuple[str, list[object], list[object], list[object]]:
    outcomes = [
        (r.request_id, r.replica, r.cached_tokens, r.first_token_s, r.finished_s)
        for r in result.finished
    ]
    report = json.dumps(run_json(result), sort_keys=True)
    return report, list(result.policy), list(result.samples), outcomes


def test_together_equals_apart_under_every_autoscaler_and_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The HPA alone, cachescale, and cachescale with another policy: one workload, three
    # fleets that diverge (in replicas, and in --max-num-seqs).
    base = short("batch-pressure-loop", policy_start_s=0.0)
    capped = base.model_copy(
        update={
            "policy": {
                "budget": {"gpuSecondsPer1kRequests": 300},
                "cache": {"onCollapse": "CapAtBudget"},
            }
        }
    )
    runs = [(base, "hpa"), (base, "cachescale"), (capped, "cachescale")]
    routed = count_routed(monkeypatch)
    together = run_together([(s, build_autoscaler(name, s)) for s, name in runs])
    routed_together = routed[0]
    apart = [run(s, build_autoscaler(name, s)) for s, name in runs]
    routed_apart = routed[0] - routed_together
    assert [fingerprint(r) for r in together] == [fingerprint(r) for r in apart]
    replicas = [{sample.replicas for sample in result.samples} for result in together]
    assert replicas[0] != replicas[1]  # the fleets did diverge
    assert together[1].policy != together[2].policy
    # One fleet served the stretch before the first split, for all three runs.
    assert max(map(len, (r.arrivals_s for r in apart))) < routed_together < routed_apart
    # What finished after the split is each run's own.
    last = [result.finished[-1] for result in together]
    assert len({id(request) for request in last}) == 3


def count_routed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``Fleet.route`` calls from now on, in the returned list's one item."""
    calls = [0]
    route = Fleet.route

    def counted(fleet: Fleet, request: SimRequest) -> bool:
        calls[0] += 1
        return route(fleet, request)

    monkeypatch.setattr(Fleet, "route", counted)
    return calls


def test_scenarios_that_draw_other_requests_are_refused() -> None:
    scenario = short("traffic-doubling")
    other = scenario.model_copy(update={"seed": scenario.seed + 1})
    with pytest.raises(ValueError, match="does not share"):
        run_together([(scenario, None), (other, None)])
