"""Window signals: ground truth from finished requests; unknown when nothing finished."""

from __future__ import annotations

import pytest

from cachescale.sim.drive import run
from cachescale.sim.present import verdict
from cachescale.sim.report import Windows, quantile
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
