"""The whole operator as a process: ``cachescale run`` → kmock, Prometheus → ``cachescale emulate``.

Nothing here calls a handler: the real ``cachescale run`` process (kopf and all) watches a
``CacheScalingPolicy`` in the fake API server, reads a real Prometheus that scrapes three
emulated vLLM pods, and acts on the HPA over HTTP. The emulated workload is a RAG service
whose prefix cache hits ~0.8 until, at a chosen simulated time, the release of the
incident (docs/simulator.md, "The incident preset") goes out: the corpus is re-chunked,
retrieval re-runs every turn and its chunks move ahead of the tools, system prompt and
history. The hit rate falls to ~0.1 while traffic stays flat (it dips by a sixth, see
``RATE_AFTER``).

The test then sees what a user would see: the Warning Event ``PrefixCollapse`` with the
evidence, ``CacheHealthy=False``, the HPA's ``maxReplicas`` held at the pre-collapse
level; deleting the policy puts the HPA's original envelope back and kopf's finalizer
lets the object go; SIGTERM stops the operator cleanly.

Wall time is bound by the policy's minimum window (1m): one window before anything is
decided, then the collapse must fill most of a window and hold for three evaluations
10 s apart. About 2.5 minutes in all.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cachescale.api.policy import GROUP, MANAGED_BY, ORIGINAL_ENVELOPE, PLURAL, VERSION
from cachescale.api.reasons import Action, ConditionReason, Diagnosis, Hold
from cachescale.api.status import unpack_learned_state
from cachescale.controller.kube.client import NotFoundError
from e2e.harness.cluster import why_no_cluster
from tests.controller.cluster import (
    NAMESPACE,
    FakeCluster,
    deployment,
    fake_cluster,
    hpa,
    learned_baseline,
    pods,
    policy,
)
from tests.controller.process_fixture import (
    LOOPBACK_PROMETHEUS,
    POLICIES,
    OperatorProcess,
    delete,
    namespace_paths,
    prepare_for_kopf,
    run_operator,
    write_kubeconfig,
)
from tests.prometheus_fixture import (
    EmulatorProcess,
    PrometheusServer,
    fixed_fleet_scenario,
    prometheus_binary,
    run_emulator,
    run_prometheus,
)

T = TypeVar("T")

NAME = "vllm"
MODEL = "llama-3-8b"
PODS = 3
SPEED = 4.0
"""Simulated seconds per wall second: ~48 req/s through Prometheus, thousands of requests
per window, so the windowed rates are smooth."""
RATE, RATE_AFTER = 12.0, 10.0
"""Simulated req/s before and after the release. The dip keeps the hold level exact: a
collapse hold returns to the pre-collapse replicas scaled up by any demand growth since
(``ceil(3 × 1.02) = 4``), so with flat traffic Poisson noise alone would decide between
3 and 4. One sixth less traffic is still "flat" for the diagnosis (within ±20%)."""
COLLAPSE_AFTER_S = 75.0
"""Wall seconds after the emulator starts at which the release goes out: after the
operator's first full window (setup ~8 s + 60 s), so a baseline has been learned."""
COLLAPSE_AT_SIM_S = COLLAPSE_AFTER_S * SPEED
DURATION_SIM_S = 300.0 * SPEED
"""Longer than the test can run: counters never freeze under the operator."""
HPA_MIN, HPA_MAX, HPA_TARGET = 2, 40, "24"
BUDGET = 100_000.0
"""GPU-s per 1k requests: allows thousands of replicas at ~48 req/s on 1-GPU pods, so
the budget caps nothing and the only hold is the collapse's."""
BASELINE_TIMEOUT_S = 120.0
COLLAPSE_TIMEOUT_S = 150.0
RESTORE_TIMEOUT_S = 30.0
POLL_S = 0.2
EVIDENCE = re.compile(
    r"token hit rate (\d\.\d\d) → (\d\.\d\d) over (\d+) windows on (\d+) warm pods"
)


