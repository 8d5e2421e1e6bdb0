"""``cachescale run`` processes for the e2e suite: standalone or peered, scoped or not.

tests/controller/process_fixture.py starts one standalone operator scoped to one
namespace; the e2e suite also needs the chart's other shapes: several replicas sharing a
kopf peering object (``--peering``), serving every namespace (no ``--namespace``), as
the chart runs them with ``replicaCount > 1``. Same console script, same probes, same log
file and the same :class:`OperatorProcess` handle.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from process_fixture import IN_CLUSTER_ENV, OperatorProcess, cachescale_command

from prometheus_fixture import free_port_block


@contextmanager
def operator_process(
    workdir: Path,
    kubeconfig: Path,
    namespaces: tuple[str, ...] = (),
    peering: str | None = None,
    flags: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    """Start ``cachescale run`` (killed on the way out, whatever happened)."""
    health_port = free_port_block(1)
    command = [
        *cachescale_command(),
        "run",
        "--kubeconfig", str(kubeconfig),
        "--metrics-port", "0",
        "--health-port", str(health_port),
        *(("--peering", peering) if peering else ("--standalone",)),
        *(arg for namespace in namespaces for arg in ("--namespace", namespace)),
        *flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in (*IN_CLUSTER_ENV, "KUBECONFIG")}
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "operator.log"
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=env)
    operator = OperatorProcess(process, log, health_port)
    try:
        operator.wait_ready()
        yield operator
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def chart_flags(deployment: dict[str, Any]) -> tuple[str, ...]:
    """The chart's own ``cachescale run`` flags that shape what the operator may touch
    (``--no-scanning``), read from its installed Deployment: the process under test runs
    with the flags the chart gives its pods."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return tuple(arg for arg in container["args"] if arg == "--no-scanning")
