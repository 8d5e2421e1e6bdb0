"""Start a real Kubernetes control plane from envtest binaries, and always stop it.

``KUBEBUILDER_ASSETS`` (controller-runtime's convention) names a directory holding
``etcd`` and ``kube-apiserver``, and optionally ``kube-controller-manager``. This module
starts them on free loopback ports in a temporary directory: certificates generated at
start (:mod:`harness.certs`), RBAC authorization on, an admin kubeconfig written beside
them. With the controller-manager the Deployment → ReplicaSet → Pod chain, namespace
deletion, the garbage collector, ServiceAccount tokens (TokenRequest) and the HPA
controller are all real; there is no kubelet and no scheduler (see :mod:`harness.node`).

No process outlives the run: each binary runs in its own process group, asks the kernel
to kill it when the process that started it dies (``PR_SET_PDEATHSIG``: covers a
``kill -9`` of pytest), and :meth:`ControlPlane.stop` (also registered with ``atexit``)
kills each group and waits for it.

The API server keeps an audit log of every write (verb, user, object; no bodies) in
``audit.log``: tests count an operator's patches and status writes from the server's
own record (:meth:`ControlPlane.writes`), not from the operator's logs; lists and
watches of policies are recorded too, so a client's relist after a lost watch shows, and
a service account's lists and watches of Deployments, HPAs and pods, so the namespaces an
operator's informers follow show.

Fault tests crash a component and bring it back as it was (:meth:`ControlPlane.kill`,
:meth:`ControlPlane.restart`: same ports, certificates and etcd data directory), and
compact etcd's history (:meth:`ControlPlane.compact_etcd`) so that old resourceVersions
expire.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from e2e.harness.api import Api, ApiError, Credentials
from e2e.harness.certs import Certificates, Pair, make_certificates
from tests.polling import wait_for

T = TypeVar("T")

SERVICE_RANGE = "10.0.0.0/24"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
BINARIES = ("etcd", "kube-apiserver")
OPTIONAL = "kube-controller-manager"


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [list, watch]
    resources: [{group: cachescale.dev, resources: [cachescalingpolicies]}]
  - level: Metadata
    verbs: [list, watch]
    userGroups: [system:serviceaccounts]
    resources:
      - {group: apps, resources: [deployments]}
      - {group: autoscaling, resources: [horizontalpodautoscalers]}
      - {group: "", resources: [pods]}
  - level: None
    verbs: [get, list, watch]
  - level: None
    resources: [{group: coordination.k8s.io, resources: [leases]}]
  - level: Metadata
"""
"""Every write, at Metadata level (who, what, which object, the answer's code), the lists
and watches of policies (a client relisting after a lost watch shows up there), and the
service accounts' lists and watches of the targets' kinds (which namespaces an operator's
informers follow)."""
WRITES = ("create", "update", "patch", "delete")


class StartError(RuntimeError):
    """A component did not come up; the message holds the tail of its log."""


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def missing_assets(assets: str | None) -> str | None:
    """Why ``assets`` cannot start a control plane, or None when it can."""
    if not assets:
        return "KUBEBUILDER_ASSETS is not set"
    for name in BINARIES:
        binary = Path(assets) / name
        if not os.access(binary, os.X_OK):
            return f"KUBEBUILDER_ASSETS={assets} has no executable {name}"
    return None


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL me when my parent dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def write_kubeconfig(
    path: Path, server: str, ca: Path, user: str, client: Pair | None = None, token: str = ""
) -> Path:
    """A kubeconfig with one cluster, one user (client certificate or token), one context."""
    if client is not None:
        credentials = f"client-certificate: {client.cert}\n    client-key: {client.key}"
    else:
        credentials = f"token: {token}"
    path.write_text(
        f"""\
apiVersion: v1
kind: Config
clusters:
- name: envtest
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    {credentials}
contexts:
- name: {user}@envtest
  context: {{cluster: envtest, user: {user}}}
current-context: {user}@envtest
""",
        encoding="utf-8",
    )
    path.chmod(0o600)
    return path


