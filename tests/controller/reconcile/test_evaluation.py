"""One policy's gather → decide → act against a fake API server and a fake Prometheus.

The Kubernetes side is kmock's stateful emulator over real HTTP; Prometheus is a
scripted HTTP fake answering the gather layer's real queries. Time is a test clock, so
minutes of evaluations take milliseconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from cachescale.api.policy import ORIGINAL_ENVELOPE, PROMETHEUS_CREDENTIALS
from cachescale.api.reasons import Action, ConditionReason, Diagnosis, Hold, Problem
from cachescale.api.status import pack_learned_state, unpack_learned_state
from cachescale.controller.reconcile.context import Operator, PolicyObject
from cachescale.controller.reconcile.evaluation import Outcome, evaluate
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from cachescale.snapshot import FetchFailure
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, deployment, hpa, pods, policy
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.gather.gather_fakes import FakePrometheus, HangAfter

POLICIES = "cachescale.dev/v1alpha1/cachescalingpolicies"
SETTLE = 40
"""Rounds (10 s apart) for a new policy to fill its 1 m window and, after a 300 s
stabilization window of lower recommendations, to lower maxReplicas."""
HPAS = "autoscaling/v2/horizontalpodautoscalers"
DEPLOYMENTS = "apps/v1/deployments"


def stack(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    name: str = "vllm",
    **policy_args: Any,
) -> EngineNumbers:
    """A Deployment of 11 pods, its HPA, the pods and a policy; healthy engine numbers."""
    cluster.put(DEPLOYMENTS, deployment(name, replicas=11))
    cluster.put(HPAS, hpa(name, target=name))
    for pod in pods(name, 11, clock.now):
        cluster.put("v1/pods", pod)
    cluster.put(POLICIES, policy(name, prometheus_url=prometheus.url, **policy_args))
    numbers = EngineNumbers(pods=tuple(f"{name}-{i}" for i in range(11)))
    engines.set({"namespace": NAMESPACE, "model_name": name}, numbers)
    return numbers


def run(
    operator: Operator, cluster: FakeCluster, clock: Clock, name: str = "vllm", rounds: int = 1
) -> list[Outcome]:
    """Evaluate ``rounds`` times, 10 s apart, re-reading the policy each time."""
    outcomes = []
    for _ in range(rounds):
        body = cluster.get(POLICIES, name)
        outcomes.append(evaluate(operator, PolicyObject.of(body)))
        clock.advance(10)
    return outcomes


def conditions(cluster: FakeCluster, name: str = "vllm") -> dict[str, tuple[str, str]]:
    status = cluster.get(POLICIES, name).get("status", {})
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


def learned(cluster: FakeCluster, name: str = "vllm") -> dict[str, Any]:
    """The decision memory the policy's stored status packs."""
    return unpack_learned_state(cluster.get(POLICIES, name)["status"]["learnedState"])


def events(cluster: FakeCluster) -> list[tuple[str, str]]:
    return [
        (e["type"], e["reason"])
        for e in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
    ]


ROOM_OVER_11 = 17
"""maxReplicas over the stack's 11 healthy replicas at a steady cost: 11 + ceil(11 / 2),
room for rising demand (decide.headroom.demand_headroom), above the budget's 12."""


def test_a_healthy_policy_caps_the_hpa_at_the_budget_and_keeps_everything_else(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)
    before = cluster.get(HPAS, "vllm")
    outcomes = run(operator, cluster, clock, rounds=SETTLE)
    assert outcomes[0].reason == Action.WAITING_FOR_FULL_WINDOW
    after = cluster.get(HPAS, "vllm")
    # The budget allows 800 GPU-s/1k × 32 req/s / (1000 × 2 GPUs) = 12.8 → 12; at a steady
    # cost within it the top keeps room for rising demand: 11 replicas + ceil(11 / 2) = 17.
    assert after["spec"]["maxReplicas"] == ROOM_OVER_11
    assert after["spec"]["minReplicas"] == 2
    assert after["spec"]["metrics"] == before["spec"]["metrics"]
    assert after["spec"]["behavior"] == before["spec"]["behavior"]
    assert after["metadata"]["labels"] == {"team": "ml"}
    assert '"maxReplicas": 40' in after["metadata"]["annotations"][ORIGINAL_ENVELOPE]
    assert conditions(cluster)["Ready"] == ("True", ConditionReason.EVALUATED)
    assert conditions(cluster)["CacheHealthy"][0] in ("True", "Unknown")


