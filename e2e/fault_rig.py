"""The fault tests' rig (e2e/test_faults.py): a Prometheus to break, the API server's
record to read, and the stack the cases share, with the checks every case makes.

The Prometheus is :class:`SwitchablePrometheus`, real HTTP on loopback that answers the
gather layer's queries from a fake fleet (tests/controller/engine_fake.py) until it is
switched to a fault (:class:`Mode`) or killed. What the operator did is read from the API
server's own record, not from the operator's logs: the audit log (:class:`AuditTail` for
what is new, :meth:`Faults.writes_between` for a stretch of time) and a watch that keeps
every version of the HPA the server publishes (:class:`HpaWatch`). :class:`Faults` is the
stack and :meth:`Faults.check_unharmed` the common check: the HPA neither scaled down nor
patched again, no alert but the outage's own, the baseline kept; each case records a
:class:`Row`, what docs/reliability.md's table states.

It is a module of its own so that e2e/test_faults.py holds only its fixture and the cases:
what is broken, and what must hold.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cachescale.api.policy import GROUP, MANAGED_BY, ORIGINAL_ENVELOPE, PLURAL, VERSION
from e2e.harness.api import Api, ApiError
from e2e.harness.cluster import Cluster
from e2e.harness.control_plane import WRITES, ControlPlane
from e2e.serving import APP
from tests.controller.cluster import learned_baseline
from tests.controller.engine_fake import EngineFake
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess, run_operator
from tests.gather.gather_fakes import answer_combined, form_of
from tests.polling import wait_for
from tests.prometheus_fixture import free_port_block

T = TypeVar("T")

SLOW_S = 12.0
"""How long the slow Prometheus takes per query: past the client's 10 s read timeout."""


# -- a Prometheus that can be broken on purpose ------------------------------------------


class Mode(StrEnum):
    """What the switchable Prometheus does with the next query."""

    GOOD = "good"
    SLOW = "slow"
    HANG = "hang"
    MALFORMED = "malformed JSON"
    HTML = "HTML from a proxy"
    ERROR = "status: error"
    NAN = "mixed NaN/Inf"


GARBAGE: dict[Mode, tuple[int, str, bytes]] = {
    Mode.MALFORMED: (
        200,
        "application/json",
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod"',
    ),
    Mode.HTML: (
        200,
        "text/html",
        b"<html><head><title>Sign in</title></head><body>Proxy login required</body></html>",
    ),
    Mode.ERROR: (
        422,
        "application/json",
        b'{"status":"error","errorType":"execution","error":"query would load too many samples"}',
    ),
}
NON_FINITE = ("NaN", "+Inf", "-Inf")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (read timeout) leaves a broken pipe: expected here."""


@dataclass
class SwitchablePrometheus:
    """Real HTTP on a fixed loopback port: healthy answers from ``engines`` in ``GOOD``
    mode, a fault otherwise; :meth:`kill` closes the port (and every pending query's
    connection, unanswered), :meth:`start` opens it again."""

    engines: EngineFake
    port: int = field(default_factory=lambda: free_port_block(1))
    mode: Mode = Mode.GOOD
    pending: int = 0
    first_query_at: float | None = None
    """When the first query in the current mode arrived (None: none yet)."""
    _server: _Server | None = None
    _killed: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._killed = threading.Event()
        server = _Server(("127.0.0.1", self.port), self._handler())
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    def switch(self, mode: Mode) -> None:
        """Answer the next queries in ``mode``."""
        self.mode = mode
        self.first_query_at = None

    def kill(self) -> None:
        """Stop listening and drop every connection that waits for an answer."""
        self._killed.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def answer(self, promql: str) -> tuple[int, str, bytes]:
        mode = self.mode
        if mode in GARBAGE:
            return GARBAGE[mode]
        status, body = answer_combined(promql, self.engines)
        if mode is Mode.NAN and status == 200:
            # Every series keeps its labels; values alternate between NaN and ±Inf.
            data = json.loads(body)
            for index, series in enumerate(data["data"]["result"]):
                series["value"][1] = NON_FINITE[index % len(NON_FINITE)]
            body = json.dumps(data).encode()
        return status, "application/json", body

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = form_of(self).get("query", "")
                with fake._lock:
                    fake.pending += 1
                    if fake.first_query_at is None:
                        fake.first_query_at = time.time()
                try:
                    if fake.mode is Mode.HANG:
                        fake._killed.wait(60)
                        self.close_connection = True
                        return  # killed mid-query: the connection closes unanswered
                    if fake.mode is Mode.SLOW:
                        time.sleep(SLOW_S)
                    status, kind, body = fake.answer(query)
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with fake._lock:
                        fake.pending -= 1

            def do_POST(self) -> None:
                self.do_GET()

            def log_message(self, *_: object) -> None:
                pass

        return Handler


# -- the API server's record ---------------------------------------------------------------


def when(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["stageTimestamp"]).timestamp()


@dataclass
class AuditTail:
    """The audit log's new lines since the last read (cheap to poll every few ms)."""

    path: Path
    offset: int = 0

    def __post_init__(self) -> None:
        self.offset = self.path.stat().st_size

    def events(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines()]


