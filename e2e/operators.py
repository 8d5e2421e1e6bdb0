"""``cachescale run`` processes for the e2e suite: standalone or peered, scoped or not.

tests/controller/process_fixture.py starts one standalone operator scoped to one
namespace; the e2e suite also needs the chart's other shapes: several replicas sharing a
kopf peering object (``--peering``), serving every namespace (no ``--namespace``), as
the chart runs them with ``replicaCount > 1``. Both go through ``start_operator``: same
console script, same probes, same log
file and the same :class:`OperatorProcess` handle.

:func:`evaluated_again` is how a test waits for "one more evaluation" of a policy: on the
operator's own gauge of each policy's last evaluation, not on a guess of the interval.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from e2e.kube_helpers import until
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


def evaluated_again(
    operator: OperatorProcess, namespace: str, *names: str, timeout_s: float = 60.0
) -> None:
    """Wait until ``operator`` has finished an evaluation of each policy ``names`` (in
    ``namespace``) that began after this call. Its gauge of a policy's last evaluation
    holds when that evaluation began and is set once it has ended, refused ones included."""
    after = time.time()

    def done() -> bool | None:
        began = [operator.last_evaluation(namespace, name) for name in names]
        return True if all(at is not None and at > after for at in began) else None

    until(done, f"one more evaluation of {', '.join(names)} in {namespace}", timeout_s)
