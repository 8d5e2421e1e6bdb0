"""A hostile tenant's Prometheus cannot exhaust the operator (docs/security.md, Bounded
reads): on a real API server, the operator running as the chart's ServiceAccount, a policy
whose Prometheus answers 300 MB is refused at the byte cap with the operator's peak RSS
far under 400 MiB, and one whose Prometheus trickles an endless answer leaves no thread
and no connection behind, evaluation after evaluation and once the policy is deleted.

The servers are real HTTP on loopback (tests/gather/bounded_servers.py); the operator's
memory and threads are read from its own ``/proc/<pid>/status``.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Any

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, get, until
from e2e.operators import evaluated_again
from e2e.serving import APP, create_stack
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import OperatorProcess, run_operator
from tests.gather.bounded_servers import HostileServer, hostile_server, huge, trickle

MIB = 1024 * 1024
DEADLINE_S = 10
"""The operator's deadline for one evaluation's reads."""


def proc_status(operator: OperatorProcess, field: str) -> int:
    """A number from the operator's ``/proc/<pid>/status`` (kB fields in bytes)."""
    for line in Path(f"/proc/{operator.process.pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            number, *unit = value.split()
            return int(number) * (1024 if unit == ["kB"] else 1)
    raise AssertionError(f"no {field} in /proc/{operator.process.pid}/status")


def sockets(operator: OperatorProcess, port: int) -> int:
    """The operator's open TCP connections to ``port`` on loopback (its fds' socket
    inodes matched in ``/proc/net/tcp``): the API server's connections come and go with
    watches and Events, so only the hostile server's are counted."""
    inodes = set()
    for fd in Path(f"/proc/{operator.process.pid}/fd").iterdir():
        with suppress(OSError):  # closed meanwhile
            link = fd.readlink().as_posix()
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        rows = Path(f"/proc/{operator.process.pid}/net/{table}").read_text().splitlines()[1:]
        for row in rows:
            fields = row.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            count += remote_port == port and fields[9] in inodes
    return count


def start_policy(cluster: Cluster, namespace: str, url: str) -> None:
    body = policy_body(
        APP,
        prometheus_url=url,
        extra={"metrics": {"selector": {"namespace": namespace, "model_name": "m"}}},
    )
    body["metadata"] = {"name": APP}
    apply(cluster, namespace, body)


def metrics_condition(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    found = get(cluster, "csp", APP, "-n", namespace) or {}
    for entry in found.get("status", {}).get("conditions", []):
        if entry["type"] == "MetricsAvailable":
            return dict(entry)
    return None


def operator_for(
    cluster: Cluster, release: Release, namespace: str, server: HostileServer, workdir: Path
) -> AbstractContextManager[OperatorProcess]:
    """The operator as the chart's ServiceAccount, allowed to read ``server`` only."""
    kubeconfig = cluster.token_kubeconfig(
        workdir / "operator.kubeconfig", release.namespace, release.service_account
    )
    return run_operator(workdir, kubeconfig, namespace, ("--allowed-prometheus-url", server.url))


def test_a_300_mb_answer_is_refused_at_the_cap_within_the_memory_bound(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    create_stack(cluster, namespace, "m", 1)
    with (
        hostile_server(huge(300_000_000)) as server,
        operator_for(cluster, release, namespace, server, tmp_path) as operator,
    ):
        started_peak = proc_status(operator, "VmHWM")
        start_policy(cluster, namespace, server.url)

        def refused() -> dict[str, Any] | None:
            found = metrics_condition(cluster, namespace)
            message = (found or {}).get("message", "")
            return found if "over the size limit" in message else None

        condition = until(refused, "MetricsAvailable=False, over the size limit", 90)
        for _ in range(2):  # two more evaluations, each refused again
            evaluated_again(operator, namespace, APP)
        peak = proc_status(operator, "VmHWM")
        kinds = operator.samples("cachescale_evaluation_errors_total")
    assert condition["status"] == "False"
    assert "prometheus.maxResponseBytes" in condition["message"]
    assert server.accepted >= 2
    assert any(
        ("kind", "PrometheusResponseTooLarge") in labels and value >= 1
        for labels, value in kinds.items()
    ), kinds
    print(f"operator peak RSS {started_peak / MIB:.0f} -> {peak / MIB:.0f} MiB")
    assert peak < 400 * MIB


def test_an_endless_trickle_leaves_no_thread_or_connection_behind(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    create_stack(cluster, namespace, "m", 1)
    with (
        hostile_server(trickle(4096, 0.5)) as server,
        operator_for(cluster, release, namespace, server, tmp_path) as operator,
    ):
        start_policy(cluster, namespace, server.url)
        until(lambda: server.accepted >= 2 or None, "a second evaluation's query", 60)
        # From here on every pool the operator keeps has its threads: count what grows.
        threads, socks = proc_status(operator, "Threads"), sockets(operator, server.port)
        first = server.accepted
        until(lambda: server.accepted >= first + 5 or None, "five more evaluations", 150)
        grown = proc_status(operator, "Threads") - threads, sockets(operator, server.port) - socks
        most_open = server.open_connections
        deleted = cluster.kubectl("delete", "csp", APP, "-n", namespace, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        time.sleep(DEADLINE_S + 2)
        after = proc_status(operator, "Threads") - threads, sockets(operator, server.port) - socks
        still_connected = sockets(operator, server.port)
        left_open = server.settle(0, 1.0)
    print(f"threads/sockets grown over five evaluations {grown}, after delete {after}")
    assert most_open <= 1  # only the evaluation in flight, never one per evaluation
    assert left_open == 0
    assert max(grown) <= 1
    assert max(after) <= 0
    assert still_connected == 0
