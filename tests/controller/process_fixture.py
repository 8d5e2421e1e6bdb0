"""The real ``cachescale run`` process, and a kmock cluster kopf can run against.

``cluster.fake_cluster()`` serves what the evaluation code reads and writes. kopf needs a
little more from an API server before it watches anything: the namespaces and CRD
resources in discovery (its observers wait for both), a namespace list when it is scoped
to namespaces, and the verbs of the resources it serves (it skips anything it cannot list
and watch). :func:`prepare_for_kopf` adds those to a running fake cluster, and
:func:`namespace_paths` teaches kmock's path parser the cluster-scoped
``/api/v1/namespaces[/NAME]`` paths (kmock reads ``namespaces`` there as the start of a
namespaced path and answers 500).

:func:`run_operator` starts the operator as a user would — the ``cachescale`` console
script with ``run --namespace ... --kubeconfig ...`` — logs its output to a file, waits
for its probes, and stops it with SIGTERM on the way out.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import kmock
import kmock._internal.parsing as kmock_parsing
from prometheus_client.parser import text_string_to_metric_families

from tests.controller.cluster import DEPLOYMENTS, HPAS, NAMESPACE, PODS, POLICIES, FakeCluster
from tests.polling import wait_for
from tests.prometheus_fixture import free_port_block

SERVED_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
OBSERVED_VERBS = {"get", "list", "watch"}
TARGET_KINDS = (DEPLOYMENTS, HPAS, PODS)
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
"""Unset for the child: with them, both the operator and kopf would try in-cluster auth."""
LOOPBACK_PROMETHEUS = ("--allowed-prometheus-url", r"re:https?://127\.0\.0\.1:[0-9]+")
"""The flag that lets the policies of a test name the Prometheus servers the tests start
(fakes and real ones listen on loopback): without it the operator allows no policy-chosen
URL (``gather/egress.py``). Passed explicitly by each test that needs it."""
IMAGE_ENV = {"MALLOC_ARENA_MAX": "2"}
"""What the image and the chart set that changes how the operator runs (its memory), so
the tests and the fleet bench measure the operator as it ships."""


# -- kmock, made kopf-compatible ----------------------------------------------------------


@contextmanager
def namespace_paths() -> Iterator[None]:
    """Route ``/api/v1/namespaces`` and ``/api/v1/namespaces/NAME`` to the cluster-scoped
    ``v1/namespaces`` resource while the context is open.

    Workaround for a kmock 0.8 limitation (not an operator bug): its ``parse_path`` always
    takes the segment after ``namespaces`` as a namespace, so listing namespaces fails with
    a 500 ("not enough values to unpack"), and kopf, scoped with ``--namespace``, lists
    them before it watches anything. The emulator runs in this process (a thread), so
    patching the module function reaches it.
    """
    original = kmock_parsing.parse_path

    def parse_path(path: str) -> kmock_parsing.ParsedPath:
        parts = path.split("?", 1)[0].strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
            name = parts[3] if len(parts) == 4 else None
            return kmock_parsing.ParsedPath("", "v1", "namespaces", None, name, None)
        return original(path)

    kmock_parsing.parse_path = parse_path
    try:
        yield
    finally:
        kmock_parsing.parse_path = original


def prepare_for_kopf(cluster: FakeCluster) -> None:
    """Discovery and objects kopf needs from the fake API server before it serves policies.

    - the CRD with the verbs kopf checks (list, watch, patch) and its status subresource:
      without verbs kopf logs "Non-watchable resources will not be served" and idles;
    - ``v1/namespaces`` and ``apiextensions.k8s.io/v1/customresourcedefinitions`` in
      discovery: kopf's namespace and resource observers wait for both;
    - the Namespace object the operator is scoped to;
    - the verbs of the Deployments, HPAs and pods, which kopf lists and watches into the
      operator's target indexes (``controller/kube/indexes.py``), as a real API server lists them.
    """
    resources = cluster.emulator.resources
    policies = resources[POLICIES]
    policies.verbs = set(SERVED_VERBS)
    policies.subresources = {"status"}
    for indexed in TARGET_KINDS:
        resources[indexed].verbs = set(SERVED_VERBS)
    resources["v1/namespaces"] = kmock.ResourceInfo(
        namespaced=False, kind="Namespace", verbs=OBSERVED_VERBS
    )
    resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        namespaced=False, kind="CustomResourceDefinition", verbs=OBSERVED_VERBS
    )
    cluster.put(
        "v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )


def delete(cluster: FakeCluster, path: str) -> int:
    """HTTP DELETE on an API path, as ``kubectl delete`` sends it; the status code."""
    request = urllib.request.Request(cluster.url.rstrip("/") + path, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def write_kubeconfig(path: Path, server: str) -> Path:
    """A minimal kubeconfig for a plain-http API server without authentication."""
    path.write_text(
        f"""\