def collapse_scenario() -> dict[str, Any]:
    """Three fixed vLLM pods of a RAG workload; the incident's release at
    ``COLLAPSE_AT_SIM_S``. Sixteen documents per topic: once retrieval runs per request,
    a topic's chunk pairs rarely repeat, so the cache does not heal back over the
    threshold (with four, it recovers to ~0.35)."""
    scenario = fixed_fleet_scenario(replicas=PODS, duration_s=DURATION_SIM_S)
    scenario["fleet"]["max_num_seqs"] = 32
    scenario["workload"]["rate_per_s"] = RATE
    scenario["workload"]["retrieval"]["docs_per_topic"] = 16
    at = COLLAPSE_AT_SIM_S
    scenario["perturbations"] = [
        {"kind": "chunk_size", "at_s": at, "chunk_size": 250},
        {"kind": "retrieval_per_turn_ahead_of_history", "at_s": at},
        {
            "kind": "layout",
            "at_s": at,
            "layout": ["docs", "tools", "system", "history", "user", "variable"],
        },
        {"kind": "rate", "at_s": at, "rate_per_s": RATE_AFTER},
    ]
    return scenario


def pod_names() -> list[str]:
    """The emulator's pod labels (``--deployment`` defaults to the engine name)."""
    return [f"vllm-engine-{i}" for i in range(PODS)]


def serving_stack(cluster: FakeCluster, prometheus_url: str) -> dict[str, Any]:
    """The Deployment, its HPA, its pods (named as the emulator names them: pod ages come
    from the Kubernetes side) and the policy; returns the HPA as created."""
    cluster.put(
        "apps/v1/deployments",
        deployment(NAME, replicas=PODS, gpus=1, args=["--model", MODEL, "--max-num-seqs", "32"]),
    )
    original = hpa(NAME, min_replicas=HPA_MIN, max_replicas=HPA_MAX, average_value=HPA_TARGET)
    cluster.put("autoscaling/v2/horizontalpodautoscalers", original)
    for pod, name in zip(pods(NAME, PODS, datetime.now(UTC)), pod_names(), strict=True):
        pod["metadata"]["name"] = name
        cluster.put("v1/pods", pod)
    cluster.put(
        POLICIES,
        policy(
            NAME,
            prometheus_url=prometheus_url,
            extra={
                "metrics": {"selector": {"namespace": NAMESPACE, "model_name": MODEL}},
                "budget": {"gpuSecondsPer1kRequests": BUDGET},
                "cache": {"onCollapse": "Hold"},
            },
        ),
    )
    return original


# -- reading the fake cluster -------------------------------------------------------------


def policy_path() -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}/{NAME}"


def hpa_path() -> str:
    return f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/{NAME}"


def status(cluster: FakeCluster) -> dict[str, Any]:
    try:
        return dict(cluster.api.get(policy_path()).get("status", {}))
    except NotFoundError:
        return {}


