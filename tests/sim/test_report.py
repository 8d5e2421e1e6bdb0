"""Window signals: ground truth from finished requests; unknown when nothing finished."""

from __future__ import annotations

import pytest

from cachescale.sim.present import (
    comparison,
    from_change,
    run_json,
    slo_breaches,
    verdict,
    who_served_better,
)
from cachescale.sim.report import Windows, quantile, signals_dict
from cachescale.sim.run import run
from cachescale.sim.scenario import load_builtin


def test_quantile_interpolates_like_numpy() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    assert quantile([7.0], 0.99) == 7.0
    assert quantile([], 0.5) is None


@pytest.fixture(scope="module")
def windows() -> Windows:
    scenario = load_builtin("cold-dilution").model_copy(update={"sweep": None})
    return Windows(run(scenario, autoscaler=None))


def test_window_without_requests_is_unknown_not_zero(windows: Windows) -> None:
    empty = windows.signals(10_000.0, 10_060.0)
    assert empty.token_hit_rate is None
    assert empty.ttft_p95_s is None
    assert empty.gpu_s_per_1k is None
    assert empty.req_per_s == 0.0


def test_signals_agree_with_the_requests(windows: Windows) -> None:
    finished = windows.result.finished
    signals = windows.signals(0.0, 150.0)
    prompt = sum(r.prompt_tokens for r in finished if (r.finished_s or 0) < 150.0)
    cached = sum(r.cached_tokens or 0 for r in finished if (r.finished_s or 0) < 150.0)
    assert signals.token_hit_rate == pytest.approx(cached / prompt)
    count = sum(1 for r in finished if (r.finished_s or 0) < 150.0)
    assert signals.req_per_s == pytest.approx(count / 150.0)
    gpus = get_gpus(windows)
    assert signals.gpu_s_per_1k == pytest.approx(1000 * gpus * 150.0 / count)


def get_gpus(windows: Windows) -> int:
    return sum(pod.gpus for pod in windows.result.pods)


def test_request_hit_share_uses_the_computed_token_threshold(windows: Windows) -> None:
    threshold = windows.result.scenario.report.full_hit_max_computed_tokens
    for request in windows.result.finished:
        computed = request.prompt_tokens - (request.cached_tokens or 0)
        assert windows.is_full_hit(request) == (computed <= threshold)


def test_hit_and_miss_ttft_are_split(windows: Windows) -> None:
    detail = windows.detail(0.0, 150.0)
    assert detail.ttft_p95_hit_s is not None
    assert detail.ttft_p95_miss_s is not None
    assert detail.ttft_p95_miss_s > detail.ttft_p95_hit_s  # misses pay the prefill


def test_offered_load_counts_every_arrival(windows: Windows) -> None:
    arrivals = windows.result.arrivals_s
    assert len(arrivals) >= len(windows.result.finished)
    signals = windows.signals(0.0, 150.0)
    assert signals.offered_req_per_s == pytest.approx(len(arrivals) / 150.0)
    assert signals.aborted_per_s == 0.0  # no client timeout in this scenario
    empty = windows.signals(10_000.0, 10_060.0)
    assert (empty.offered_req_per_s, empty.aborted_per_s) == (0.0, 0.0)  # counted, not unknown


def test_timed_out_clients_are_aborted_not_served() -> None:
    base = load_builtin("cold-dilution")
    fleet = base.fleet.model_copy(update={"replicas": 1, "max_num_seqs": 2})
    workload = base.workload.model_copy(update={"rate_per_s": 8.0, "client_timeout_s": 5.0})
    scenario = base.model_copy(
        update={"sweep": None, "fleet": fleet, "workload": workload, "duration_s": 120.0}
    )
    result = run(scenario, autoscaler=None)
    signals = Windows(result).signals(60.0, 120.0)
    assert signals.aborted_per_s > 0
    assert signals.req_per_s < signals.offered_req_per_s
    assert all(r.first_token_s is None and r.aborted_s is not None for r in result.aborted)
    assert not {id(r) for r in result.aborted} & {id(r) for r in result.finished}
    assert "req/s arrived and" in verdict(result)
    assert "aborted by clients that gave up" in verdict(result)


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
