"""Sharding on a real API server: two ``cachescale run --policy-selector`` processes split
the policies of one namespace by a label, as two chart releases with ``policySelector``.

Each shard evaluates only its own policy, and the API server does the filtering: every
list and watch of policies the shards sent carries their selector (the audit log, when
the control plane is envtest's). A policy relabelled from one shard to the other moves:
the API server tells the first it is gone (its loop stops, it never evaluates the policy
again) and the second that it is new (its loop starts). The shards run standalone: each
chart release has its own peering object (tests/chart/test_chart_render.py), and
e2e/test_operator_peering.py shows one such object keeps exactly one pod active.

About 40 s: two operator starts, a first evaluation each (at its group's next slot of the 10 s
interval), the move, and one interval and a half of silence from the shard it left.
"""

from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import unquote_plus

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, until
from e2e.operators import operator_process
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess
from tests.prometheus_fixture import free_port

INTERVAL_S = 10.0
SHARDS = ("blue", "green")


def evaluations(operator: OperatorProcess, namespace: str, name: str) -> int:
    """How many evaluations of policy ``name`` this process logged."""
    return len(re.findall(rf"{re.escape(namespace)}/{re.escape(name)}: ", operator.output()))


def test_two_shards_each_evaluate_only_their_own_policies(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    # Nothing listens at this Prometheus and no target exists: every evaluation reports
    # why in the status and logs one line, which is all this test counts.
    closed = f"http://127.0.0.1:{free_port()}"
    for shard in SHARDS:
        body = policy_body(
            shard,
            prometheus_url=closed,
            deployment_name=shard,
            hpa_name=shard,
            extra={"metrics": {"selector": {"namespace": namespace}}},
        )
        body["metadata"] = {"name": shard, "labels": {"shard": shard}}
        apply(cluster, namespace, body)
    with ExitStack() as stack:
        blue, green = (
            stack.enter_context(
                operator_process(
                    tmp_path / shard,
                    kubeconfig,
                    namespaces=(namespace,),
                    flags=("--policy-selector", f"shard={shard}", *LOOPBACK_PROMETHEUS),
                )
            )
            for shard in SHARDS
        )
        until(
            lambda: (
                True
                if evaluations(blue, namespace, "blue") and evaluations(green, namespace, "green")
                else None
            ),
            "a first evaluation in each shard",
            INTERVAL_S * 2,
        )
        assert evaluations(blue, namespace, "green") == 0, blue.tail()
        assert evaluations(green, namespace, "blue") == 0, green.tail()

        moved = cluster.kubectl(
            "label", "-n", namespace, "cachescalingpolicy", "green", "shard=blue", "--overwrite"
        )
        assert moved.returncode == 0, moved.stderr
        until(
            lambda: True if evaluations(blue, namespace, "green") else None,
            "the moved policy evaluated by its new shard",
            INTERVAL_S * 2,
        )
        left = evaluations(green, namespace, "green")
        time.sleep(INTERVAL_S * 1.5)  # past the next round the old loop would have run
        assert evaluations(green, namespace, "green") == left, green.tail()
        assert f"{namespace}/green left this operator's watch" in green.output()
        assert evaluations(blue, namespace, "blue") >= 2, "the first policy still served"
        for operator in (blue, green):
            assert "Traceback" not in operator.output(), operator.tail()

    if cluster.plane is not None:
        user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
        selectors = {
            unquote_plus(request.split("labelSelector=", 1)[1].split("&", 1)[0])
            if "labelSelector=" in request
            else None
            for request in _policy_reads(cluster, namespace, user)
        }
        assert selectors == {"shard=blue", "shard=green"}, selectors


def _policy_reads(cluster: Cluster, namespace: str, user: str) -> list[str]:
    """The request URIs of every list and watch of policies in ``namespace`` by ``user``."""
    assert cluster.plane is not None
    log = cluster.plane.directory / "audit.log"
    uris = []
    for line in log.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        ref = event.get("objectRef", {})
        if (
            event.get("verb") in ("list", "watch")
            and ref.get("resource") == "cachescalingpolicies"
            and ref.get("namespace") == namespace
            and event.get("user", {}).get("username") == user
            and event.get("stage") in (None, "ResponseComplete", "ResponseStarted")
        ):
            uris.append(str(event.get("requestURI", "")))
    return uris