def condition(status_: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for entry in status_.get("conditions", []):
        if entry["type"] == kind:
            return entry["status"], entry["reason"]
    return None


def policy_events(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [
        event
        for event in cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events")
        if event.get("involvedObject", {}).get("kind") == "CacheScalingPolicy"
        and event["involvedObject"].get("name") == NAME
    ]


def policy_gone(cluster: FakeCluster) -> bool:
    try:
        cluster.api.get(policy_path())
    except NotFoundError:
        return True
    return False


# -- waiting, with the story so far on failure --------------------------------------------


class Watch:
    """Polls the world and, when something times out or an assertion fails, explains it:
    the operator's log tail, the policy's status, the Events, the HPA, Prometheus' view."""

    def __init__(
        self,
        cluster: FakeCluster,
        operator: OperatorProcess,
        prometheus: PrometheusServer,
        emulator: EmulatorProcess,
    ) -> None:
        self.cluster = cluster
        self.operator = operator
        self.prometheus = prometheus
        self.emulator = emulator
        self.started = time.monotonic()
        self.timeline: list[str] = []

    def mark(self, what: str) -> None:
        sim = self.sim_time()
        stamp = f"{time.monotonic() - self.started:6.1f}s wall"
        self.timeline.append(f"{stamp} (sim {sim:7.1f}s): {what}" if sim else f"{stamp}: {what}")

    def sim_time(self) -> float:
        try:
            return float(self.emulator.truth()["sim_time_s"])
        except (OSError, ValueError, KeyError):
            return 0.0

    def until(self, check: Callable[[], T | None], timeout_s: float, what: str) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.operator.process.poll() is not None:
                raise AssertionError(f"the operator exited while waiting for {what}")
            result = check()
            if result is not None:
                self.mark(what)
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
            time.sleep(POLL_S)

    def story(self) -> str:
        current = status(self.cluster)
        brief = {key: current.get(key) for key in ("state", "conditions", "signals", "alerts")}
        brief["lastDecision"] = current.get("lastDecision")
        packed = current.get("learnedState")
        memory = unpack_learned_state(packed) if packed else {}
        brief["learnedState.preCollapse"] = memory.get("preCollapse")
        brief["baseline"] = learned_baseline(current)
        try:
            hpa_spec = self.cluster.api.get(hpa_path())
        except NotFoundError:
            hpa_spec = {}
        events = [(e["type"], e["reason"], e["message"]) for e in policy_events(self.cluster)]
        try:
            hit_rate = self.prometheus.query(
                "sum(rate(vllm:prefix_cache_hits_total[1m])) / "
                "sum(rate(vllm:prefix_cache_queries_total[1m]))"
            )
        except (OSError, AssertionError) as error:
            hit_rate = [{"error": str(error)}]
        return "\n".join(
            [
                "--- timeline",
                *self.timeline,
                "--- policy status",
                json.dumps(brief, indent=1, default=str),
                "--- events",
                *(str(e) for e in events),
                "--- HPA",
                json.dumps(
                    {
                        "spec": hpa_spec.get("spec"),
                        "annotations": hpa_spec.get("metadata", {}).get("annotations"),
                    },
                    indent=1,
                ),
                f"--- Prometheus hit rate over 1m now: {hit_rate}",
                "--- operator log (tail)",
                self.operator.tail(80),
            ]
        )


@contextmanager
def explained(watch: Watch) -> Iterator[None]:
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"{error}\n\n{watch.story()}") from error
    print("\n".join(watch.timeline))  # shown with -s or -rA: where the wall time went


# -- the test -----------------------------------------------------------------------------


def wait_for_rates(prometheus: PrometheusServer, timeout_s: float = 20.0) -> None:
    """Until every pod's counters have two samples (a rate), so the operator's first
    evaluation already reads signals rather than freezing on missing data."""
    selector = f'{{namespace="{NAMESPACE}",model_name="{MODEL}"}}'
    queries = [
        f"rate(vllm:prefix_cache_queries_total{selector}[1m])",
        f"rate(vllm:time_to_first_token_seconds_count{selector}[1m])",
    ]
    deadline = time.monotonic() + timeout_s
    while not all(len(prometheus.query(q)) == PODS for q in queries):
        assert time.monotonic() < deadline, "Prometheus holds no rates for the emulated pods"
        time.sleep(POLL_S)


@pytest.mark.slow
@pytest.mark.skipif(
    why_no_cluster() is None,
    reason="a real API server is here: e2e/test_operator_incident.py runs this story on it "
    "(this kmock twin keeps it covered where there is none)",
)
def test_the_operator_process_holds_the_hpa_through_a_prefix_collapse_and_restores_it(
    tmp_path: Path,
) -> None:
    prometheus_binary()  # skip (locally) or fail (CI) without it, before starting anything
    with ExitStack() as stack:
        stack.enter_context(namespace_paths())
        cluster = stack.enter_context(fake_cluster())
        prepare_for_kopf(cluster)
        flags = ("--namespace", NAMESPACE, "--model-name", MODEL, "--linger", "30")
        emulator = stack.enter_context(
            run_emulator(
                tmp_path,
                collapse_scenario(),
                *flags,
                "--ground-truth-interval",
                "1",
                speed=SPEED,
            )
        )
        prometheus = stack.enter_context(run_prometheus(tmp_path, emulator.file_sd))
        emulator.wait_for_targets()
        prometheus.wait_for_targets_up(set(pod_names()))
        wait_for_rates(prometheus)
        original = serving_stack(cluster, prometheus.url)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.url)
        operator = stack.enter_context(
            run_operator(tmp_path, kubeconfig, flags=LOOPBACK_PROMETHEUS)
        )
        watch = Watch(cluster, operator, prometheus, emulator)
        watch.mark("operator ready")
        with explained(watch):
            assert operator.probe("/healthz") == 200
            assert operator.probe("/readyz") == 200
            check_healthy_first(watch, original)
            held = check_collapse(watch)
            check_delete_restores(watch, original, held)
            started = time.monotonic()
            assert operator.stop() == 0, operator.tail()
            assert time.monotonic() - started < 5.0, "SIGTERM took too long"
            watch.mark("operator exited 0 on SIGTERM")


