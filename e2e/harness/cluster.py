"""The cluster an e2e session runs against, and the tools that talk to it.

Two sources, in this order:

1. ``KUBECONFIG`` set to an existing file: that cluster (kind, or any conformant cluster
   with a kubelet), used as it is.
2. ``KUBEBUILDER_ASSETS`` with ``etcd`` and ``kube-apiserver``: a control plane started
   for the session (:mod:`harness.control_plane`) with the node stand-in
   (:mod:`harness.node`) running beside it.

Neither: :func:`why_no_cluster` says why, and every e2e test skips with that reason.

``kubectl`` and ``helm`` come from the repository's ``.tools/bin`` (``make tools``) when
present, else from PATH.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.control_plane import ControlPlane, control_plane, missing_assets, write_kubeconfig
from e2e.harness.node import FakeNode

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools" / "bin"


def tool(name: str) -> str | None:
    """The ``kubectl``/``helm`` binary to use, or None when there is none."""
    local = TOOLS / name
    if os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def _kubeconfig_from_env() -> Path | None:
    value = os.environ.get("KUBECONFIG")
    return Path(value) if value and Path(value).is_file() else None


def why_no_cluster() -> str | None:
    """Why the e2e suite cannot run here, or None when it can."""
    if tool("kubectl") is None:
        return "kubectl is not in .tools/bin (make tools) nor on PATH"
    if _kubeconfig_from_env() is not None:
        return None
    missing = missing_assets(os.environ.get("KUBEBUILDER_ASSETS"))
    if missing is None:
        return None
    return (
        f"no cluster: KUBECONFIG is not set to an existing file, and {missing} "
        "(.ci/run unpacks ../shared/envtest and exports it; or `setup-envtest use -p path`)"
    )


@dataclass
class Cluster:
    """What the tests need: a kubeconfig with admin rights, and how it was made."""

    kubeconfig: Path
    plane: ControlPlane | None = None
    node: FakeNode | None = None

    @property
    def envtest(self) -> bool:
        """Whether this is the session's own control plane (no real kubelet)."""
        return self.plane is not None

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster (never raises on a non-zero exit)."""
        command = [str(tool("kubectl")), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run helm against the cluster (never raises on a non-zero exit)."""
        command = [str(tool("helm")), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    def token_kubeconfig(self, path: Path, namespace: str, account: str) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``namespace/account`` with a
        TokenRequest token (``kubectl create token``), against the same server."""
        token = self.kubectl("create", "token", account, "-n", namespace, "--duration=2h")
        if token.returncode != 0:
            raise AssertionError(f"kubectl create token: {token.stderr}")
        server = self.kubectl(
            "config", "view", "--minify", "--raw", "-o", "jsonpath={.clusters[0].cluster.server}"
        ).stdout
        ca = path.with_suffix(".ca.crt")
        ca_data = self.kubectl(
            "config",
            "view",
            "--minify",
            "--raw",
            "-o",
            "jsonpath={.clusters[0].cluster.certificate-authority-data}",
        ).stdout
        if ca_data:
            ca.write_bytes(base64.b64decode(ca_data))
        else:
            ca_file = self.kubectl(
                "config",
                "view",
                "--minify",
                "--raw",
                "-o",
                "jsonpath={.clusters[0].cluster.certificate-authority}",
            ).stdout
            shutil.copyfile(ca_file, ca)
        user = f"system:serviceaccount:{namespace}:{account}"
        return write_kubeconfig(path, server, ca, user, token=token.stdout.strip())


@contextmanager
def session_cluster(keep: bool = False) -> Iterator[Cluster]:
    """The cluster for this session (see the module docstring); stopped on the way out."""
    existing = _kubeconfig_from_env()
    if existing is not None:
        yield Cluster(kubeconfig=existing)
        return
    assets = Path(os.environ["KUBEBUILDER_ASSETS"])
    with control_plane(assets, keep_directory=keep) as plane:
        node = FakeNode(plane.admin_api()).start()
        try:
            yield Cluster(kubeconfig=plane.kubeconfig, plane=plane, node=node)
        finally:
            node.stop()
