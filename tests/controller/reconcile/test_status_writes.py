"""The status is written only when its meaning changed, and at least every 10 minutes.

Against kmock, counting the status PATCHes the operator sends: a steady policy writes at
the refresh pace, a condition or memory change writes at once, a restarted operator (a
new ``Operator``: nothing cached) writes only what changed since the stored status, and
a refused write is retried on the next one. Events and ``lastDecision`` are what they were.
"""

from __future__ import annotations

import copy
import math
import tracemalloc
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from cachescale.api.reasons import Diagnosis
from cachescale.api.status import pack_learned_state, unpack_learned_state
from cachescale.controller.kube.client import KubeError
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import evaluate
from cachescale.controller.reconcile.status_writes import (
    STATUS_REFRESH_SECONDS,
    StatusWrites,
    normalised,
    refresh_due,
)
from cachescale.decide import Decision
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import (
    POLICIES,
    SETTLE,
    events,
    run,
    stack,
)
from tests.gather.gather_fakes import FakePrometheus

STATUS_PATH = (
    f"/apis/cachescale.dev/v1alpha1/namespaces/{NAMESPACE}/cachescalingpolicies/vllm/status"
)
INTERVAL_S = 10  # ``run`` evaluates 10 s apart


def status_writes(cluster: FakeCluster) -> int:
    return sum(1 for r in cluster.requests("patch") if str(r.url.path) == STATUS_PATH)


def metrics_available(cluster: FakeCluster) -> str:
    """The stored ``MetricsAvailable`` condition's status."""
    conditions = cluster.get(POLICIES, "vllm")["status"]["conditions"]
    return next(str(c["status"]) for c in conditions if c["type"] == "MetricsAvailable")


def settled(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    refresh_seconds: float = STATUS_REFRESH_SECONDS,
) -> Operator:
    """A healthy policy after its window filled and its envelope settled."""
    operator = Operator(cluster.api, clock=clock, status_writes=StatusWrites(refresh_seconds))
    stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)
    return operator