def test_advise_mode_writes_nothing_but_status_and_events(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(cluster, engines, prometheus, clock, mode="Advise")
    run(operator, cluster, clock, rounds=SETTLE)
    numbers.hit_rate = 0.04
    run(operator, cluster, clock, rounds=4)
    patched = {str(r.url.path) for r in cluster.requests("patch")}
    assert patched == {
        f"/apis/cachescale.dev/v1alpha1/namespaces/{NAMESPACE}/cachescalingpolicies/vllm/status"
    }
    created = {str(r.url.path) for r in cluster.requests("post")}
    assert created == {f"/api/v1/namespaces/{NAMESPACE}/events"}
    assert ("Warning", Diagnosis.PREFIX_COLLAPSE) in events(cluster)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 40
    status = cluster.get(POLICIES, "vllm")["status"]
    assert status["lastDecision"]["maxReplicas"] == 11  # what Enforce would have held
    assert status["lastDecision"]["applied"] is False


def test_a_collapse_holds_the_hpa_and_says_why(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(
        cluster, engines, prometheus, clock, extra={"budget": {"gpuSecondsPer1kRequests": 1200}}
    )
    run(operator, cluster, clock, rounds=SETTLE)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 19  # the budget's cap
    numbers.hit_rate, numbers.running = 0.04, 30.0
    run(operator, cluster, clock, rounds=3)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 11  # held at the pre-collapse 11
    assert conditions(cluster)["CacheHealthy"] == ("False", Diagnosis.PREFIX_COLLAPSE)
    assert conditions(cluster)["ScalingHeld"] == ("True", Hold.COLLAPSE)
    status = cluster.get(POLICIES, "vllm")["status"]
    assert status["state"] == Diagnosis.PREFIX_COLLAPSE
    (alert,) = status["alerts"]
    assert "token hit rate 0.85 → 0.04 over 3 windows on 11 warm pods" in alert["message"]
    assert ("Warning", Diagnosis.PREFIX_COLLAPSE) in events(cluster)
    assert ("Normal", Action.HELD_FOR_PREFIX_COLLAPSE) in events(cluster)


def test_bad_policies_report_themselves_while_a_good_one_keeps_working(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)
    invalid = policy(
        "invalid",
        prometheus_url=prometheus.url,
        extra={"budget": {"minReplicas": 9, "maxReplicas": 3}},
    )
    missing = policy(
        "missing", prometheus_url=prometheus.url, deployment_name="gone", hpa_name="vllm"
    )
    keda_owner = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "name": "so",
        "uid": "1",
    }
    cluster.put(HPAS, hpa("keda", target="vllm", owner=keda_owner))
    keda = policy("keda", prometheus_url=prometheus.url, hpa_name="keda")
    foreign = policy("foreign", prometheus_url=prometheus.url, hpa_name="other")
    cluster.put(HPAS, hpa("other", target="somebody-else"))
    for body in (invalid, missing, keda, foreign):
        cluster.put(POLICIES, body)
    for _ in range(SETTLE):
        for name in ("invalid", "missing", "keda", "foreign", "vllm"):
            run(operator, cluster, clock, name)
    assert conditions(cluster, "invalid")["Ready"] == ("False", Problem.INVALID_SPEC)
    assert conditions(cluster, "missing")["Ready"] == ("False", Problem.TARGET_NOT_FOUND)
    assert conditions(cluster, "keda")["Ready"] == ("False", Problem.HPA_MANAGED_BY_KEDA)
    assert conditions(cluster, "foreign")["Ready"] == ("False", Problem.TARGET_MISMATCH)
    assert conditions(cluster, "vllm")["Ready"] == ("True", ConditionReason.EVALUATED)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == ROOM_OVER_11
    assert cluster.get(HPAS, "keda")["spec"]["maxReplicas"] == 40  # never touched
    warnings = [reason for kind, reason in events(cluster) if kind == "Warning"]
    # Each problem is one event, not one per evaluation.
    for reason in (
        Problem.INVALID_SPEC,
        Problem.TARGET_NOT_FOUND,
        Problem.HPA_MANAGED_BY_KEDA,
        Problem.TARGET_MISMATCH,
    ):
        assert warnings.count(reason) == 1, reason


def test_prometheus_down_fails_open_and_says_so(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)
    engines.down = True
    settled = cluster.get(POLICIES, "vllm")["status"]
    patches, posted = len(cluster.requests("patch")), len(events(cluster))
    # The first failed read is retried at the next interval: nothing decided or written.
    (retried,) = run(operator, cluster, clock)
    assert retried == Outcome(Action.READ_RETRIED)
    assert cluster.get(POLICIES, "vllm")["status"] == settled
    assert (len(cluster.requests("patch")), len(events(cluster))) == (patches, posted)
    labels = {"namespace": NAMESPACE, "policy": "vllm", "kind": FetchFailure.BAD_RESPONSE.value}
    errors = "cachescale_evaluation_errors_total"
    assert operator.metrics.registry.get_sample_value(errors, labels) == 1
    # The second in a row freezes on the missing data.
    (outcome,) = run(operator, cluster, clock)
    assert outcome.reason == Action.FROZEN_ON_MISSING_METRICS
    assert conditions(cluster)["MetricsAvailable"] == ("False", Diagnosis.METRICS_UNAVAILABLE)
    # The budget's cap of 12 was set on data that is now missing: the HPA gets its
    # original 40 back (fail open) and may scale up on its own metric.
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 40
    unknown = cluster.get(POLICIES, "vllm")["status"]["signals"]["unknownSignals"]
    says = "bad response: HTTP 503 Service Unavailable (unavailable)"
    assert any(u["reason"].endswith(says) for u in unknown)


def test_a_prometheus_that_stalls_mid_evaluation_freezes_it_at_one_deadline(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    def client(config: PrometheusConfig) -> PrometheusClient:
        return PrometheusClient(replace(config, timeout_seconds=1.5))  # a short budget

    operator = Operator(cluster.api, clock=clock, new_client=client)
    stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == ROOM_OVER_11
    prometheus.respond = HangAfter(1, engines)  # the detection answers, then nothing
    started = time.monotonic()
    retried, outcome = run(operator, cluster, clock, rounds=2)
    assert time.monotonic() - started < 5  # one 1.5 s deadline each, not one per query
    assert retried.reason == Action.READ_RETRIED
    assert outcome.reason == Action.FROZEN_ON_MISSING_METRICS
    assert conditions(cluster)["MetricsAvailable"] == ("False", Diagnosis.METRICS_UNAVAILABLE)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 40  # nothing lowered
    unknown = cluster.get(POLICIES, "vllm")["status"]["signals"]["unknownSignals"]
    says = "timed out: no answer within 1.5s: the deadline was reached after 1."
    assert unknown
    assert all(says in u["reason"] for u in unknown)


def test_served_and_offered_load_side_by_side_in_status(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(cluster, engines, prometheus, clock)
    numbers.arrivals_per_second = 41.0  # saturated: 32 served, 41 arriving
    run(operator, cluster, clock, rounds=SETTLE)
    signals = cluster.get(POLICIES, "vllm")["status"]["signals"]
    assert signals["requestsPerSecond"] == 32.0
    assert signals["arrivalsPerSecond"] == 41.0


DEMAND = 'sum(rate(gateway_requests_total{route="llm"}[1m]))'
DEMAND_SENT = 'sum(rate(gateway_requests_total{route="llm",namespace="llm"}[1m]))'
"""What the operator sends for ``DEMAND``: confined to the policy's namespace."""


def test_a_demand_query_replaces_the_estimate_and_a_bad_one_freezes_nothing(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    operator.allow_demand_query = True  # --allow-demand-query
    extra = {"metrics": {"demandQuery": DEMAND}}
    numbers = stack(cluster, engines, prometheus, clock, extra=extra)
    # 11 pods × 2 GPUs serving 25 req/s cost 880 GPU-s/1k, over the 800 budget: the cap
    # is the allowance at the arrivals the gateway counts.
    numbers.requests_per_second = 25.0
    engines.demand[DEMAND_SENT] = 50.0
    run(operator, cluster, clock, rounds=SETTLE)
    assert cluster.get(POLICIES, "vllm")["status"]["signals"]["arrivalsPerSecond"] == 50.0
    # The budget's allowance is read at the arrivals the gateway counts (50 req/s), not
    # at the 25 served.
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 20
    del engines.demand[DEMAND_SENT]  # now it returns no series
    (outcome,) = run(operator, cluster, clock)
    assert outcome.reason != Action.FROZEN_ON_MISSING_METRICS
    assert conditions(cluster)["MetricsAvailable"][0] == "True"
    signals = cluster.get(POLICIES, "vllm")["status"]["signals"]
    assert "arrivalsPerSecond" not in signals
    (unknown,) = [u for u in signals["unknownSignals"] if u["signal"] == "arrivalsPerSecond"]
    assert "metrics.demandQuery returned no series" in unknown["reason"]
    # Back to the served rate: a lower cap, which waits out the stabilization window.
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 20


BATCHING = {
    "manageMaxNumSeqs": True,
    "model": {"layers": 32, "kvHeads": 32, "headDim": 128, "weightsGiB": 12.55},
    "gpu": {"memoryGiB": 80},
    "cacheReserveGiB": 9,
}


def pressured_stack(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    numbers = stack(cluster, engines, prometheus, clock, extra={"batching": BATCHING})
    cluster.put(DEPLOYMENTS, deployment(replicas=11, args=["--model", "m", "--max-num-seqs=128"]))
    numbers.hit_rate, numbers.preemptions_per_second, numbers.running = 0.3, 1.0, 60.0


def ceiling(cluster: FakeCluster) -> list[str]:
    return cluster.get(DEPLOYMENTS, "vllm")["spec"]["template"]["spec"]["containers"][1]["args"]


def test_a_restarted_operator_keeps_the_cooldown(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    pressured_stack(cluster, engines, prometheus, clock)
    run(Operator(cluster.api, clock=clock), cluster, clock, rounds=9)
    assert ceiling(cluster) == ["--model", "m", "--max-num-seqs=96"]
    deployment_patches = len([r for r in cluster.requests("patch") if "deployments" in str(r.url)])
    assert deployment_patches == 1
    # The step and the cache before it are kept for the follow-through rule.
    memory = learned(cluster)
    step = memory["lastMaxNumSeqsStep"]
    assert (step["before"], step["after"]) == (128, 96)
    assert step["warmHitRate"] == pytest.approx(0.3)
    assert step["at"] == memory["lastMaxNumSeqsChangeAt"]
    # A new operator process: everything it knows comes from the cluster.
    run(Operator(cluster.api, clock=clock), cluster, clock, rounds=30)
    assert ceiling(cluster) == ["--model", "m", "--max-num-seqs=96"]
    assert len([r for r in cluster.requests("patch") if "deployments" in str(r.url)]) == 1
    message = cluster.get(POLICIES, "vllm")["status"]["lastDecision"]["message"]
    assert "--max-num-seqs stays 96: cooldown" in message


def test_the_deployment_remembers_a_change_the_status_lost(
    cluster: FakeCluster, engines: EngineFake, prometheus: FakePrometheus, clock: Clock
) -> None:
    pressured_stack(cluster, engines, prometheus, clock)
    run(Operator(cluster.api, clock=clock), cluster, clock, rounds=9)
    assert ceiling(cluster)[-1] == "--max-num-seqs=96"
    body = cluster.get(POLICIES, "vllm")
    memory = {**learned(cluster), "lastMaxNumSeqsChangeAt": None}  # the status write was lost
    body["status"]["learnedState"] = pack_learned_state(memory)
    cluster.put(POLICIES, body)
    run(Operator(cluster.api, clock=clock), cluster, clock, rounds=10)
    assert ceiling(cluster)[-1] == "--max-num-seqs=96"


def test_repeated_alerts_are_one_event(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)
    # SLO breached with replicas at the cap, on dearer requests (prefill per request 1.5 ×
    # its baseline): the room for demand is gone and the cap comes down to the budget's.
    numbers.ttft_p95_s, numbers.prompt_tokens_per_request = 3.0, 3600.0
    cluster.put(DEPLOYMENTS, deployment(replicas=ROOM_OVER_11))
    run(operator, cluster, clock, rounds=20)
    assert [reason for _, reason in events(cluster)].count(Diagnosis.SLO_AT_RISK) == 1


def test_an_acknowledgement_annotation_releases_the_hold(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(
        cluster, engines, prometheus, clock, extra={"budget": {"gpuSecondsPer1kRequests": 1200}}
    )
    run(operator, cluster, clock, rounds=SETTLE)
    numbers.hit_rate, numbers.running = 0.04, 30.0
    run(operator, cluster, clock, rounds=3)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 11
    body = cluster.get(POLICIES, "vllm")
    body["metadata"]["annotations"] = {"cachescale.dev/acknowledge": clock.now.isoformat()}
    cluster.put(POLICIES, body)
    run(operator, cluster, clock, rounds=1)
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 19  # back to the budget's cap
    (alert,) = cluster.get(POLICIES, "vllm")["status"]["alerts"]
    assert alert["reason"] == Diagnosis.PREFIX_COLLAPSE
    assert alert["acknowledged"] is True
    assert conditions(cluster)["CacheHealthy"] == ("False", Diagnosis.PREFIX_COLLAPSE)


def test_conditions_move_their_transition_time_only_on_a_flip(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)

    def transitions() -> dict[str, str]:
        status = cluster.get(POLICIES, "vllm")["status"]
        return {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}

    before = transitions()
    run(operator, cluster, clock, rounds=3)
    assert transitions() == before
    numbers.ttft_p95_s = 3.0
    run(operator, cluster, clock, rounds=1)
    after = transitions()
    assert after["SLOMet"] != before["SLOMet"]
    assert {k: v for k, v in after.items() if k != "SLOMet"} == {
        k: v for k, v in before.items() if k != "SLOMet"
    }
    status = cluster.get(POLICIES, "vllm")["status"]
    assert status["observedGeneration"] == 1, "said once, for every condition"
    assert not [c for c in status["conditions"] if "observedGeneration" in c]


SECRET = {"apiVersion": "v1", "kind": "Secret"}
TOKEN_AUTH = {"metrics": {"auth": {"bearerTokenSecretRef": {"name": "prom", "key": "token"}}}}


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        (None, "Secret prom: HTTP 404"),
        ({"data": {"other": "dG9rZW4="}}, "Secret prom has no key 'token'"),
        ({"data": {"token": "//79"}}, "Secret prom key 'token' is not base64-encoded text"),
    ],
    ids=["missing", "no-key", "not-text"],
)
def test_unreadable_prometheus_credentials_freeze_with_their_own_reason(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    secret: dict[str, Any] | None,
    says: str,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=TOKEN_AUTH)
    if secret is not None:
        labels = {PROMETHEUS_CREDENTIALS: "true"}
        metadata = {"name": "prom", "namespace": NAMESPACE, "labels": labels}
        cluster.put("v1/secrets", {**SECRET, "metadata": metadata, **secret})
    (outcome,) = run(operator, cluster, clock)
    assert outcome.reason == Action.FROZEN_ON_MISSING_METRICS
    assert conditions(cluster)["MetricsAvailable"] == ("False", Diagnosis.METRICS_UNAVAILABLE)
    assert outcome.decision is not None
    assert says in outcome.decision.message
    labels = {"namespace": NAMESPACE, "policy": "vllm"}
    errors = "cachescale_evaluation_errors_total"
    kind = FetchFailure.CREDENTIALS_UNREADABLE.value
    assert operator.metrics.registry.get_sample_value(errors, {**labels, "kind": kind}) == 1


Spoil = Callable[[Callable[[dict[str, Any]], None], int], logging.LogRecord]


@pytest.fixture
def spoiled_status(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> Spoil:
    """Evaluate once, spoil the stored status in place, evaluate ``rounds`` more times and
    return the one record logged, a warning."""

    def spoil(edit: Callable[[dict[str, Any]], None], rounds: int) -> logging.LogRecord:
        stack(cluster, engines, prometheus, clock)
        run(operator, cluster, clock)
        body = cluster.get(POLICIES, "vllm")
        edit(body["status"])
        cluster.put(POLICIES, body)
        with caplog.at_level(logging.WARNING, logger="cachescale.operator"):
            run(operator, cluster, clock, rounds=rounds)
        (record,) = caplog.records
        assert record.levelno == logging.WARNING
        return record

    return spoil


def test_an_invalid_stored_memory_is_reset_with_a_warning(
    cluster: FakeCluster, spoiled_status: Spoil
) -> None:
    def high(status: dict[str, Any]) -> None:
        memory = unpack_learned_state(status["learnedState"])
        status["learnedState"] = pack_learned_state({**memory, "baseline": {"tokenHitRate": "hi"}})

    record = spoiled_status(high, 2)  # the second reads the reset memory
    message = record.getMessage()
    assert f"{NAMESPACE}/vllm: status.learnedState is invalid, so it is reset" in message
    assert "baseline.tokenHitRate" in record.getMessage()
    assert learned(cluster)["baseline"]["evaluations"] == 0


def test_a_learned_state_that_cannot_be_unpacked_is_reset_with_a_warning(
    cluster: FakeCluster, spoiled_status: Spoil
) -> None:
    record = spoiled_status(lambda status: status.update(learnedState="v1:not-base64!"), 2)
    message = record.getMessage()
    assert f"{NAMESPACE}/vllm: status.learnedState is invalid, so it is reset" in message
    assert "cannot be unpacked" in message
    assert learned(cluster)["baseline"]["evaluations"] == 0


def test_the_memory_an_older_version_wrote_is_read_and_replaced_by_learned_state(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A status written before ``learnedState`` holds the memory as an object: it is read
    (nothing starts over) and the next write packs it into ``learnedState``."""
    stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock)
    body = cluster.get(POLICIES, "vllm")
    memory = unpack_learned_state(body["status"].pop("learnedState"))
    body["status"]["memory"] = {**memory, "dataSince": "2026-11-30T09:00:00Z"}
    cluster.put(POLICIES, body)
    with caplog.at_level(logging.WARNING, logger="cachescale.operator"):
        run(Operator(cluster.api, clock=clock), cluster, clock)  # a new process
    assert not caplog.records
    stored = cluster.get(POLICIES, "vllm")["status"]
    assert "memory" not in stored
    assert learned(cluster)["dataSince"] == "2026-11-30T09:00:00Z"


def test_a_spoiled_memory_an_older_version_wrote_is_reset_with_a_warning(
    spoiled_status: Spoil,
) -> None:
    def spoiled(status: dict[str, Any]) -> None:
        status.pop("learnedState")
        status["memory"] = {"baseline": {"tokenHitRate": "high"}}

    record = spoiled_status(spoiled, 1)
    assert f"{NAMESPACE}/vllm: status.memory is invalid, so it is reset" in record.getMessage()


def test_a_memory_the_api_server_dropped_is_warned_of_once(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A CRD older than the operator prunes ``learnedState`` from every write: the status
    then holds decisions and never a memory, which one warning says."""
    stack(cluster, engines, prometheus, clock)
    with caplog.at_level(logging.WARNING, logger="cachescale.operator"):
        for _ in range(3):
            run(operator, cluster, clock)
            body = cluster.get(POLICIES, "vllm")
            del body["status"]["learnedState"]  # what the older CRD's pruning does
            cluster.put(POLICIES, body)
    (record,) = caplog.records
    assert f"{NAMESPACE}/vllm: the stored status has a decision but no status.learnedState" in (
        record.getMessage()
    )


def test_an_unparsable_acknowledge_annotation_is_ignored_with_one_warning(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stack(cluster, engines, prometheus, clock)
    body = cluster.get(POLICIES, "vllm")
    body["metadata"]["annotations"] = {"cachescale.dev/acknowledge": "yesterday"}
    cluster.put(POLICIES, body)
    with caplog.at_level(logging.WARNING, logger="cachescale.operator"):
        outcomes = run(operator, cluster, clock, rounds=3)
    assert {o.reason for o in outcomes} == {Action.WAITING_FOR_FULL_WINDOW}
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"{NAMESPACE}/vllm: annotation cachescale.dev/acknowledge='yesterday' is not an RFC 3339 "
        "time; the request is ignored"
    )


def test_an_invalid_stored_status_is_replaced_with_a_warning(
    cluster: FakeCluster, spoiled_status: Spoil
) -> None:
    record = spoiled_status(lambda status: status.update(conditions="all good"), 1)
    assert f"{NAMESPACE}/vllm: the stored status is invalid, so it is replaced" in (
        record.getMessage()
    )
    assert "conditions" in record.getMessage()
    assert isinstance(cluster.get(POLICIES, "vllm")["status"]["conditions"], list)


def test_a_policy_without_a_selector_reads_only_its_own_namespace(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock, extra={"metrics": {"selector": {}}})
    run(operator, cluster, clock)
    assert prometheus.queries
    for query in prometheus.queries:
        assert f'namespace="{NAMESPACE}"' in query, query


def test_a_tampered_original_envelope_stops_every_change_and_says_so(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    numbers = stack(cluster, engines, prometheus, clock)
    run(operator, cluster, clock, rounds=SETTLE)
    capped = cluster.get(HPAS, "vllm")
    assert capped["spec"]["maxReplicas"] == ROOM_OVER_11
    capped["metadata"]["annotations"][ORIGINAL_ENVELOPE] = '{"minReplicas": 2, "maxRepl'
    cluster.put(HPAS, capped)
    numbers.requests_per_second = 48.0  # the budget now allows 19: a raise is wanted
    patches = len(cluster.requests("patch"))
    outcomes = run(operator, cluster, clock, rounds=3)
    assert {o.reason for o in outcomes} == {Problem.TARGET_MISMATCH}
    assert conditions(cluster)["Ready"] == ("False", Problem.TARGET_MISMATCH)
    message = next(
        c["message"]
        for c in cluster.get(POLICIES, "vllm")["status"]["conditions"]
        if c["type"] == "Ready"
    )
    assert ORIGINAL_ENVELOPE in message
    assert "remove the annotation" in message
    hpa_patches = [r for r in cluster.requests("patch")[patches:] if "horizontalpod" in str(r.url)]
    assert hpa_patches == []
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == ROOM_OVER_11
    warnings = [reason for kind, reason in events(cluster) if kind == "Warning"]
    assert warnings.count(Problem.TARGET_MISMATCH) == 1
