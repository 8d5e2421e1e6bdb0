"""The HPA's own metric (``decide.hpa_metric``): which metric it scales on, and the replicas
it asks for at a target, ceil(ready × average per pod / target), as a table of cases."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from cachescale.decide.hpa_metric import hpa_wanted_replicas, on_running_batch
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import signals, snapshot, workload

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def on(metric: str | None, ready: int = 12, running: float | None = 20.0) -> Snapshot:
    """``ready`` pods, each running ``running`` with 3 waiting, the HPA on ``metric``."""
    engine = signals(running_requests_per_pod=running, waiting_requests_per_pod=3.0)
    fleet = workload(replicas=ready)
    return snapshot(engine, replace(fleet, hpa=replace(fleet.hpa, metric_name=metric)))


@dataclass(frozen=True)
class WantedCase:
    """The HPA's metric and target, and what it asks for."""

    name: str
    state: Snapshot
    target: float | None
    wanted: int | None
    running_batch: bool = False


WANTED_CASES = [
    # ceil(11 × 20 / 24) = ceil(9.17) = 10.
    WantedCase("on the running batch", on(RUNNING, ready=11), 24.0, 10, running_batch=True),
    # 12 × 20 / 24 = 10 exactly: 10, not 11.
    WantedCase("an exact count is itself", on(RUNNING), 24.0, 10, running_batch=True),
    # ceil(12 × 3 / 24) = ceil(1.5) = 2.
    WantedCase("on the queue", on(WAITING), 24.0, 2),
    WantedCase("on a metric named for a queue", on("llm_queue_depth"), 24.0, 2),
    WantedCase("on any other metric: unknown", on("vllm:gpu_cache_usage_perc"), 24.0, None),
    WantedCase("no metric: unknown", on(None), 24.0, None),
    WantedCase("no target: unknown", on(RUNNING), None, None, running_batch=True),
    WantedCase("a zero target: unknown", on(RUNNING), 0.0, None, running_batch=True),
    WantedCase("an unknown average: unknown", on(RUNNING, running=None), 24.0, None, True),
]


@pytest.mark.parametrize("case", WANTED_CASES, ids=lambda case: case.name)
def test_hpa_wanted_replicas(case: WantedCase) -> None:
    assert hpa_wanted_replicas(case.state, case.target) == case.wanted
    assert on_running_batch(case.state) is case.running_batch
