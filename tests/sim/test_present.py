"""What a run's report says: the incident from the change on, breaches, who served better."""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.commands.simulate import SimulationOutcome
from cachescale.sim.compare import comparison, who_served_better
from cachescale.sim.drive import run
from cachescale.sim.incident import Onset, Recovery, onset, p95_limit, recovery, recovery_words
from cachescale.sim.present import before_after, from_change, run_json, slo_breaches, verdict
from cachescale.sim.report import Windows, signals_dict
from cachescale.sim.run import RunResult
from cachescale.sim.scenario import Scenario, load_builtin


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


def _changed_fleet(
    replicas: int, rate_per_s: float, change: dict[str, Any], duration_s: float
) -> RunResult:
    """A fixed fleet (no autoscaler) with one perturbation."""
    data = load_builtin("cold-dilution").model_dump(mode="json")
    data["sweep"] = None
    data["fleet"].update(replicas=replicas, max_num_seqs=8, router="prefix_aware")
    data["fleet"]["pod_start_delay_s"] = 10.0
    data["workload"]["rate_per_s"] = rate_per_s
    data["duration_s"] = duration_s
    data["perturbations"] = [change]
    return run(Scenario.model_validate(data), autoscaler=None)


def _recovery(result: RunResult) -> Recovery | None:
    (start, end), _ = before_after(result)
    return recovery(result, Windows(result).signals(start, end))


def test_recovery_is_the_time_until_the_slo_holds_for_good() -> None:
    # One pod at 8 req/s breaches from the start; traffic falls to 0.5 req/s at 2 min and
    # the queue drains: recovered at the end of the last window above the SLO.
    drained = _changed_fleet(1, 8.0, {"kind": "rate", "at_s": 120.0, "rate_per_s": 0.5}, 480.0)
    found = _recovery(drained)
    assert found is not None
    late = [at for at, _ in slo_breaches(drained) if at + 30.0 > 120.0]
    assert late, "the queue built before the change outlives it"
    assert found.slo_s == max(late) + 30.0 - 120.0
    assert run_json(drained)["recovery"] == {"slo_s": found.slo_s, "hit_rate_s": 0.0}
    # Traffic rising on an overloaded pod: still breaching at the end, never recovered.
    behind = _changed_fleet(1, 2.0, {"kind": "rate", "at_s": 120.0, "rate_per_s": 8.0}, 240.0)
    assert _recovery(behind) == Recovery(slo_s=None, hit_rate_s=0.0)
    assert "TTFT p95 not back within the SLO by the end of the run" in verdict(behind)


def test_recovery_after_a_rollout_is_the_time_until_the_hit_rate_is_back() -> None:
    # Every pod replaced by a cold one at 5 min: the hit rate dips under its level before
    # (less 0.05) for three 30 s windows, while TTFT p95 stays within the SLO.
    rolled = _changed_fleet(2, 2.0, {"kind": "rolling_restart", "at_s": 300.0}, 600.0)
    found = _recovery(rolled)
    assert found is not None
    windows = Windows(rolled)
    (start, end), _ = before_after(rolled)
    before = windows.signals(start, end).token_hit_rate
    assert before is not None
    hit_rates = {at: windows.signals(at, at + 30).token_hit_rate for at in range(300, 600, 30)}
    cold = [at for at, rate in hit_rates.items() if rate is None or rate < before - 0.05]
    assert cold
    back = max(cold) + 30.0 - 300.0
    assert found == Recovery(slo_s=0.0, hit_rate_s=back)
    text = verdict(rolled)
    assert "TTFT p95 back within the SLO throughout" in text
    assert f"within 0.05 of its level before for good {back:.0f} s after the change" in text


def test_no_change_no_recovery() -> None:
    steady = _fixed_fleet(replicas=4, rate_per_s=1.0)
    assert _recovery(steady) is None
    assert run_json(steady)["recovery"] is None
    assert "After the change" not in verdict(steady)


@pytest.mark.parametrize(
    ("alone", "with_policy", "limit", "within"),
    [
        (2.0, 2.4, 2.4, True),  # 20% of 2 s is above 0.2 s
        (2.0, 2.41, 2.4, False),
        (0.5, 0.7, 0.7, True),  # 0.2 s is above 20% of 0.5 s
        (0.5, 0.71, 0.7, False),
    ],
)
def test_the_onset_is_held_to_the_last_third_s_bound(
    alone: float, with_policy: float, limit: float, within: bool
) -> None:
    assert p95_limit(alone) == pytest.approx(limit)
    judged = Onset(alone, with_policy, cap_at_budget=False)
    assert judged.within is within
    assert judged.as_dict()["within"] is within
    assert judged.as_dict()["limit_s"] == pytest.approx(limit)
    state = "within" if within else "above"
    assert f"{state} the bound of {limit:.2f} s (the larger of 1.2× and +0.2 s)" in judged.words()


def test_an_onset_above_the_bound_under_cap_at_budget_says_it_was_chosen() -> None:
    capped = Onset(1.0, 3.0, cap_at_budget=True)
    assert capped.within is False
    assert capped.words().endswith("(onCollapse: CapAtBudget, latency traded for cost)")
    assert Onset(None, 3.0, cap_at_budget=False).within is None
    assert "unknown" in Onset(1.0, None, cap_at_budget=False).words()


def test_the_comparison_judges_the_onset_and_states_each_recovery() -> None:
    alone = _changed_fleet(1, 2.0, {"kind": "rate", "at_s": 120.0, "rate_per_s": 8.0}, 240.0)
    text = comparison({"hpa": alone, "cachescale": alone})
    assert "onset: TTFT p95 from the change" in text
    assert ", within the bound of" in text
    assert recovery_words(Recovery(None, 0.0)) in verdict(alone)


def test_json_judges_the_onset_only_when_both_runs_are_there() -> None:
    behind = _changed_fleet(1, 2.0, {"kind": "rate", "at_s": 120.0, "rate_per_s": 8.0}, 240.0)
    both = SimulationOutcome(behind.scenario, {"hpa": behind, "cachescale": behind})
    judged = both.to_json_object()["onset"]
    assert judged == onset(behind, behind).as_dict()
    assert judged["within"] is True
    assert judged["hpa_p95_from_change_s"] == judged["cachescale_p95_from_change_s"]
    alone = SimulationOutcome(behind.scenario, {"hpa": behind})
    assert "onset" not in alone.to_json_object()
