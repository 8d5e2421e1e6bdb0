"""Point 7: two operator replicas with kopf peering, as the chart runs them.

The session's release is upgraded to ``replicaCount=2``: the chart then creates the
ClusterKopfPeering and grants access to it. Two ``cachescale run --peering <release>``
processes (cluster-wide, like the chart's pods) then run as the chart's ServiceAccount
against the same API server. The first, with the lower ``--priority``, acts alone; once
the second joins it pauses, and exactly one evaluates: counted from each process's log
and from the API server's audit log of status writes. When the active one is killed
(``kill -9``: no goodbye in the peering object), the other takes over once the dead
peer's record expires: within kopf's peering lifetime (60 s) plus one evaluation
interval (docs/install.md, Leader election).
"""

from __future__ import annotations

import re
import time
from contextlib import ExitStack
from pathlib import Path

from e2e.harness.cluster import Cluster
from e2e.harness.release import CHART, Release, wait_flags
from e2e.kube_helpers import apply, get, until
from e2e.operators import operator_process
from e2e.serving import APP, create_stack
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess
from tests.prometheus_fixture import free_port

INTERVAL_S = 10.0
PEERING_LIFETIME_S = 60.0
TAKEOVER_LIMIT_S = PEERING_LIFETIME_S + 2 * INTERVAL_S


def evaluations(operator: OperatorProcess, namespace: str) -> int:
    """How many evaluations of the policy this process logged."""
    return len(re.findall(rf"{re.escape(namespace)}/{APP}: ", operator.output()))


def test_two_replicas_one_acts_and_the_other_takes_over(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    where = ("-n", release.namespace)
    upgraded = cluster.helm(
        "upgrade",
        release.name,
        str(CHART),
        *where,
        "--reuse-values",
        "--set",
        "replicaCount=2",
        *wait_flags(cluster),
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert "2 operator pods elect an active one" in upgraded.stdout, "NOTES say so"
    try:
        assert get(cluster, "clusterkopfpeering", release.name) is not None
        kubeconfig = cluster.token_kubeconfig(
            tmp_path / "operator.kubeconfig", release.namespace, release.service_account
        )
        create_stack(cluster, namespace, "peering-model", 2)
        # Nothing listens at this Prometheus: every round reports MetricsAvailable=False,
        # a status write per evaluation, and nothing else.
        body = policy_body(
            APP,
            prometheus_url=f"http://127.0.0.1:{free_port()}",
            extra={"metrics": {"selector": {"namespace": namespace}}},
        )
        body["metadata"] = {"name": APP}
        apply(cluster, namespace, body)
        with ExitStack() as stack:
            # The first peer acts alone; a second with a higher priority joins, and the
            # first must pause: its own watch of the peering object stops its scheduler.
            first = stack.enter_context(
                operator_process(
                    tmp_path / "low",
                    kubeconfig,
                    peering=release.name,
                    flags=("--priority", "10", *LOOPBACK_PROMETHEUS),
                )
            )
            until(
                lambda: True if evaluations(first, namespace) else None,
                "the first peer's evaluation, alone",
                60,
            )
            second = stack.enter_context(
                operator_process(
                    tmp_path / "high",
                    kubeconfig,
                    peering=release.name,
                    flags=("--priority", "20", *LOOPBACK_PROMETHEUS),
                )
            )
            peers = [first, second]

            def both_listed() -> bool | None:
                peering = get(cluster, "clusterkopfpeering", release.name) or {}
                return True if len(peering.get("status") or {}) >= 2 else None

            until(both_listed, "both peers in the ClusterKopfPeering", 60)
            until(
                lambda: True if "peering: paused in favour of" in first.output() else None,
                "the first peer's pause",
                30,
            )
            time.sleep(1.0)  # an evaluation under way at the pause ends
            start = [evaluations(p, namespace) for p in peers]

            def three_more() -> bool | None:
                done = sum(evaluations(p, namespace) for p in peers)
                return True if done >= sum(start) + 3 else None

            until(three_more, "three more evaluations", 90)
            grown = [evaluations(p, namespace) - n for p, n in zip(peers, start, strict=True)]
            assert grown[0] == 0, f"the paused peer evaluated: low/high {grown}"
            assert grown[1] >= 3, f"evaluations low/high once paired: {grown}"
            active, standby = second, first
            counts = [grown[1], grown[0]]
            if cluster.plane is not None:
                user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
                writes = cluster.plane.writes(user, "cachescalingpolicies/status", namespace)

                # An evaluation logs its line just after its status write, so a write read
                # here may be a moment ahead of its line: no more writes than evaluations,
                # once the lines have had that moment.
                def lines() -> int | None:
                    total = sum(evaluations(p, namespace) for p in peers)
                    return total if total >= len(writes) else None

                total = until(lines, f"a logged evaluation for each of {len(writes)} writes", 1)
                assert evaluations(standby, namespace) == start[0], "standby evaluated"
                print(
                    f"evaluations active/standby once both peered {counts}; status writes "
                    f"(audit log) {len(writes)} for {total} evaluations in all"
                )
            active.process.kill()
            active.process.wait()
            killed, before = time.monotonic(), evaluations(standby, namespace)
            until(
                lambda: True if evaluations(standby, namespace) > before else None,
                "the standby's first evaluation",
                TAKEOVER_LIMIT_S + 30,
            )
            takeover = time.monotonic() - killed
            print(f"takeover after kill -9: {takeover:.1f}s")
            assert takeover <= TAKEOVER_LIMIT_S, takeover
            assert "Traceback" not in standby.output()
    finally:
        cluster.helm(
            "upgrade",
            release.name,
            str(CHART),
            *where,
            "--reuse-values",
            "--set",
            "replicaCount=1",
            *wait_flags(cluster),
        )