apiVersion: v1
kind: Config
clusters:
  - name: kmock
    cluster: {{server: "{server.rstrip("/")}"}}
users:
  - name: kmock
    user: {{}}
contexts:
  - name: kmock
    context: {{cluster: kmock, user: kmock, namespace: {NAMESPACE}}}
current-context: kmock
""",
        encoding="utf-8",
    )
    return path


# -- the operator process -----------------------------------------------------------------


def cachescale_command() -> list[str]:
    """The ``cachescale`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "cachescale"
    if script.exists():
        return [str(script)]
    found = shutil.which("cachescale")
    if found:
        return [found]
    return [
        sys.executable,
        "-c",
        "import sys; from cachescale.commands.main import main; sys.exit(main())",
    ]


class OperatorProcess:
    """A running ``cachescale run`` and its log."""

    def __init__(
        self, process: subprocess.Popen[bytes], log: Path, health_port: int, metrics_port: int
    ) -> None:
        self.process = process
        self.log = log
        self.health_url = f"http://127.0.0.1:{health_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    def output(self) -> str:
        """Everything it printed so far (stdout and stderr)."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of its output."""
        return "\n".join(self.output().splitlines()[-lines:])

    def probe(self, path: str) -> int | None:
        """The HTTP status of a health endpoint (None: nothing answers)."""
        try:
            with urllib.request.urlopen(f"{self.health_url}{path}", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return None

    def samples(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        """Every sample of metric ``name`` on its ``/metrics``, by label set (parsed by
        ``prometheus_client``'s own exposition parser)."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            text = response.read().decode()
        return {
            frozenset(sample.labels.items()): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        }

    def last_evaluation(self, namespace: str, name: str) -> float | None:
        """When it last evaluated policy ``namespace/name`` (its own gauge; None: not yet).
        Unlike ``status.signals.observedAt``, this moves at every evaluation, including
        those whose status write is skipped as unchanged."""
        wanted = frozenset({("namespace", namespace), ("policy", name)})
        for labels, value in self.samples("cachescale_last_evaluation_timestamp_seconds").items():
            if wanted <= labels:
                return value
        return None

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until ``/readyz`` answers 200; fail early if the process died."""

        def ready() -> bool | None:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"cachescale run exited with {self.process.returncode}:\n{self.tail()}"
                )
            return True if self.probe("/readyz") == 200 else None

        wait_for(ready, timeout_s, "the operator's /readyz")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait for the exit code (kill and fail if it takes too long)."""
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"cachescale run did not exit within {timeout_s:g}s of SIGTERM:\n{self.tail()}"
            ) from None


def run_operator(
    workdir: Path, kubeconfig: Path, namespace: str = NAMESPACE, flags: tuple[str, ...] = ()
) -> AbstractContextManager[OperatorProcess]:
    """Start ``cachescale run`` on ``kubeconfig``, scoped to ``namespace``, standalone, with
    ``flags`` (e.g. ``LOOPBACK_PROMETHEUS``)."""
    return start_operator(workdir, kubeconfig, "--namespace", namespace, "--standalone", *flags)


@contextmanager
def start_operator(workdir: Path, kubeconfig: Path, *args: str) -> Iterator[OperatorProcess]:
    """Start ``cachescale run --kubeconfig KUBECONFIG ARGS...`` with metrics and probes
    on free ports, its output in ``workdir/operator.log``; wait until it is ready. Killed
    on the way out, whatever happened. (The e2e suite starts its peered and cluster-wide
    operators through this too.)"""
    health_port = free_port_block(2)
    metrics_port = health_port + 1
    command = [
        *cachescale_command(),
        "run",
        "--kubeconfig", str(kubeconfig),
        "--metrics-port", str(metrics_port),
        "--health-port", str(health_port),
        *args,
    ]  # fmt: skip
    # No $KUBECONFIG and no in-cluster variables: only --kubeconfig can lead the operator
    # (and kopf's own login) to the fake API server.
    env = {k: v for k, v in os.environ.items() if k not in (*IN_CLUSTER_ENV, "KUBECONFIG")}
    env |= IMAGE_ENV
    log = workdir / "operator.log"
    with log.open("wb") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=env)
    operator = OperatorProcess(process, log, health_port, metrics_port)
    try:
        operator.wait_ready()
        yield operator
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
