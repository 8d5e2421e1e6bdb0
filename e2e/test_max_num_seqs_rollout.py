"""Point 5: a ``--max-num-seqs`` change goes through a real rollout.

The Deployment starts at ``--max-num-seqs 512``, outside the policy's 8..64, so the
operator's first evaluation clamps it to 64 (decide/batching.py, ``Clamped``): it patches
the engine container's args, the real Deployment controller creates a new ReplicaSet, and
the node stand-in readies its pods while the old ones go. The emulated fleet restarts at
the same moment (the scenario's ``rolling_restart``): its new engines start with empty
caches, and Prometheus scrapes them under the new pods' names as they appear.

Asserted: exactly one args patch (the API server's audit log) and one new ReplicaSet;
while the new pods warm up the policy reports a cold fleet and raises no collapse; no
second change inside the 30-minute cooldown.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, events_for, get, ready_pods, until
from e2e.operators import operator_process
from e2e.serving import APP, Metrics, create_stack, emulated_metrics
from e2e.tenancy import grant_enforce
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS
from tests.prometheus_fixture import fixed_fleet_scenario

MODEL = "llama-3-8b"
PODS = 2
SPEED = 4.0
RESTART_AT_WALL_S = 80.0
"""When the emulated fleet restarts: about when the operator first may change anything
(setup ~15 s, then one full 1m window of data)."""
WARMUP_S = 30
"""The policy's podWarmupSeconds: the first pods are warm by the time of the change, the
new ones are not."""
WATCH_S = 30.0
"""How long the rollout is watched after the change: three evaluations."""
SHAPE = {
    "model": {"layers": 32, "kvHeads": 8, "headDim": 128, "kvDtypeBytes": 2, "weightsGiB": 16},
    "gpu": {"memoryGiB": 80, "gpuMemoryUtilization": 0.9},
}


def scenario() -> dict[str, Any]:
    body = fixed_fleet_scenario(replicas=PODS, duration_s=240 * SPEED)
    body["perturbations"] = [{"kind": "rolling_restart", "at_s": RESTART_AT_WALL_S * SPEED}]
    return body


def follow_pods(cluster: Cluster, namespace: str, metrics: Metrics) -> None:
    """Label emulated engine N with real pod N, both in order of age (oldest first)."""
    engines = sorted(
        metrics.emulator.targets(), key=lambda group: int(group["labels"]["pod"].rsplit("-", 1)[1])
    )
    pods = sorted(
        ready_pods(cluster, namespace, f"app={APP}"),
        key=lambda pod: (pod["metadata"]["creationTimestamp"], pod["metadata"]["name"]),
    )
    ports = [int(group["targets"][0].rsplit(":", 1)[1]) for group in engines]
    names = [pod["metadata"]["name"] for pod in pods]
    pairs = list(zip(ports, names, strict=False))
    metrics.point([(port, name) for port, name in pairs])


def test_a_max_num_seqs_change_rolls_out_once_and_is_not_a_collapse(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    grant_enforce(cluster, release, namespace)  # Enforce: rbac.enforceNamespaces
    _, pods = create_stack(cluster, namespace, MODEL, PODS, max_num_seqs=512)
    with (
        emulated_metrics(tmp_path, namespace, MODEL, scenario(), pods, speed=SPEED) as metrics,
        operator_process(
            tmp_path / "operator", kubeconfig, (namespace,), flags=LOOPBACK_PROMETHEUS
        ) as operator,
    ):
        body = policy_body(
            APP,
            prometheus_url=metrics.prometheus.url,
            extra={
                "metrics": {"selector": {"namespace": namespace, "model_name": MODEL}},
                "budget": {"gpuSecondsPer1kRequests": 100_000.0},
                "cache": {"podWarmupSeconds": WARMUP_S},
                "batching": {
                    "manageMaxNumSeqs": True, "minNumSeqs": 8, "maxNumSeqs": 64,
                    "cooldown": "30m", **SHAPE,
                },
            },
        )  # fmt: skip
        body["metadata"] = {"name": APP}
        apply(cluster, namespace, body)
        user = f"system:serviceaccount:{release.namespace}:{release.service_account}"

        def args() -> list[str]:
            deployment = get(cluster, "deployment", APP, "-n", namespace)
            return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

        def changed() -> bool | None:
            follow_pods(cluster, namespace, metrics)
            return True if "64" in args() else None

        def story() -> str:
            status = get(cluster, "csp", APP, "-n", namespace).get("status", {})
            brief = {k: status.get(k) for k in ("state", "conditions", "lastDecision")}
            return f"{json.dumps(brief, indent=1)}\n{operator.tail(30)}"

        try:
            until(changed, "the operator to set --max-num-seqs 64", 120)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{story()}") from None
        changed_at = time.monotonic()
        before = get(cluster, "csp", APP, "-n", namespace)["status"]
        assert before["state"] != "ColdFleet", "the first pods are warm before the change"
        decision = before["lastDecision"]
        print(f"the change: {decision['reason']}: {decision['message']}")
        assert args()[args().index("--max-num-seqs") + 1] == "64"
        states: set[str] = set()
        cold_seen: list[str] = []
        while time.monotonic() - changed_at < WATCH_S:
            follow_pods(cluster, namespace, metrics)
            status = get(cluster, "csp", APP, "-n", namespace).get("status", {})
            states.add(str(status.get("state")))
            record = status.get("lastDecision") or {}
            if record.get("diagnosis") == "ColdFleet":
                cold_seen.append(record["message"])
            healthy = [c for c in status.get("conditions", []) if c["type"] == "CacheHealthy"]
            assert not healthy or healthy[0]["status"] != "False", healthy
            time.sleep(1.0)
        print(f"states seen during the rollout: {sorted(states)}")
        # The rollout is real: a second ReplicaSet, its pods Ready, the old ones gone.
        sets = get(cluster, "replicasets", "-n", namespace, "-l", f"app={APP}")["items"]
        assert len(sets) == 2, [s["metadata"]["name"] for s in sets]
        current = ready_pods(cluster, namespace, f"app={APP}")
        assert len(current) == PODS
        assert not set(pods) & {p["metadata"]["name"] for p in current}, "every pod replaced"
        # Reported as a cold fleet, never as a collapse; changed once, nothing inside cooldown.
        assert "ColdFleet" in states or cold_seen, (states, operator.tail())
        warnings = events_for(cluster, namespace, "CacheScalingPolicy", APP)
        assert not [e for e in warnings if e["reason"] == "PrefixCollapse"], warnings
        if cluster.plane is not None:
            patches = cluster.plane.writes(user, "deployments", namespace)
            assert len(patches) == 1, [p["requestReceivedTimestamp"] for p in patches]
        assert "Traceback" not in operator.output()
