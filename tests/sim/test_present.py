"""What a run's report says: the incident from the change on, breaches, who served better."""

from __future__ import annotations

from cachescale.sim.present import (
    comparison,
    from_change,
    run_json,
    slo_breaches,
    verdict,
    who_served_better,
)
from cachescale.sim.report import Windows, signals_dict
from cachescale.sim.run import run
from cachescale.sim.scenario import load_builtin


def test_the_whole_incident_is_reported_beside_the_last_third() -> None:
    # The last third can start after an incident is over: from the change to the end is
    # what users felt and paid through all of it, breaches counted from the change on.
    overloaded, comfortable = _fixed_fleet(replicas=1), _fixed_fleet(replicas=4, rate_per_s=1.0)
    start, end = from_change(overloaded)
    assert (start, end) == (120.0, 240.0)  # no perturbation: the middle of the run
    report = run_json(overloaded)
    assert report["from_change"] == signals_dict(Windows(overloaded).signals(start, end))
    breaches = slo_breaches(overloaded)
    assert [b["t_s"] for b in report["slo_breaches"]] == [at for at, _ in breaches]
    late = [p95 for at, p95 in breaches if at >= start]
    assert late
    assert len(late) < len(breaches)  # one pod breaches before the change too
    text = comparison({"hpa": overloaded, "cachescale": comfortable})
    assert "from the change (2m) to the end:" in text
    assert f"above the 1 s SLO in {len(late)} of 4 windows of 30 s (worst {max(late):,.1f} s)" in (
        text
    )
    assert "above the 1 s SLO in 0 of 4 windows of 30 s\n" in text + "\n"


def _fixed_fleet(replicas: int, rate_per_s: float = 8.0):  # type: ignore[no-untyped-def]
    base = load_builtin("cold-dilution")
    fleet = base.fleet.model_copy(update={"replicas": replicas, "max_num_seqs": 8})
    workload = base.workload.model_copy(update={"rate_per_s": rate_per_s})
    scenario = base.model_copy(
        update={"sweep": None, "fleet": fleet, "workload": workload, "duration_s": 240.0}
    )
    return run(scenario, autoscaler=None)


def test_the_verdict_names_every_window_above_the_slo_not_only_the_last() -> None:
    overloaded = _fixed_fleet(replicas=1)
    breaches = slo_breaches(overloaded)
    assert breaches, "one pod at 8 req/s must breach a 1 s SLO"
    text = verdict(overloaded)
    step = overloaded.scenario.report.timeline_s
    assert f"{len(breaches)} of the run's {step:g} s windows were above it" in text
    assert "stayed silent" not in text
    comfortable = _fixed_fleet(replicas=4, rate_per_s=1.0)
    assert slo_breaches(comfortable) == []
    assert "no window of the run was above it" in verdict(comfortable)


def test_both_runs_say_plainly_who_served_users_better_and_at_what_cost() -> None:
    behind, keeping_up = _fixed_fleet(replicas=1), _fixed_fleet(replicas=4)
    text = who_served_better(hpa=behind, cachescale=keeping_up)
    assert text.startswith(
        "Over the last third, cachescale served users better than the HPA alone, which fell "
        "behind its demand"
    )
    assert "more GPU time per request" in text  # four pods cost more per request than one
    reverse = who_served_better(hpa=keeping_up, cachescale=behind)
    assert "served users worse than the HPA alone: it fell behind its demand" in reverse
    same = who_served_better(hpa=keeping_up, cachescale=keeping_up)
    assert "served users as well as the HPA alone" in same
    assert "the same GPU time per request" in same
