"""The chart installed the way a user installs it, once per session, with a record of how.

:func:`install_cycle` runs the whole life of a release with the default values —
``helm install --wait``, ``helm upgrade``, ``helm uninstall`` — then installs it again
under the same name and namespace (adopting the CRD the uninstall kept) and leaves it
installed: the operator tests run as its ServiceAccount. Each step's exit code, output
and duration is kept in :class:`Release` for e2e/test_helm_chart.py to assert on.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from e2e.harness.cluster import REPO, Cluster

CHART = REPO / "charts" / "cachescale"
NAME = "cachescale"
NAMESPACE = "cachescale-system"
CRD = "customresourcedefinition/cachescalingpolicies.cachescale.dev"
WAIT = ("--wait", "--timeout", "3m")


def wait_flags(cluster: Cluster) -> tuple[str, ...]:
    """``--wait`` where the operator's pod can become Ready: under envtest the node
    stand-in readies it; on a real cluster its image is not published (yet)."""
    return WAIT if cluster.envtest else ()


@dataclass(frozen=True)
class Step:
    """One helm (or kubectl) command: what ran, its result, how long it took."""

    command: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Release:
    """The session's release and the steps that made it."""

    name: str = NAME
    namespace: str = NAMESPACE
    steps: dict[str, Step] = field(default_factory=dict)

    @property
    def service_account(self) -> str:
        """The operator's ServiceAccount (the release's full name, default values)."""
        return self.name

    def run(self, key: str, action: subprocess.CompletedProcess[str], started: float) -> Step:
        """Record one finished command under ``key``."""
        step = Step(
            " ".join(str(a) for a in action.args[3:]),
            action.returncode,
            action.stdout,
            action.stderr,
            time.monotonic() - started,
        )
        self.steps[key] = step
        return step


def _helm(release: Release, cluster: Cluster, key: str, *args: str) -> Step:
    started = time.monotonic()
    return release.run(key, cluster.helm(*args), started)


def install_cycle(cluster: Cluster) -> Release:
    """Install, upgrade, uninstall, check the CRD stayed, install again (see module doc)."""
    release = Release()
    where = ("-n", release.namespace)
    _helm(
        release,
        cluster,
        "install",
        "install",
        NAME,
        str(CHART),
        *where,
        "--create-namespace",
        *wait_flags(cluster),
    )
    _helm(release, cluster, "manifest", "get", "manifest", NAME, *where)
    _helm(release, cluster, "notes", "get", "notes", NAME, *where)
    _helm(
        release, cluster, "upgrade",
        "upgrade", NAME, str(CHART), *where,
        "--set", "operator.logFormat=text", *wait_flags(cluster),
    )  # fmt: skip
    _helm(release, cluster, "uninstall", "uninstall", NAME, *where, "--wait", "--timeout", "2m")
    started = time.monotonic()
    release.run("crd-after-uninstall", cluster.kubectl("get", CRD, "-o", "name"), started)
    _helm(release, cluster, "reinstall", "install", NAME, str(CHART), *where, *wait_flags(cluster))
    return release


@contextmanager
def upgraded(cluster: Cluster, release: Release, *values: str) -> Iterator[None]:
    """The session's release upgraded with ``--set`` ``values`` on top of its own, then
    rolled back to what it was (the next test sees the default values again)."""
    where = ("-n", release.namespace)
    sets = [arg for value in values for arg in ("--set", value)]
    up = cluster.helm(
        "upgrade", release.name, str(CHART), *where, "--reuse-values", *sets, *wait_flags(cluster)
    )
    assert up.returncode == 0, up.stderr
    try:
        yield
    finally:
        back = cluster.helm("rollback", release.name, *where, *wait_flags(cluster))
        assert back.returncode == 0, back.stderr


def uninstall(cluster: Cluster, release: Release) -> None:
    """Remove the session's release (the CRD stays, as always)."""
    cluster.helm("uninstall", release.name, "-n", release.namespace, "--wait", "--timeout", "1m")
