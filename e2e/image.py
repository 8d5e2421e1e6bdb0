"""The operator image, built from this tree and run as a container, for the e2e suite.

:func:`build_image` runs ``scripts/build-image.sh --local-base``: podman builds the
Dockerfile on a base made here from Debian's packages, pulling nothing. Without podman or
mmdebstrap the test skips, saying what to install (and fails under CI, where
``.ci/run`` installs them). e2e/conftest.py starts the build in the background
(:func:`start_build`) as the worker's first e2e test begins, so the minute it takes
overlaps the tests that wait on the cluster; :func:`built_image` waits for it.

:func:`image_operator` starts ``cachescale run`` from the image as the chart runs it: the
image's own user (no ``--user``), a read-only root filesystem with a tmpfs at ``/tmp``,
the host's network (the envtest API server and the test's Prometheus listen on
loopback), and a kubeconfig mounted read-only. The container's output is the
:class:`OperatorProcess`'s log, so the suite's probes and waits work unchanged.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.controller.process_fixture import OperatorProcess
from tests.prometheus_fixture import free_port_block
from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[1]
TAG = "localhost/cachescale:e2e"
RUNTIME = REPO / "scripts" / "runc-without-rlimits"
"""podman's OCI runtime here: runc, minus the rlimits some sandboxes refuse to set."""
BUILD_TIMEOUT_S = 900
NEEDS = ("podman", "mmdebstrap", "runc")


def build_image() -> tuple[str, int]:
    """Build the image from this tree; its tag and its size in bytes."""
    missing = [tool for tool in NEEDS if shutil.which(tool) is None]
    require_tool(
        not missing,
        f"{', '.join(missing)} not found: `apt-get install podman mmdebstrap runc` "
        "builds and runs the image without a Docker engine",
    )
    built = subprocess.run(
        [str(REPO / "scripts" / "build-image.sh"), "--local-base", TAG],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert built.returncode == 0, f"the image build failed:\n{built.stderr[-3000:]}"
    tag, size = built.stdout.split()
    return tag, int(size)


_background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-build")
_builds: list[Future[tuple[str, int]]] = []


def start_build() -> None:
    """Start :func:`build_image` in the background (once per process)."""
    if not _builds:
        _builds.append(_background.submit(build_image))


def built_image() -> tuple[str, int]:
    """The image :func:`start_build` makes (started now if it was not): tag and size."""
    start_build()
    return _builds[0].result()


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with the runtime this machine can start containers with."""
    return subprocess.run(
        ["podman", "--runtime", str(RUNTIME), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@dataclass(frozen=True)
class Container:
    """A running operator container: its name (for ``podman inspect``) and the process."""

    name: str
    operator: OperatorProcess


@contextmanager
def image_operator(image: str, workdir: Path, kubeconfig: Path, *args: str) -> Iterator[Container]:
    """``cachescale run --kubeconfig KUBECONFIG ARGS...`` in a container of ``image``,
    probes and metrics on free host ports; removed on the way out, whatever happened.

    The kubeconfig's folder (holding nothing else) is mounted read-only at the same path,
    so the files it names (the API server's CA) resolve inside the container too."""
    health_port = free_port_block(2)
    metrics_port = health_port + 1
    folder = kubeconfig.parent
    # The image's user (uid 10001) reads them, as a pod reads its mounted token.
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)
    name = f"cachescale-e2e-{uuid.uuid4().hex[:8]}"
    command = [
        "podman", "--runtime", str(RUNTIME), "run", "--rm", "--name", name,
        "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "--volume", f"{folder}:{folder}:ro",
        image, "run",
        "--kubeconfig", str(kubeconfig),
        "--metrics-port", str(metrics_port),
        "--health-port", str(health_port),
        *args,
    ]  # fmt: skip
    log = workdir / "operator.log"
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT)
    operator = OperatorProcess(process, log, health_port, metrics_port)
    try:
        operator.wait_ready()
        yield Container(name, operator)
    finally:
        podman("rm", "--force", "--time", "0", name)
        if process.poll() is None:
            process.kill()
        process.wait()
