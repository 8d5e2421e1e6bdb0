"""Runs made together from one request stream equal the same runs made apart.

``run_together`` draws each request once and hands every run its own copy; nothing a
run does may leak into another (an engine writes outcomes into its requests), and the
chunked stepping must not change a single decision.
"""

from __future__ import annotations

import json

import pytest

from cachescale.sim.present import run_json
from cachescale.sim.run import RunResult, run, run_together
from cachescale.sim.scenario import Scenario, load_builtin
from cachescale.sim.simulate import build_autoscaler


def short(name: str, **updates: object) -> Scenario:
    return load_builtin(name).model_copy(update={"duration_s": 900.0, **updates})


def fingerprint(result: RunResult) -> tuple[str, list[object], list[object], list[object]]:
    outcomes = [
        (r.request_id, r.replica, r.cached_tokens, r.first_token_s, r.finished_s)
        for r in result.finished
    ]
    report = json.dumps(run_json(result), sort_keys=True)
    return report, list(result.policy), list(result.samples), outcomes


def test_together_equals_apart_under_every_autoscaler_and_policy() -> None:
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
    together = run_together([(s, build_autoscaler(name, s)) for s, name in runs])
    apart = [run(s, build_autoscaler(name, s)) for s, name in runs]
    assert [fingerprint(r) for r in together] == [fingerprint(r) for r in apart]
    replicas = [{sample.replicas for sample in result.samples} for result in together]
    assert replicas[0] != replicas[1]  # the fleets did diverge
    assert together[1].policy != together[2].policy
    first, second, _ = together
    assert not {id(r) for r in first.finished} & {id(r) for r in second.finished}


def test_scenarios_that_draw_other_requests_are_refused() -> None:
    scenario = short("traffic-doubling")
    other = scenario.model_copy(update={"seed": scenario.seed + 1})
    with pytest.raises(ValueError, match="does not share"):
        run_together([(scenario, None), (other, None)])
