"""End-to-end tests on a real Kubernetes API server, and a clean skip without one.

The cluster is the one KUBECONFIG points at (kind, a real cluster) or, without it, a
control plane started for the session from the envtest binaries in KUBEBUILDER_ASSETS
(e2e/harness/), with a node stand-in that runs the pods. Neither: every test skips with
the reason. `make e2e` runs them as a pytest session of their own (all on one pytest-xdist
worker, so one control plane serves them: e2e/scheduling.py); `make test` runs that session
beside the unit tests' one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.cluster import Cluster, session_cluster, tool, why_no_cluster
from e2e.harness.release import Release, install_cycle, uninstall
from e2e.image import start_build
from e2e.third_party_crds import KEDA, PROMETHEUS_OPERATOR
from tests.tools import require_tool

E2E = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every e2e test, with the reason, when there is no cluster to talk to."""
    reason = why_no_cluster()
    if reason:
        for item in items:
            if Path(str(item.fspath)).is_relative_to(E2E):
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start building the operator image when this worker begins its e2e tests and
    e2e/test_image.py is among them: the build overlaps the tests that wait on the cluster."""
    if any(Path(str(test.fspath)).name == "test_image.py" for test in item.session.items):
        start_build()


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called under `pytest -n`
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile`` (`make e2e`), keep the e2e suite on one worker, so the
    session starts one cluster (e2e/scheduling.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from e2e.scheduling import OneClusterScheduling  # imports xdist, there only under -n

    return OneClusterScheduling(config, log)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The session's cluster: $KUBECONFIG's, or an envtest control plane with a node
    stand-in, stopped (every process, its temp dir) when the session ends.

    KUBECONFIG is pointed at it for the session, so plain `kubectl` calls reach it too.
    """
    previous = os.environ.get("KUBECONFIG")
    with session_cluster() as found:
        os.environ["KUBECONFIG"] = str(found.kubeconfig)
        try:
            yield found
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    name = f"cachescale-e2e-{uuid.uuid4().hex[:6]}"
    created = cluster.kubectl("create", "namespace", name)
    assert created.returncode == 0, created.stderr
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="session")
def release(cluster: Cluster) -> Iterator[Release]:
    """The chart installed with its default values after a full install → upgrade →
    uninstall → install cycle (each step recorded); uninstalled when the session ends."""
    require_tool(tool("helm") is not None, "helm is not in .tools/bin (make tools) nor on PATH")
    installed = install_cycle(cluster)
    yield installed
    uninstall(cluster, installed)


def install_crds(cluster: Cluster, path: Path) -> None:
    """Apply the CRDs in ``path`` (server-side, as large upstream CRDs are applied) and wait
    until each is served."""
    applied = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(path), "-o", "name"
    )
    assert applied.returncode == 0, applied.stderr
    for name in applied.stdout.split():
        ready = cluster.kubectl("wait", "--for=condition=Established", name, "--timeout=30s")
        assert ready.returncode == 0, ready.stderr


@pytest.fixture(scope="session")
def keda_crds(cluster: Cluster) -> Path:
    """KEDA's ScaledObject CRD, on its real schema (e2e/third_party_crds.py), installed once
    for the session; the file it came from."""
    path = KEDA.path
    install_crds(cluster, path)
    return path


@pytest.fixture(scope="session")
def prometheus_operator_crds(cluster: Cluster) -> Path:
    """The Prometheus Operator's PrometheusRule and ServiceMonitor CRDs, on their real
    schemas (e2e/third_party_crds.py), installed once for the session; the file."""
    path = PROMETHEUS_OPERATOR.path
    install_crds(cluster, path)
    return path