def check_healthy_first(watch: Watch, original: dict[str, Any]) -> None:
    """kopf took the policy over (finalizer); after a full window the baseline is learned
    and nothing was changed: the budget allows more than the HPA's own maximum."""
    cluster = watch.cluster

    def finalized() -> bool | None:
        meta = cluster.api.get(policy_path())["metadata"]
        return True if meta.get("finalizers") else None

    watch.until(finalized, 30.0, "kopf's finalizer on the policy")

    def learned() -> bool | None:
        healthy = condition(status(cluster), "CacheHealthy") == (
            "True",
            ConditionReason.HIT_RATE_AT_BASELINE,
        )
        return True if healthy else None

    watch.until(learned, BASELINE_TIMEOUT_S, "CacheHealthy=True (a baseline learned)")
    current = status(cluster)
    assert condition(current, "MetricsAvailable") == ("True", ConditionReason.SIGNALS_READ)
    assert condition(current, "ScalingHeld") == ("False", ConditionReason.NOT_HELD)
    assert learned_baseline(current)["tokenHitRate"] > 0.6, current["learnedState"]
    assert current["signals"]["warmReplicas"] == PODS
    now = cluster.api.get(hpa_path())
    assert now["spec"] == original["spec"]
    assert ORIGINAL_ENVELOPE not in now["metadata"].get("annotations", {})