@dataclass
class HpaWatch:
    """Every version of the HPA the API server publishes, from a watch in a thread."""

    plane: ControlPlane
    namespace: str
    versions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self, resource_version: str) -> None:
        threading.Thread(target=self._run, args=(resource_version,), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, since: str) -> None:
        certs = self.plane.certs
        assert certs is not None
        context = ssl.create_default_context(cafile=str(certs.ca.cert))
        context.load_cert_chain(str(certs.admin.cert), str(certs.admin.key))
        url = (
            f"{self.plane.server}/apis/autoscaling/v2/namespaces/{self.namespace}/"
            f"horizontalpodautoscalers?watch=1&fieldSelector=metadata.name%3D{APP}"
            f"&resourceVersion={since}&timeoutSeconds=120"
        )
        with urllib.request.urlopen(url, context=context, timeout=130) as stream:
            for line in stream:
                if self._stop.is_set():
                    return
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.versions.append(event["object"])
                elif event["type"] == "ERROR":
                    self.errors.append(event["object"])


# -- the stack -----------------------------------------------------------------------------


@dataclass
class Row:
    """One fault's outcome, as docs/reliability.md's table states it."""

    fault: str
    observed: str
    recovery_s: float | None


@dataclass
class Faults:
    """The module's stack: one policy, its HPA, the operator, the switchable Prometheus."""

    cluster: Cluster
    plane: ControlPlane
    namespace: str
    kubeconfig: Path
    workdir: Path
    user: str
    prometheus: SwitchablePrometheus
    stack: ExitStack
    operator: OperatorProcess
    rows: list[Row] = field(default_factory=list)
    restarts: int = 0

    @property
    def api(self) -> Api:
        return self.plane.admin_api()

    def policy(self) -> dict[str, Any]:
        found: dict[str, Any] = self.api.get(
            f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{APP}"
        )
        return found

    def status(self) -> dict[str, Any]:
        return dict(self.policy().get("status", {}))

    def condition(self, kind: str) -> tuple[str, str, str] | None:
        for entry in self.status().get("conditions", []):
            if entry["type"] == kind:
                return entry["status"], entry["reason"], entry["message"]
        return None

    def hpa(self) -> dict[str, Any]:
        found: dict[str, Any] = self.api.get(
            f"/apis/autoscaling/v2/namespaces/{self.namespace}/horizontalpodautoscalers/{APP}"
        )
        return found

    def envelope(self) -> dict[str, Any]:
        """What the operator manages on the HPA (:func:`managed`)."""
        return managed(self.hpa())

    def writes(self, resource: str) -> list[dict[str, Any]]:
        return self.plane.writes(self.user, resource, self.namespace)

    def writes_between(self, start: float, end: float) -> list[dict[str, Any]]:
        """Every successful write by the operator in the namespace, in [start, end]."""
        found = []
        for line in (self.plane.directory / "audit.log").read_text().splitlines():
            event = json.loads(line)
            if (
                event.get("verb") in WRITES
                and event.get("user", {}).get("username") == self.user
                and event.get("objectRef", {}).get("namespace") == self.namespace
                and event.get("responseStatus", {}).get("code", 0) < 300
                and start <= when(event) <= end
            ):
                found.append(event)
        return found

    def hpa_patches(self) -> int:
        return len(self.writes("horizontalpodautoscalers"))

    def status_writes(self) -> list[dict[str, Any]]:
        return self.writes(f"{PLURAL}/status")

    def warnings(self) -> list[str]:
        events = self.api.get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [
            e["reason"]
            for e in events
            if e["involvedObject"].get("name") == APP
            and e["involvedObject"].get("kind") == "CacheScalingPolicy"
            and e["type"] == "Warning"
        ]

    def policy_reads(self, after: float) -> list[dict[str, Any]]:
        """The operator's lists and watches of policies since ``after`` (audit log; a
        watch is counted once, when its answer starts)."""
        found = []
        for line in (self.plane.directory / "audit.log").read_text().splitlines():
            event = json.loads(line)
            if (
                event.get("verb") in ("list", "watch")
                and event.get("user", {}).get("username") == self.user
                and event.get("objectRef", {}).get("resource") == PLURAL
                and (event["verb"] == "list" or event.get("stage") == "ResponseStarted")
                and when(event) > after
            ):
                found.append(event)
        return found

    def first_policy_list(self, after: float) -> float | None:
        """When the operator first listed policies after ``after`` (server time), if it has."""
        lists = [when(e) for e in self.policy_reads(after) if e["verb"] == "list"]
        return min(lists) if lists else None

    def next_status_write(self, after: float, timeout_s: float) -> float:
        """When the operator next wrote the policy's status (server time) after ``after``."""

        def written() -> float | None:
            later = [when(e) for e in self.status_writes() if when(e) > after]
            return min(later) if later else None

        return wait(written, timeout_s, "a status write by the operator")

    def next_evaluation(self, after: float, timeout_s: float) -> float:
        """When the operator next evaluated the policy (its own gauge) after ``after``."""

        def evaluated() -> float | None:
            at = self.operator.last_evaluation(self.namespace, APP)
            return at if at is not None and at > after else None

        return wait(evaluated, timeout_s, "an evaluation by the operator")

    def steady(self) -> Steady:
        status = self.status()
        return Steady(
            envelope=self.envelope(),
            hpa_patches=self.hpa_patches(),
            baseline=learned_baseline(status),
            evaluations=_evaluations(status),
            warnings=self.warnings(),
        )

    def check_unharmed(self, before: Steady, what: str, alert: str | None = None) -> None:
        """Nothing the fault should not have changed did: the HPA (no scale-down, no
        second patch), the alerts (none but ``alert``), the baseline (kept)."""
        status = self.status()
        assert self.envelope() == before.envelope, f"{what}: the HPA changed\n{self.story()}"
        assert self.hpa_patches() == before.hpa_patches, f"{what}: an HPA patch\n{self.story()}"
        alerts = {a["reason"] for a in status.get("alerts", [])}
        assert alerts <= {alert}, f"{what}: a false alert\n{self.story()}"
        baseline = learned_baseline(status)
        assert baseline.get("tokenHitRate") == pytest.approx(
            before.baseline.get("tokenHitRate"), rel=0.01
        ), f"{what}: the baseline moved or was lost\n{self.story()}"
        assert _evaluations(status) >= before.evaluations, f"{what}: memory reset"

    def start_operator(self) -> OperatorProcess:
        self.restarts += 1
        workdir = self.workdir / f"operator-{self.restarts}"
        workdir.mkdir()
        self.operator = self.stack.enter_context(
            run_operator(workdir, self.kubeconfig, self.namespace, LOOPBACK_PROMETHEUS)
        )
        return self.operator

    def record(self, fault: str, observed: str, recovery_s: float | None) -> None:
        self.rows.append(Row(fault, observed, recovery_s))
        shown = "-" if recovery_s is None else f"{recovery_s:.1f} s"
        print(f"\n| {fault} | {observed} | {shown} |")

    def story(self) -> str:
        status = self.status()
        brief = {k: status.get(k) for k in ("state", "conditions", "alerts")}
        brief["baseline"] = learned_baseline(status)
        return "\n".join(
            [
                json.dumps(brief, indent=1, default=str),
                json.dumps(self.envelope(), indent=1),
                self.operator.tail(30),
            ]
        )


@dataclass(frozen=True)
class Steady:
    """What a healthy, settled policy looks like before a fault."""

    envelope: dict[str, Any]
    hpa_patches: int
    baseline: dict[str, Any]
    evaluations: int
    warnings: list[str]


def managed(hpa: dict[str, Any]) -> dict[str, Any]:
    """What the operator manages on an HPA: its spec and the two annotations."""
    annotations = hpa["metadata"].get("annotations", {})
    return {
        "spec": hpa["spec"],
        "annotations": {k: annotations.get(k) for k in (ORIGINAL_ENVELOPE, MANAGED_BY)},
    }


def _evaluations(status: dict[str, Any]) -> int:
    """The memory's count of evaluations that fed the baseline (0: none or unknown)."""
    return int(learned_baseline(status).get("evaluations", 0) or 0)


def wait(check: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll ``check`` every 0.25 s until it returns something other than None; an
    API server that is down or restarting (``ApiError``, ``OSError``) is asked again."""

    def asked() -> T | None:
        try:
            return check()
        except (ApiError, OSError):
            return None

    return wait_for(asked, timeout_s, what, every_s=0.25)
