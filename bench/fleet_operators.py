"""The ``cachescale run`` processes ``bench_fleet`` measures, and the faults it causes them.

Each is the real process (``e2e/operators.py``), standalone, admin kubeconfig, its
metrics and health on ports of its own, allowed both of the bench's Prometheus URLs
(:data:`BOTH_PROMETHEUS_NAMES`):

* **one operator** (``--shards 1``): ``--namespace llm`` with one namespace, every
  namespace (as an operator serving a cluster runs) with more; its log is
  ``DIR/operator/operator.log``, and ``DIR/restarted/operator.log`` after ``--then
  restart``;
* **K shards** (``--shards K``): K cluster-wide processes, shard ``I`` started with
  ``--policy-selector shard=I``, the label each policy carries (``Shape.shard``: its
  namespace's index modulo K, so every namespace is in one shard), as docs/install.md's
  Sharding splits a fleet by namespace. A cluster-wide label shard follows its targets
  only in its own policies' namespaces (``controller/kube/target_informers.py``), so each
  shard lists and watches about 1/K of the cluster. Logs: ``DIR/shard-I/operator.log``.

Each process's pid is named (:func:`process_names`) for the bench's CPU readings.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.fleet_counts import INTERVAL_S
from bench.fleet_rig import Kube, api_requests, peak_rss_mib
from bench.fleet_shape import SHARD_LABEL, Shape
from e2e.operators import operator_process
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess

BOTH_PROMETHEUS_NAMES = (
    *LOOPBACK_PROMETHEUS,
    "--allowed-prometheus-url",
    r"re:http://localhost:[0-9]+",
)
"""The operator's allow list: the one Prometheus by both its URLs (half the policies name
``localhost``, and so does the slow proxy's chunk); without the second, every such
policy ends in ``MetricsURLNotAllowed``."""
KOPF_PATCHES = "PATCH cachescalingpolicies"
"""kopf's own writes to a policy (its finalizer; no diff base): none once steady."""
DISRUPTIONS = ("restart", "relist")
"""``--then restart``: the operator is killed (SIGKILL) and started again (one operator
only). ``--then relist``: the API server is killed, etcd's history compacted, the API
server started again, so every watch must list again (410 Gone)."""


def process_names(count: int) -> list[str]:
    """The names of ``count`` operator processes in the bench's CPU readings."""
    return ["operator"] if count == 1 else [f"shard {i}" for i in range(count)]


def operator_pids(operators: list[OperatorProcess]) -> dict[str, int]:
    """Each operator process's pid, by its name (:func:`process_names`)."""
    names = process_names(len(operators))
    return {name: o.process.pid for name, o in zip(names, operators, strict=True)}


def peak_rss(operators: list[OperatorProcess]) -> list[float]:
    """Each operator process's peak RSS (MiB); raises if one exited."""
    for operator in operators:
        if operator.process.poll() is not None:
            raise RuntimeError(f"cachescale run exited:\n{operator.tail()}")
    return [peak_rss_mib(operator.process.pid) for operator in operators]


def watched(shape: Shape) -> tuple[str, ...]:
    """One operator's ``--namespace`` flags: the one namespace, or none (every namespace,
    as an operator serving a cluster runs) when the fleet spans several."""
    return tuple(shape.all_namespaces()) if shape.namespaces == 1 else ()


def start_operators(
    stack: ExitStack,
    workdir: Path,
    kubeconfig: Path,
    shape: Shape,
    flags: tuple[str, ...] = (),
) -> list[OperatorProcess]:
    """One operator, or ``shape.shards`` shards, each also given ``flags``; each stopped
    when ``stack`` closes."""
    if shape.shards == 1:
        started = operator_process(
            workdir / "operator",
            kubeconfig,
            namespaces=watched(shape),
            flags=(*BOTH_PROMETHEUS_NAMES, *flags),
        )
        return [stack.enter_context(started)]
    return [
        stack.enter_context(
            operator_process(
                workdir / f"shard-{i}",
                kubeconfig,
                flags=("--policy-selector", f"{SHARD_LABEL}={i}", *BOTH_PROMETHEUS_NAMES, *flags),
            )
        )
        for i in range(shape.shards)
    ]


def wait_for_first_pass(kube: Kube, limit_s: float) -> float:
    """Until an interval passes without kopf patching a policy (at most ``limit_s``): a
    fleet created before its operator gets each policy patched once, and a window
    measured during that pass measures the pass. Returns when it ended (epoch seconds)."""
    deadline = time.time() + limit_s
    last = api_requests(kube).get(KOPF_PATCHES, 0.0)
    while time.time() < deadline:
        time.sleep(INTERVAL_S)
        now = api_requests(kube).get(KOPF_PATCHES, 0.0)
        if now == last:
            return time.time() - INTERVAL_S
        last = now
    return time.time()


def disrupt(
    what: str,
    plane: Any,
    stack: ExitStack,
    workdir: Path,
    operators: list[OperatorProcess],
    shape: Shape,
    flags: tuple[str, ...] = (),
) -> list[OperatorProcess]:
    """Cause the fault; the operator processes serving afterwards (a restarted one given
    ``flags`` too)."""
    if what == "relist":
        plane.kill("kube-apiserver")
        plane.compact_etcd()
        plane.restart("kube-apiserver")
        return operators
    [operator] = operators
    operator.process.kill()
    operator.process.wait()
    restarted = operator_process(
        workdir / "restarted",
        plane.kubeconfig,
        namespaces=watched(shape),
        flags=(*BOTH_PROMETHEUS_NAMES, *flags),
    )
    return [stack.enter_context(restarted)]