def check_collapse(watch: Watch) -> int:
    """The collapse, as ``kubectl describe`` and ``kubectl get events`` show it; returns
    the held maxReplicas."""
    cluster = watch.cluster

    suspected: list[str] = []

    def flipped() -> dict[str, Any] | None:
        current = status(cluster)
        if not suspected and condition(current, "CacheHealthy") == (
            "Unknown",
            ConditionReason.COLLAPSE_SUSPECTED,
        ):
            suspected.append(current["lastDecision"]["time"])
            watch.mark("CacheHealthy=Unknown (CollapseSuspected): a collapse is building")
        return (
            current
            if condition(current, "CacheHealthy") == ("False", Diagnosis.PREFIX_COLLAPSE)
            else None
        )

    collapsed = watch.until(flipped, COLLAPSE_TIMEOUT_S, "CacheHealthy=False (PrefixCollapse)")
    assert condition(collapsed, "ScalingHeld") == ("True", Hold.COLLAPSE)
    assert collapsed["state"] == Diagnosis.PREFIX_COLLAPSE
    assert collapsed["lastDecision"]["reason"] == Action.HELD_FOR_PREFIX_COLLAPSE
    alerts = collapsed["alerts"]
    assert [a["reason"] for a in alerts] == [Diagnosis.PREFIX_COLLAPSE], alerts
    watch.mark(f"alert: {alerts[0]['message']}")
    evidence = EVIDENCE.search(alerts[0]["message"])
    assert evidence is not None, alerts[0]["message"]
    before, after, windows, warm = evidence.groups()
    # Polled every 0.2 s against a 10 s interval: this is the confirming evaluation's status.
    assert (int(windows), int(warm)) == (3, PODS), alerts[0]["message"]
    assert float(after) < 0.5 * float(before), alerts[0]["message"]
    assert "likely cause: the prompts' shared prefixes changed" in alerts[0]["message"]

    warnings = [e for e in policy_events(cluster) if e["reason"] == Diagnosis.PREFIX_COLLAPSE]
    assert len(warnings) == 1, warnings
    assert warnings[0]["type"] == "Warning"
    assert warnings[0]["message"] == alerts[0]["message"]

    # The held level, from decide/envelope.py: the budget allows far more than 40
    # (budget_max_replicas = 40 = budget.maxReplicas, no budget hold); a confirmed collapse under
    # `onCollapse: Hold` recommends max(budget.minReplicas = 2, hold_level(...)), where
    # hold_level = ceil(pre-collapse replicas × max(1, req/s now / req/s then)). The
    # pre-collapse mark is the Deployment's spec.replicas (3) at the last evaluation whose
    # hit rate was still at baseline, and req/s has fallen since (the release dips the
    # traffic 12 → 10 req/s), so the growth factor is 1 and the level is exactly 3. A
    # collapse hold is exempt from the stabilization window, so 40 → 3 at once.
    mark = unpack_learned_state(collapsed["learnedState"])["preCollapse"]
    assert mark["replicas"] == PODS, mark
    rps_now = collapsed["signals"]["requestsPerSecond"]
    assert rps_now <= mark["requestsPerSecond"], (rps_now, mark)
    expected = max(2, math.ceil(PODS * max(1.0, rps_now / mark["requestsPerSecond"]) - 1e-9))
    assert expected == 3
    held = cluster.api.get(hpa_path())
    assert held["spec"]["maxReplicas"] == expected
    assert held["spec"]["minReplicas"] == HPA_MIN
    assert collapsed["lastDecision"]["maxReplicas"] == expected
    annotations = held["metadata"]["annotations"]
    assert json.loads(annotations[ORIGINAL_ENVELOPE])["maxReplicas"] == HPA_MAX
    assert annotations[MANAGED_BY] == f"{NAMESPACE}/{NAME}"
    return int(expected)


def check_delete_restores(watch: Watch, original: dict[str, Any], held: int) -> None:
    """``kubectl delete csp``: kopf's finalizer runs restore_on_delete, the HPA gets its
    own envelope back (every field as the user wrote it), the policy goes away."""
    cluster = watch.cluster
    assert cluster.api.get(hpa_path())["spec"]["maxReplicas"] == held  # still held
    assert delete(cluster, policy_path()) in (200, 202)

    def restored() -> bool | None:
        now = cluster.api.get(hpa_path())
        annotations = now["metadata"].get("annotations", {})
        back = now["spec"] == original["spec"]
        return True if back and not {ORIGINAL_ENVELOPE, MANAGED_BY} & set(annotations) else None

    watch.until(restored, RESTORE_TIMEOUT_S, "the HPA's original envelope")
    watch.until(lambda: policy_gone(cluster) or None, RESTORE_TIMEOUT_S, "the policy gone")
    final = cluster.api.get(hpa_path())
    assert final["spec"]["minReplicas"] == HPA_MIN
    assert final["spec"]["maxReplicas"] == HPA_MAX
    assert final["spec"]["metrics"][1]["pods"]["target"]["averageValue"] == HPA_TARGET
    assert final["metadata"]["labels"] == original["metadata"]["labels"]
    assert "restored" in watch.operator.output()
