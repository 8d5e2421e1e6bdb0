"""The fleet: pod lifecycle, scaling, rolling restarts, routing, GPU accounting."""

from __future__ import annotations

from cachescale.sim.fleet import Fleet, Pod, RouterKind
from cachescale.sim.profiles import get_profile
from cachescale.sim.request import SimRequest
from cachescale.sim.traffic import Traffic
from cachescale.sim.traffic_spec import WorkloadSpec

PROFILE = get_profile("llama3-8b-a100")


def fleet(replicas: int, router: RouterKind = RouterKind.ROUND_ROBIN, delay: float = 60.0) -> Fleet:
    return Fleet(PROFILE, 32, router, delay, replicas)


def requests(until_s: float, rate: float = 4.0) -> list[SimRequest]:
    return list(Traffic(WorkloadSpec(rate_per_s=rate), seed=3, until_s=until_s))


def test_initial_pods_are_ready_and_new_ones_wait_for_start_delay() -> None:
    f = fleet(2)
    assert len(f.ready_pods(0.0)) == 2
    f.scale_to(4, 10.0)
    assert len(f.live_pods) == 4
    assert len(f.ready_pods(69.0)) == 2
    assert len(f.ready_pods(70.0)) == 4


def test_scale_down_drains_youngest_first_and_pays_until_empty() -> None:
    f = fleet(2, delay=0.0)
    f.scale_to(3, 100.0)
    youngest = f.pods[-1]
    f.scale_to(2, 200.0)
    assert youngest.draining_since_s == 200.0
    assert youngest not in f.ready_pods(200.0)
    f.advance_to(201.0)
    assert youngest.gone_s == 201.0  # it held nothing, so it is gone at the next advance
    assert youngest.gpu_seconds_between(0.0, 1000.0) == PROFILE.gpus_per_replica * 101.0


def test_rolling_restart_replaces_every_pod_with_a_new_one() -> None:
    f = fleet(4, delay=30.0)
    old = set(map(id, f.live_pods))
    f.start_rolling_restart(0.0)
    t = 0.0
    while any(id(pod) in old for pod in f.live_pods) and t < 600.0:
        t += 15.0
        f.advance_to(t)
        f.reconcile(t)
        assert len(f.ready_pods(t)) >= 3  # maxUnavailable 25% of 4
        assert len(f.live_pods) <= 5  # maxSurge 25% of 4
    assert not any(id(pod) in old for pod in f.live_pods)
    assert len(f.live_pods) == 4


def test_round_robin_spreads_evenly() -> None:
    f = fleet(4)
    for request in requests(20.0):
        assert f.route(request)
    counts = [pod.engine.prefix_cache_queries_tokens for pod in f.pods]
    assert min(counts) > 0.6 * max(counts)


def test_prefix_aware_keeps_a_conversation_on_one_pod() -> None:
    f = fleet(4, RouterKind.PREFIX_AWARE)
    stream = requests(60.0)
    for request in stream:
        f.route(request)
    f.advance_to(200.0)
    by_group: dict[int, set[int | None]] = {}
    for request in f.finished:
        by_group.setdefault(request.prefix_group, set()).add(request.replica)
    spread = sum(len(replicas) for replicas in by_group.values()) / len(by_group)
    assert spread < 1.5


def test_no_ready_pod_drops_the_request() -> None:
    f = fleet(1)
    f.scale_to(0, 0.0)
    assert f.route(requests(5.0)[0]) is False


def test_finished_requests_are_recorded_once() -> None:
    f = fleet(2)
    stream = requests(30.0)
    for request in stream:
        f.route(request)
    f.advance_to(500.0)
    assert len(f.finished) == len(stream)
    assert len({id(r) for r in f.finished}) == len(stream)
    assert sum(pod.series.success_total for pod in f.pods) == len(stream)


def test_pod_gpu_seconds_clip_to_window() -> None:
    pod = Pod(
        "p",
        engine=None,
        series=None,
        created_s=100.0,
        ready_s=160.0,
        gpus=2,  # type: ignore[arg-type]
        revision=0,
        gone_s=400.0,
    )
    assert pod.gpu_seconds_between(0.0, 1000.0) == 600.0
    assert pod.gpu_seconds_between(200.0, 300.0) == 200.0
    assert pod.gpu_seconds_between(500.0, 600.0) == 0.0
