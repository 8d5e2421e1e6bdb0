"""The delete handler's restore and a batch's evaluation of the same policy never overlap,
and once the restore has begun no evaluation of it starts (``members.Guard``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import kopf

from cachescale.controller.reconcile.context import Operator
from cachescale.controller.reconcile.schedule import Due
from cachescale.controller.runtime.handlers import restore_on_delete
from cachescale.controller.runtime.members import Member, Runtime
from cachescale.decide import Decision, decide
from tests.controller.cluster import HPAS, Clock, FakeCluster, deployment, hpa, pods, policy
from tests.gather.gather_fakes import FakePrometheus

restore: Any = restore_on_delete  # kopf types its handlers as its own protocols


def test_the_restore_waits_out_an_evaluation_and_none_starts_after(
    cluster: FakeCluster, prometheus: FakePrometheus, clock: Clock
) -> None:
    cluster.put("apps/v1/deployments", deployment(replicas=4))
    cluster.put(HPAS, hpa())
    for pod in pods("vllm", 4, clock.now):
        cluster.put("v1/pods", pod)
    raw = policy(prometheus_url=prometheus.url)
    deciding, release = threading.Event(), threading.Event()
    decided: list[str] = []

    def slow_decide(*args: Any) -> Decision:
        deciding.set()
        assert release.wait(10)
        decided.append("decided")
        return decide(*args)

    runtime = Runtime(Operator(cluster.api, clock=clock, make_decision=slow_decide))
    memo = kopf.Memo(runtime=runtime)
    body = kopf.Body(cast(kopf.RawBody, raw))
    no_claims: Any = {}
    runtime.members["uid-vllm"] = Member(body, no_claims, runtime.guard("uid-vllm"))
    due = [Due("uid-vllm", 0.0, 10.0)]

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        evaluating = loop.run_in_executor(None, runtime._job(due))
        assert await loop.run_in_executor(None, deciding.wait, 10)
        deleting = asyncio.create_task(restore(body=body, memo=memo, claims={}))
        await asyncio.sleep(0.3)
        assert not deleting.done(), "the restore did not wait for the evaluation"
        release.set()
        await asyncio.wait_for(evaluating, 10)
        await asyncio.wait_for(deleting, 10)
        # A job found due before the deletion, run after the restore began: nothing.
        await asyncio.wait_for(loop.run_in_executor(None, runtime._job(due)), 10)

    asyncio.run(scenario())
    assert decided == ["decided"]
    assert runtime.guards == {}
