"""A status has a largest size, whatever the policy's author wrote.

The rule (``api/status.py``): every text of the status model is cut at its limit with an
ellipsis, and every list at its length, as the model is built, so the status outside the
decision engine's memory is never larger than ``STATUS_BOUND`` characters of JSON.
Checked three ways: the largest status the limits allow, built field by field; a
decision and its alerts with huge messages; and policies as a hostile author writes
them (a 960 KB selector the old CRD admitted, and the largest spec the CRD admits now)
evaluated for real against a fake cluster and Prometheus.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from cachescale.api.reasons import Problem
from cachescale.api.status import (
    CONDITION_MESSAGE_LIMIT,
    ELLIPSIS,
    CacheScalingPolicyStatus,
    ConditionType,
    SuspectedChange,
    clip,
)
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import evaluate
from cachescale.controller.reconcile.status import render, render_problem
from cachescale.decide import decide
from tests.api.test_size_limits import maximal_spec
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, deployment, hpa, pods, policy
from tests.controller.engine_fake import EngineFake
from tests.decide.decide_builders import learned, signals, snapshot, spec
from tests.gather.gather_fakes import FakePrometheus

STATUS_BOUND = 64 * 1024
"""The largest status outside the decision memory, in characters of JSON."""
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POLICIES = "cachescale.dev/v1alpha1/cachescalingpolicies"
HUGE = "<" * 100_000


MEMORY_FIELDS = ("learnedState", "memory")
"""The decision memory: packed, and as older versions wrote it."""


def outside_memory(status: dict[str, Any]) -> int:
    """Characters of ``status`` as JSON, the decision memory left out."""
    kept = {k: v for k, v in status.items() if k not in MEMORY_FIELDS}
    return len(json.dumps(kept, ensure_ascii=False))


def assert_bounded(status: dict[str, Any]) -> None:
    """``status`` is one the schema admits, and within the bound."""
    CacheScalingPolicyStatus.model_validate(status)
    assert outside_memory(status) <= STATUS_BOUND


def test_clip_keeps_what_fits_and_marks_what_it_cuts() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("abcd", 3) == "ab" + ELLIPSIS
    assert len(clip(HUGE, 1024)) == 1024


def largest_status() -> dict[str, Any]:
    """Every list of status over-full and every text far past its limit (texts the
    operator writes only from its own words at their schema's bound)."""
    stamp = NOW.isoformat()
    condition = {"status": "False", "reason": "A" * 128, "message": HUGE}
    decision = {
        "time": stamp,
        "diagnosis": "D" * 64,
        "reason": "R" * 128,
        "message": HUGE,
        "minReplicas": 10_000,
        "maxReplicas": 10_000,
        "maxNumSeqs": 65_536,
        "applied": True,
    }
    return {
        "observedGeneration": 2**62,
        "state": "S" * 64,
        "conditions": [
            {**condition, "type": kind.value, "lastTransitionTime": stamp} for kind in ConditionType
        ],
        "summary": {"hitRate": "h" * 8, "ttftP95": "T" * 64, "gpuSecondsPer1k": 2**62},
        "signals": {
            "observedAt": stamp,
            "prometheus": HUGE,
            "unknownSignals": [{"signal": "s" * 128, "reason": HUGE}] * 100,
            "qualifiedSignals": [{"signal": "s" * 128, "reads": "r" * 256}] * 100,
        },
        "lastDecision": decision,
        "alerts": [{"reason": "A" * 64, "since": stamp, "message": HUGE}] * 100,
        "suspectedChange": {"onset": stamp, "checkedAt": stamp, "message": HUGE},
        "memory": {"alerts": [{"message": HUGE}]},
    }


def test_the_largest_status_is_under_the_bound() -> None:
    status = CacheScalingPolicyStatus.model_validate(largest_status()).to_wire()
    assert_bounded(status)
    assert all(c["message"].endswith(ELLIPSIS) for c in status["conditions"])
    size = outside_memory(status)
    print(f"\nlargest status outside memory: {size} characters")
    assert size > STATUS_BOUND // 2, "every limit is used"


def test_huge_messages_in_a_decision_are_cut() -> None:
    state = snapshot(signals(hit=0.04))
    decision = decide(spec(), state, learned(), state.signals.observed_at)
    alerts = tuple(a.model_copy(update={"message": HUGE}) for a in decision.alerts)
    decision = replace(decision, message=HUGE, alerts=alerts)
    change = SuspectedChange(onset=NOW, checked_at=NOW, message="<" * 2048)
    previous = CacheScalingPolicyStatus()
    status = render(
        previous,
        decision,
        state,
        generation=1,
        now=state.signals.observed_at,
        applied=True,
        warmup_seconds=300.0,
        prometheus=HUGE,
        autoscaler_notes=(HUGE,),
        suspected_change=change,
    ).wire
    assert_bounded(status)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"].endswith(ELLIPSIS)
    assert len(ready["message"]) == CONDITION_MESSAGE_LIMIT
    assert status["lastDecision"]["message"].endswith(ELLIPSIS)
    assert status["signals"]["prometheus"].endswith(ELLIPSIS)
    problem = render_problem(
        CacheScalingPolicyStatus.model_validate(status),
        Problem.INVALID_SPEC,
        HUGE,
        generation=2,
        now=NOW,
    ).wire
    assert_bounded(problem)


def evaluated(operator: Operator, cluster: FakeCluster, spec: dict[str, Any]) -> dict[str, Any]:
    """The status after one evaluation of a policy named vllm with ``spec``."""
    body = cluster.get(POLICIES, "vllm")
    body["spec"] = spec
    cluster.put(POLICIES, body)
    evaluate(operator, PolicyObject.of(cluster.get(POLICIES, "vllm")))
    status = cluster.get(POLICIES, "vllm").get("status")
    assert status is not None
    return dict(status)


def test_hostile_policies_get_a_bounded_status(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    cluster.put("apps/v1/deployments", deployment("vllm", replicas=2))
    cluster.put("autoscaling/v2/horizontalpodautoscalers", hpa("vllm", target="vllm"))
    for item in pods("vllm", 2, clock.now):
        cluster.put("v1/pods", item)
    cluster.put(POLICIES, policy("vllm", prometheus_url=prometheus.url))
    base = policy("vllm", prometheus_url=prometheus.url)["spec"]
    # As the CRD before the size limits admitted: 16 selector values of 60 KB (960 KB).
    old = {
        **base,
        "metrics": {**base["metrics"], "selector": {f"l{i}": "v" * 60_000 for i in range(16)}},
    }
    status = evaluated(operator, cluster, old)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == Problem.INVALID_SPEC, ready
    assert "selector" in ready["message"]
    assert_bounded(status)
    size = outside_memory(status)
    print(f"\n960 KB spec: status {size} characters, Ready: {ready['message'][:100]}")
    # The largest spec the CRD admits now, on this stack's target and Prometheus.
    largest = maximal_spec()
    largest["target"] = base["target"]
    largest["metrics"] = {**largest["metrics"], "prometheusUrl": prometheus.url}
    largest["metrics"].pop("auth")
    largest["metrics"].pop("demandQuery")
    largest["cache"]["promptSources"] = [
        {**source, "namespace": NAMESPACE} for source in largest["cache"]["promptSources"]
    ]
    for _ in range(3):
        status = evaluated(operator, cluster, largest)
        clock.advance(10)
        assert_bounded(status)
    print(f"largest admissible spec: status {outside_memory(status)} characters")


def test_fields_an_older_version_wrote_are_dropped_not_refused() -> None:
    """A status stored by an older version (its baseline, its history, each condition's
    generation) is read as this version's, so an upgrade keeps the memory."""
    stored = largest_status()
    stamp = NOW.isoformat()
    older = {
        **stored,
        "baseline": {"tokenHitRate": 0.8, "updatedAt": stamp},
        "history": [stored["lastDecision"]] * 10,
        "conditions": [{**c, "observedGeneration": 3} for c in stored["conditions"]],
    }
    read = CacheScalingPolicyStatus.model_validate(older).to_wire()
    assert read == CacheScalingPolicyStatus.model_validate(stored).to_wire()
    assert "baseline" not in read
    assert "history" not in read
    assert not [c for c in read["conditions"] if "observedGeneration" in c]