def test_a_steady_policy_writes_its_status_at_the_refresh_pace(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    before, stamp = status_writes(cluster), cluster.get(POLICIES, "vllm")["status"]
    rounds = 90  # 15 minutes
    run(operator, cluster, clock, rounds=rounds)
    written = status_writes(cluster) - before
    assert written <= math.ceil(rounds * INTERVAL_S / STATUS_REFRESH_SECONDS) + 1
    assert written >= math.floor(rounds * INTERVAL_S / STATUS_REFRESH_SECONDS)
    status = cluster.get(POLICIES, "vllm")["status"]
    observed = status["signals"]["observedAt"]
    assert observed != stamp["signals"]["observedAt"], "refreshed within 10 minutes"
    assert status["lastDecision"]["reason"] == stamp["lastDecision"]["reason"]


def test_a_shorter_refresh_set_by_the_cluster_owner_sets_the_pace(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    """``--status-refresh 2m``: a steady policy writes every two minutes, not every ten."""
    refresh = 120.0
    operator = settled(cluster, engines, prometheus, clock, refresh)
    before = status_writes(cluster)
    rounds = 36  # 6 minutes
    run(operator, cluster, clock, rounds=rounds)
    written = status_writes(cluster) - before
    assert math.floor(rounds * INTERVAL_S / refresh) <= written
    assert written <= math.ceil(rounds * INTERVAL_S / refresh) + 1


def test_numbers_moving_at_every_reading_are_written_at_the_refresh_pace(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    """A live engine: its hit rate, demand and TTFT move at every reading, by more than
    their display precision but not across any rule. The status waits for the refresh,
    and then shows one evaluation's numbers whole."""
    operator = settled(cluster, engines, prometheus, clock)
    numbers = next(iter(engines.engines.values()))
    before = status_writes(cluster)
    rounds = 60  # 10 minutes
    for n in range(rounds):
        numbers.hit_rate = 0.85 + (0.02 if n % 2 else -0.02)
        numbers.requests_per_second = 32.0 + n % 3
        numbers.ttft_p95_s = 0.5 + 0.05 * (n % 2)
        run(operator, cluster, clock, rounds=1)
    written = status_writes(cluster) - before
    assert 1 <= written <= math.ceil(rounds * INTERVAL_S / STATUS_REFRESH_SECONDS) + 1
    status = cluster.get(POLICIES, "vllm")["status"]
    assert status["summary"]["hitRate"] == f"{status['signals']['tokenHitRate']:.2f}"


def test_a_condition_change_is_written_at_once(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=3)
    before = status_writes(cluster)
    engines.down = True
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before, "a first failed read is retried, not written"
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1
    metrics = {c["type"]: c for c in cluster.get(POLICIES, "vllm")["status"]["conditions"]}
    assert metrics["MetricsAvailable"]["status"] == "False"


def test_an_outage_is_written_once_not_again_for_the_same_frozen_decision(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    """The freeze that holds the HPA is applied once; the evaluations after it decide the
    same with nothing left to change, which is no change worth a write (a chunk of
    policies losing Prometheus at once would otherwise write each of them twice)."""
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=3)
    before = status_writes(cluster)
    engines.down = True
    run(operator, cluster, clock, rounds=6)  # the first failed read is retried
    assert status_writes(cluster) == before + 1
    decision = cluster.get(POLICIES, "vllm")["status"]["lastDecision"]
    assert (decision["reason"], decision["applied"]) == ("FrozenOnMissingMetrics", True)


def test_a_collapse_is_written_every_evaluation_and_its_events_are_unchanged(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    next(iter(engines.engines.values())).hit_rate = 0.04
    before = status_writes(cluster)
    run(operator, cluster, clock, rounds=4)
    # Each evaluation of a building collapse moves its memory (streak length, evidence).
    assert status_writes(cluster) == before + 4
    assert ("Warning", Diagnosis.PREFIX_COLLAPSE) in events(cluster)
    status = cluster.get(POLICIES, "vllm")["status"]
    assert [a["reason"] for a in status["alerts"]] == [Diagnosis.PREFIX_COLLAPSE]


def test_a_memory_change_is_written_even_when_nothing_displayed_moved(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=2)
    before = status_writes(cluster)
    decide = operator.make_decision

    acknowledged = clock.now - timedelta(hours=1)

    def remembering(*args: Any) -> Decision:
        decision = decide(*args)
        memory = decision.memory.model_copy(update={"acknowledged_at": acknowledged})
        return replace(decision, memory=memory)

    operator.make_decision = remembering
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1
    packed = cluster.get(POLICIES, "vllm")["status"]["learnedState"]
    assert unpack_learned_state(packed)["acknowledgedAt"]
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1, "the same memory again: no write"


def test_a_restarted_operator_writes_nothing_that_did_not_change_until_the_refresh(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    """A restart is not a burst of writes: the stored status counts as written at its
    ``observedAt``, so the refresh comes at the policy's slot after that stamp (within 10
    minutes of it), not at once."""
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=2)
    before = status_writes(cluster)
    stored = cluster.get(POLICIES, "vllm")
    written_at = datetime.fromisoformat(stored["status"]["signals"]["observedAt"])
    due = refresh_due(stored["metadata"]["uid"], written_at, STATUS_REFRESH_SECONDS)
    assert written_at < due <= written_at + timedelta(seconds=STATUS_REFRESH_SECONDS)
    restarted = Operator(cluster.api, clock=clock)
    while clock.now < due:
        run(restarted, cluster, clock, rounds=1)
        assert status_writes(cluster) == before, f"written at {clock.now}, before {due}"
    run(restarted, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1, "the refresh, at the slot after the stored stamp"


def test_a_restarted_operator_writes_at_once_what_changed(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=2)
    before = status_writes(cluster)
    restarted = Operator(cluster.api, clock=clock)
    engines.down = True
    run(restarted, cluster, clock, rounds=2)  # a first failed read is retried
    assert status_writes(cluster) == before + 1
    assert metrics_available(cluster) == "False"


def test_a_failed_write_is_retried_on_the_next_evaluation(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=2)
    patch = operator.api.patch
    refused: list[str] = []

    def refusing_once(path: str, body: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if path == STATUS_PATH and not refused:
            refused.append(path)
            raise KubeError(503, "the API server is unavailable")
        return patch(path, body, *args, **kwargs)

    monkeypatch.setattr(operator.api, "patch", refusing_once)
    engines.down = True
    before = status_writes(cluster)
    run(operator, cluster, clock, rounds=1)
    assert not refused, "a first failed read is retried: no write attempted"
    run(operator, cluster, clock, rounds=1)
    assert refused
    assert status_writes(cluster) == before
    assert metrics_available(cluster) == "True", "the write was refused"
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1, "retried: the refused write was not remembered"
    assert metrics_available(cluster) == "False"


def test_after_a_failed_write_the_next_evaluation_writes_even_if_nothing_changed(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As after an API outage: what the server holds is unknown, so the status is written
    though it equals the last one accepted."""
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=2)
    patch = operator.api.patch

    def refusing(path: str, body: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise KubeError(503, "the API server is unavailable")

    monkeypatch.setattr(operator.api, "patch", refusing)
    engines.down = True  # a change (after one retried read), so a write is attempted, refused
    run(operator, cluster, clock, rounds=2)
    monkeypatch.setattr(operator.api, "patch", patch)
    engines.down = False  # back where the last accepted write left it
    before = status_writes(cluster)
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1
    run(operator, cluster, clock, rounds=1)
    assert status_writes(cluster) == before + 1, "steady again: skipped"


def test_a_status_changed_by_someone_else_is_rewritten(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    operator = settled(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=2)
    body = cluster.get(POLICIES, "vllm")
    body["status"] = {}
    cluster.put(POLICIES, body)
    before = status_writes(cluster)
    evaluate(operator, PolicyObject.of(cluster.get(POLICIES, "vllm")))
    assert status_writes(cluster) == before + 1
    assert unpack_learned_state(cluster.get(POLICIES, "vllm")["status"]["learnedState"])


def test_the_numbers_read_ride_along_and_only_known_or_unknown_is_a_change() -> None:
    """A live engine's numbers move at every reading, and the conditions and alerts that
    quote them with them: none of that is worth a write on its own. A number becoming
    unknown (or known) is, and so are a condition's status and reason; the learned
    baseline, a running average of them, moves with them."""
    at = "2026-11-30T12:00:00Z"
    later = "2026-11-30T12:00:10Z"

    def status(hit_rate: float | None, rps: float, baseline: float, stamp: str) -> dict[str, Any]:
        signals: dict[str, Any] = {
            "requestsPerSecond": rps,
            "observedAt": stamp,
            "qualifiedSignals": [{"signal": "ttftP99Seconds", "reads": f"> {rps:.0f} s"}],
        }
        if hit_rate is not None:
            signals["tokenHitRate"] = hit_rate
        shown = "unknown" if hit_rate is None else f"{hit_rate:.2f}"
        return {
            "signals": signals,
            "conditions": [
                {"type": "SLOMet", "status": "True", "reason": "WithinSLO",
                 "message": f"TTFT p95 {rps / 100:.2f} s", "lastTransitionTime": at},
            ],
            "alerts": [{"reason": "CacheDegraded", "since": at, "message": f"hit rate {shown}"}],
            "lastDecision": {
                "reason": "FrozenOnMissingMetrics", "time": stamp, "applied": rps > 30,
            },
            "memory": {
                "baseline": {"tokenHitRate": baseline, "evaluations": 3, "updatedAt": stamp},
                "preCollapse": {"replicas": 4, "requestsPerSecond": rps, "at": stamp},
                "alerts": [{"reason": "CacheDegraded", "since": at, "message": f"{shown}"}],
            },
        }  # fmt: skip

    steady = normalised(status(0.85, 32.2, 0.8501, at))
    assert normalised(status(0.61, 20.0, 0.8502, later)) == steady
    assert normalised(status(0.85, 32.2, 0.83, at)) == steady
    assert normalised(status(None, 32.2, 0.8501, at)) != steady
    recovered = status(0.85, 32.2, 0.8501, at)
    recovered["conditions"][0]["status"] = "False"
    assert normalised(recovered) != steady
    assert timedelta(seconds=STATUS_REFRESH_SECONDS) == timedelta(minutes=10), "as documented"


@pytest.mark.parametrize(
    ("before", "after", "same"),
    [
        ("TTFT p95 0.31 s within the 1.00 s SLO", "TTFT p95 0.45 s within the 1.00 s SLO", True),
        (
            "1,200 s (bucket 640–2,560 s); 80% of pods",
            "900 s (bucket 640–2,560 s); 7% of pods",
            True,
        ),
        ("target claimed by llm/fuzz-1", "target claimed by llm/fuzz-2", False),
        ("target claimed by llm/healthy", "target claimed by llm/late", False),
        ("Prometheus timed out", "Prometheus refused the connection", False),
    ],
)
def test_a_message_compares_with_the_numbers_it_quotes_masked(
    before: str, after: str, same: bool
) -> None:
    def status(message: str) -> dict[str, Any]:
        condition = {"type": "Ready", "status": "False", "reason": "TargetClaimed"}
        return {"conditions": [{**condition, "message": message}]}

    assert (normalised(status(before)) == normalised(status(after))) is same


def test_the_packed_memory_is_compared_unpacked_and_the_summary_not_at_all() -> None:
    """``learnedState`` moves with every evaluation's steady progress (a running average,
    a re-stamped mark): compared unpacked, as the structured memory was, that is no
    change, but a baseline becoming known is; ``summary`` is ``signals`` again,
    formatted, and compared there."""
    at = "2026-11-30T12:00:00Z"
    later = "2026-11-30T12:00:10Z"

    def status(hit_rate: float | None, evaluations: int, stamp: str, cell: str) -> dict[str, Any]:
        baseline = {"tokenHitRate": hit_rate, "evaluations": evaluations, "updatedAt": stamp}
        if hit_rate is None:
            del baseline["tokenHitRate"]
        return {
            "summary": {"hitRate": cell},
            "learnedState": pack_learned_state({"baseline": baseline}),
        }

    assert normalised(status(0.8501, 3, at, "0.85")) == normalised(status(0.8502, 4, later, "0.86"))
    assert normalised(status(0.85, 3, at, "0.85")) == normalised(status(0.83, 3, at, "0.85"))
    assert normalised(status(None, 3, at, "0.85")) != normalised(status(0.85, 3, at, "0.85"))
    assert normalised({"learnedState": "v1:damaged"}) == {"learnedState": "v1:damaged"}


def test_a_write_says_why_it_is_due() -> None:
    writes = StatusWrites()
    at = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    written: dict[str, Any] = {
        "signals": {"tokenHitRate": 0.85, "observedAt": at.isoformat()},
        "memory": {"streaks": {"sloBreach": 0}, "targetFactor": 1.0},
    }
    assert writes.due("uid", written, None, at) == "no write known"
    writes.wrote("uid", written, at)
    late = refresh_due("uid", at, STATUS_REFRESH_SECONDS)
    soon = at + (late - at) / 2
    assert writes.due("uid", written, written, soon) is None
    moved = {**written, "memory": {"streaks": {"sloBreach": 2}, "targetFactor": 0.8}}
    assert writes.due("uid", moved, written, soon) == (
        "changed: memory.streaks.sloBreach, memory.targetFactor"
    )
    assert writes.due("uid", written, {}, soon) == "stored status changed"
    assert writes.due("uid", written, written, late) == "refresh"


def test_a_number_the_api_server_returns_as_an_integer_is_no_change() -> None:
    """The API server's JSON returns ``2.0`` as ``2``: a restarted operator that adopts
    the stored status, and then renders the same meaning with floats, writes nothing."""
    writes = StatusWrites()
    at = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    stored: dict[str, Any] = {
        "signals": {"tokenHitRate": 1, "observedAt": at.isoformat()},
        "memory": {"streaks": {"sloBreach": 0}, "targetFactor": 2, "marks": [1, 3]},
    }
    rendered = {
        "signals": {"tokenHitRate": 1.0, "observedAt": at.isoformat()},
        "memory": {"streaks": {"sloBreach": 0}, "targetFactor": 2.0, "marks": [1.0, 3.0]},
    }
    soon = at + (refresh_due("uid", at, STATUS_REFRESH_SECONDS) - at) / 2
    assert writes.due("uid", rendered, stored, soon) is None
    moved = {**rendered, "memory": {**rendered["memory"], "marks": [3.0, 1.0]}}
    assert writes.due("uid", moved, stored, soon) == "changed: memory.marks"


def test_the_unpacked_memory_a_render_hands_over_compares_as_the_packed_one() -> None:
    writes = StatusWrites()
    at = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    memory = {"streaks": {"sloBreach": 0}, "targetFactor": 1.0}
    written = {"state": "Healthy", "learnedState": pack_learned_state(memory)}
    writes.wrote("uid", written, at, memory)
    soon = at + (refresh_due("uid", at, STATUS_REFRESH_SECONDS) - at) / 2
    assert writes.due("uid", written, written, soon) is None
    moved = {"streaks": {"sloBreach": 2}, "targetFactor": 1.0}
    again = {"state": "Healthy", "learnedState": pack_learned_state(moved)}
    assert writes.due("uid", again, written, soon) == "changed: learnedState.streaks.sloBreach"
    assert writes.due("uid", again, written, soon, moved) == (
        "changed: learnedState.streaks.sloBreach"
    )
    assert writes.due("uid", again, written, soon, memory) is None, "what it is handed counts"


def test_a_policys_last_write_is_kept_in_a_few_hundred_bytes() -> None:
    """The operator keeps a record per policy: the statuses themselves are the watch's,
    and what the comparison needs of the last write is a fingerprint and compressed JSON,
    not its normalised form (kilobytes of dicts per policy, at 10,000 policies)."""
    at = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    statuses = []
    for policy in range(200):
        memory = {
            "streaks": {"sloBreach": 0, "collapse": policy % 2},
            "recentReplicas": [{"at": at.isoformat(), "replicas": 11 + n % 3} for n in range(30)],
            "baseline": {"tokenHitRate": 0.85, "evaluations": 120, "updatedAt": at.isoformat()},
        }
        conditions = [
            {"type": f"C{n}", "status": "True", "reason": "Fine", "message": f"all is well {n}"}
            for n in range(6)
        ]
        status = {"conditions": conditions, "learnedState": pack_learned_state(memory)}
        statuses.append((f"uid-{policy}", status, memory))
    writes = StatusWrites()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for uid, status, memory in statuses:
            writes.wrote(uid, status, at, memory)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept / len(statuses) < 1_000, f"{kept / len(statuses):.0f} bytes per policy"
    soon = at + timedelta(seconds=1)
    uid, status, _ = statuses[7]
    assert writes.due(uid, status, status, soon) in (None, "refresh")


def test_the_watchs_copy_of_a_written_status_replaces_the_operators() -> None:
    """Once the watch delivers the status back, one copy is kept per policy, not two: the
    stored one, which then reads as unchanged by identity (skipped writes included)."""
    writes = StatusWrites()
    at = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    written: dict[str, Any] = {
        "signals": {"tokenHitRate": 0.85, "observedAt": at.isoformat()},
        "memory": {"streaks": {"sloBreach": 0}, "targetFactor": 1.0},
    }
    writes.wrote("uid", written, at)
    stored = copy.deepcopy(written)
    assert writes.latest("uid", stored) is stored
    soon = at + timedelta(seconds=30)
    assert writes.due("uid", copy.deepcopy(written), stored, soon) is None
    later = {**written, "signals": {"tokenHitRate": 0.851, "observedAt": soon.isoformat()}}
    writes.skipped("uid", later)
    assert writes.latest("uid", stored) is later, "a skipped write is still continued from"
    assert writes.due("uid", written, {**stored, "state": "edited"}, soon) == (
        "stored status changed"
    )


def test_statuses_written_together_are_refreshed_spread_over_the_period() -> None:
    """An operator's first start writes every status at once; their refreshes must not
    come back together every 10 minutes (a burst of PATCHes, one per policy)."""
    written = datetime.fromisoformat("2026-11-30T12:00:00+00:00")
    period = timedelta(seconds=STATUS_REFRESH_SECONDS)
    dues = [refresh_due(f"uid-{n}", written, STATUS_REFRESH_SECONDS) for n in range(1000)]
    assert all(written < due <= written + period for due in dues)
    bins = int(STATUS_REFRESH_SECONDS // 30)  # 30 s intervals of the period
    per_interval = [0] * bins
    for due in dues:
        per_interval[min(bins - 1, int((due - written).total_seconds() // 30))] += 1
    assert max(per_interval) <= 1.5 * len(dues) / bins, per_interval  # 1.0 if perfectly even
    lag = timedelta(seconds=1)  # a refresh is written at the first evaluation after its slot
    again = [
        refresh_due(f"uid-{n}", due + lag, STATUS_REFRESH_SECONDS) for n, due in enumerate(dues)
    ]
    tick = timedelta(milliseconds=1)
    assert all(abs(b - a - period) < tick for a, b in zip(dues, again, strict=True)), (
        "then once a period, at the same slot"
    )
