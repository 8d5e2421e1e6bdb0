"""``cachescale run`` processes for the e2e suite: standalone or peered, scoped or not.

tests/controller/process_fixture.py starts one standalone operator scoped to one
namespace; the e2e suite also needs the chart's other shapes: several replicas sharing a
kopf peering object (``--peering``), serving every namespace (no ``--namespace``), as
the chart runs them with ``replicaCount > 1``. Both go through ``start_operator``: same
console script, same probes, same log
file and the same :class:`OperatorProcess` handle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tests.controller.process_fixture import OperatorProcess, start_operator


def operator_process(
    workdir: Path,
    kubeconfig: Path,
    namespaces: tuple[str, ...] = (),
    peering: str | None = None,
    flags: tuple[str, ...] = (),
) -> AbstractContextManager[OperatorProcess]:
    """Start ``cachescale run`` (killed on the way out, whatever happened)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return start_operator(
        workdir,
        kubeconfig,
        *(("--peering", peering) if peering else ("--standalone",)),
        *(arg for namespace in namespaces for arg in ("--namespace", namespace)),
        *flags,
    )


def chart_flags(deployment: dict[str, Any]) -> tuple[str, ...]:
    """The chart's own ``cachescale run`` flags that shape what the operator may touch
    (``--no-scanning``), read from its installed Deployment: the process under test runs
    with the flags the chart gives its pods."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return tuple(arg for arg in container["args"] if arg == "--no-scanning")