def wait_until(check: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll ``check`` every 0.2 s until it returns something other than None; a
    :class:`StartError` after the timeout."""
    return wait_for(check, timeout_s, what, every_s=0.2, error=StartError)


@dataclass
class Component:
    """One running binary: its process (a group leader) and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)
    """What it was started with: a restart reuses them (same ports, same data dir)."""

    def tail(self, lines: int = 30) -> str:
        """The last lines of its log."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        """Raise :class:`StartError` with the log tail when the process has exited."""
        if self.process.poll() is not None:
            raise StartError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after a grace period, reap it."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) in ``directory``."""

    assets: Path
    directory: Path
    keep_directory: bool = False
    components: list[Component] = field(default_factory=list)
    server: str = ""
    certs: Certificates | None = None
    kubeconfig: Path = Path()
    etcd_url: str = ""

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start every component and wait until the API server is ready; stop on failure."""
        atexit.register(self.stop)
        try:
            self.certs = make_certificates(self.directory / "pki")
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            if (self.assets / OPTIONAL).exists():
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component (last started first); remove the directory unless kept."""
        while self.components:
            self.components.pop().stop()
        if not self.keep_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        atexit.unregister(self.stop)

    @property
    def has_controller_manager(self) -> bool:
        """Whether Deployments, namespaces and tokens are served by real controllers."""
        return any(c.name == OPTIONAL for c in self.components)

    def admin_api(self) -> Api:
        """A client authenticated as the admin (group system:masters)."""
        assert self.certs is not None
        return Api(
            Credentials(
                server=self.server,
                ca_file=self.certs.ca.cert,
                cert_file=self.certs.admin.cert,
                key_file=self.certs.admin.key,
            )
        )

    def writes(self, user: str, resource: str, namespace: str) -> list[dict[str, Any]]:
        """Successful writes by ``user`` to ``resource`` (``hpa`` plural, or
        ``plural/subresource``) in ``namespace``, from the API server's audit log."""
        found = []
        log = self.directory / "audit.log"
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        for line in lines:
            event = json.loads(line)
            ref = event.get("objectRef", {})
            written = ref.get("resource", "") + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            if (
                event.get("verb") in WRITES
                and event.get("user", {}).get("username") == user
                and written == resource
                and ref.get("namespace") == namespace
                and event.get("responseStatus", {}).get("code", 0) < 300
            ):
                found.append(event)
        return found

    # -- components -------------------------------------------------------------------

    def _launch(self, name: str, args: list[str]) -> Component:
        log = self.directory / f"{name}.log"
        with log.open("ab") as stream:
            process = subprocess.Popen(
                [str(self.assets / name), *args],
                stdout=stream,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        component = Component(name, process, log, args)
        self.components.append(component)
        return component

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._launch(
            "etcd",
            [
                "--name=envtest",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )

        self.etcd_url = client_url
        self.wait_serving(etcd)
        return client_url

    def _start_apiserver(self, etcd_url: str) -> None:
        certs = self.certs
        assert certs is not None
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        audit_policy = self.directory / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY, encoding="utf-8")
        apiserver = self._launch(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.directory / 'apiserver-certs'}",
                f"--tls-cert-file={certs.serving.cert}",
                f"--tls-private-key-file={certs.serving.key}",
                f"--client-ca-file={certs.ca.cert}",
                f"--service-account-key-file={certs.service_account_pub}",
                f"--service-account-signing-key-file={certs.service_account_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--requestheader-client-ca-file={certs.front_proxy_ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={certs.front_proxy_client.cert}",
                f"--proxy-client-key-file={certs.front_proxy_client.key}",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.directory / 'audit.log'}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--v=0",
            ],
        )
        self.kubeconfig = write_kubeconfig(
            self.directory / "admin.kubeconfig", self.server, certs.ca.cert, "admin", certs.admin
        )
        self.wait_serving(apiserver)

    def wait_serving(self, component: Component) -> None:
        """Until etcd listens or the API server's ``/readyz`` answers (the controller-manager:
        until it is running); :class:`StartError` with its log tail otherwise."""
        if component.name == "etcd":
            port = int(self.etcd_url.rsplit(":", 1)[1])

            def listening() -> bool | None:
                component.check_alive()
                with socket.socket() as probe:
                    return True if probe.connect_ex(("127.0.0.1", port)) == 0 else None

            wait_until(listening, READY_TIMEOUT_S, "etcd to listen")
        elif component.name == "kube-apiserver":
            api = self.admin_api()

            def ready() -> bool | None:
                component.check_alive()
                try:
                    api.raw("GET", "/readyz")
                except (ApiError, OSError):
                    return None
                return True

            try:
                wait_until(ready, READY_TIMEOUT_S, "kube-apiserver /readyz")
            except StartError as error:
                raise StartError(f"{error}\n{component.tail()}") from None
        else:
            component.check_alive()

    # -- faults -----------------------------------------------------------------------

    def component(self, name: str) -> Component:
        """The running (or killed) component called ``name``."""
        for found in self.components:
            if found.name == name:
                return found
        raise KeyError(name)

    def kill(self, name: str) -> None:
        """SIGKILL one component's process group, as a crash would (no graceful shutdown)."""
        process = self.component(name).process
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def restart(self, name: str) -> None:
        """Start a killed component again with its original arguments — same ports, same
        certificates, same etcd data directory — and wait until it serves."""
        old = self.component(name)
        if old.process.poll() is None:
            raise StartError(f"{name} is still running: kill it first")
        index = self.components.index(old)
        self.components.remove(old)
        new = self._launch(name, old.args)
        self.components.remove(new)
        self.components.insert(index, new)  # stop() still stops the last started first
        self.wait_serving(new)

    def compact_etcd(self) -> int:
        """Compact etcd's history (etcd's JSON gateway) up to a revision newer than every
        object's: a key outside the API server's ``/registry`` is written first, so even
        a watch resumed from the latest resourceVersion (a quiet cluster, where nothing
        was written since) gets 410 Gone."""

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(
                self.etcd_url + path,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.load(response)
                return answer

        key = base64.b64encode(b"/cachescale-e2e/compaction").decode()
        value = base64.b64encode(b"bumped").decode()  # any put moves the revision on
        revision = int(post("/v3/kv/put", {"key": key, "value": value})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def _start_controller_manager(self) -> None:
        certs = self.certs
        assert certs is not None
        kubeconfig = write_kubeconfig(
            self.directory / "controller-manager.kubeconfig",
            self.server,
            certs.ca.cert,
            "system:kube-controller-manager",
            certs.controller_manager,
        )
        manager = self._launch(
            OPTIONAL,
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.directory / 'controller-manager-certs'}",
                f"--service-account-private-key-file={certs.service_account_key}",
                f"--root-ca-file={certs.ca.cert}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--v=0",
            ],
        )
        api = self.admin_api()

        def serving_accounts() -> bool | None:
            # The ServiceAccount controller creates `default` in every namespace: proof that
            # the controllers run and can write (pods need it before they are admitted).
            manager.check_alive()
            try:
                api.get("/api/v1/namespaces/default/serviceaccounts/default")
            except (ApiError, OSError):
                return None
            return True

        try:
            wait_until(serving_accounts, READY_TIMEOUT_S, "the controller-manager")
        except StartError as error:
            raise StartError(f"{error}\n{manager.tail()}") from None


@contextlib.contextmanager
def control_plane(assets: Path, keep_directory: bool = False) -> Iterator[ControlPlane]:
    """A started control plane, stopped (and its temp dir removed) on the way out."""
    directory = Path(tempfile.mkdtemp(prefix="cachescale-envtest-"))
    plane = ControlPlane(assets=assets, directory=directory, keep_directory=keep_directory)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
