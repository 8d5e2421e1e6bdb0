"""Sharding on a real API server: two cluster-wide ``cachescale run --policy-selector``
processes split the policies by a label, as two chart releases with ``policySelector``,
each shard's policy in a namespace of its own (sharding by namespace).

Each shard evaluates only its own policy, and the API server does the filtering: every
list and watch of policies the shards sent carries their selector (the audit log, when
the control plane is envtest's). Each shard follows its targets only in its policies'
namespaces: every list and watch of Deployments, HPAs and pods it sent is of one of
them, never cluster-wide (the audit log again, each shard known by its own token). A
policy relabelled from one shard to the other moves: the API server tells the first it
is gone (its loop stops, it never evaluates the policy again, and it stops following that
namespace, its last policy there gone) and the second that it is new (its loop starts,
and it follows that namespace from then on). The shards run standalone: each chart
release has its own peering object (tests/chart/test_chart_render.py), and
e2e/test_operator_peering.py shows one such object keeps exactly one pod active.

About 40 s: two operator starts, a first evaluation each (at its group's next slot of the 10 s
interval), the move, and one interval and a half of silence from the shard it left.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
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
TARGET_KINDS = {"deployments", "horizontalpodautoscalers", "pods"}
CREDENTIAL = "authentication.kubernetes.io/credential-id"
"""The audit log's mark of the token a request carried (one per shard)."""


def evaluations(operator: OperatorProcess, namespace: str, name: str) -> int:
    """How many evaluations of policy ``name`` this process logged."""
    return len(re.findall(rf"{re.escape(namespace)}/{re.escape(name)}: ", operator.output()))


@contextmanager
def another_namespace(cluster: Cluster) -> Iterator[str]:
    """A second fresh namespace, deleted afterwards (without waiting)."""
    name = f"cachescale-e2e-{uuid.uuid4().hex[:6]}"
    created = cluster.kubectl("create", "namespace", name)
    assert created.returncode == 0, created.stderr
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_two_shards_each_evaluate_and_follow_only_their_own_policies(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    started = time.time()
    # Nothing listens at this Prometheus and no target exists: every evaluation reports
    # why in the status and logs one line, which is all this test counts.
    closed = f"http://127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        where = {"blue": namespace, "green": stack.enter_context(another_namespace(cluster))}
        for shard in SHARDS:
            body = policy_body(
                shard,
                prometheus_url=closed,
                deployment_name=shard,
                hpa_name=shard,
                extra={"metrics": {"selector": {"namespace": where[shard]}}},
            )
            body["metadata"] = {"name": shard, "labels": {"shard": shard}}
            apply(cluster, where[shard], body)
        blue, green = (
            stack.enter_context(
                operator_process(
                    tmp_path / shard,
                    cluster.token_kubeconfig(  # a token each: the audit log tells them apart
                        tmp_path / f"{shard}.kubeconfig", release.namespace, release.service_account
                    ),
                    flags=("--policy-selector", f"shard={shard}", *LOOPBACK_PROMETHEUS),
                )
            )
            for shard in SHARDS
        )
        until(
            lambda: (
                True
                if evaluations(blue, where["blue"], "blue")
                and evaluations(green, where["green"], "green")
                else None
            ),
            "a first evaluation in each shard",
            INTERVAL_S * 2,
        )
        assert evaluations(blue, where["green"], "green") == 0, blue.tail()
        assert evaluations(green, where["blue"], "blue") == 0, green.tail()

        moved = cluster.kubectl(
            "label", "-n", where["green"], "csp", "green", "shard=blue", "--overwrite"
        )
        assert moved.returncode == 0, moved.stderr
        until(
            lambda: True if evaluations(blue, where["green"], "green") else None,
            "the moved policy evaluated by its new shard",
            INTERVAL_S * 2,
        )
        left = evaluations(green, where["green"], "green")
        time.sleep(INTERVAL_S * 1.5)  # past the next round the old loop would have run
        assert evaluations(green, where["green"], "green") == left, green.tail()
        assert f"{where['green']}/green left this operator's watch" in green.output()
        assert f"{where['green']}: no longer following its targets" in green.output()
        assert f"{where['green']}: following its targets" in blue.output()
        assert evaluations(blue, where["blue"], "blue") >= 2, "the first policy still served"
        for operator in (blue, green):
            assert "Traceback" not in operator.output(), operator.tail()

    if cluster.plane is not None:
        user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
        reads = _reads(cluster, user, started)
        shard_of = _shards_by_token(reads)
        assert sorted(shard_of.values()) == sorted(SHARDS), shard_of
        followed: dict[str, set[str | None]] = {shard: set() for shard in SHARDS}
        for event in reads:
            ref = event.get("objectRef", {})
            if ref.get("resource") in TARGET_KINDS:
                followed[shard_of[_token(event)]].add(ref.get("namespace"))
        # Blue followed its own namespace, then green's with the moved policy; green only
        # its own; neither ever listed or watched a target cluster-wide.
        assert followed == {"blue": set(where.values()), "green": {where["green"]}}, followed


def _reads(cluster: Cluster, user: str, after: float) -> list[dict[str, Any]]:
    """Every list and watch ``user`` sent since ``after`` (its policies' and its targets')."""
    assert cluster.plane is not None
    log = cluster.plane.directory / "audit.log"
    found = []
    for line in log.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if (
            event.get("verb") in ("list", "watch")
            and event.get("user", {}).get("username") == user
            and datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp() >= after
        ):
            found.append(event)
    return found


def _token(event: dict[str, Any]) -> str:
    """The token a request carried (its ``JTI=...``)."""
    return ",".join(event["user"].get("extra", {}).get(CREDENTIAL, []))


def _shards_by_token(reads: list[dict[str, Any]]) -> dict[str, str]:
    """Each token's shard, from the selector its lists and watches of policies carried;
    every one of them carried one."""
    shards: dict[str, str] = {}
    for event in reads:
        if event.get("objectRef", {}).get("resource") != "cachescalingpolicies":
            continue
        uri = str(event.get("requestURI", ""))
        assert "labelSelector=" in uri, uri
        selector = unquote_plus(uri.split("labelSelector=", 1)[1].split("&", 1)[0])
        shards.setdefault(_token(event), selector.removeprefix("shard="))
        assert shards[_token(event)] == selector.removeprefix("shard="), uri
    return shards
