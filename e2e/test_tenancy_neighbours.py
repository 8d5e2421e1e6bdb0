"""A hostile tenant's neighbours on a real API server (issue 53, findings 5 and 6).

Alice may create policies in tenant-a only (impersonated: ``kubectl --as``); the operator
runs as the chart's ServiceAccount with the chart's flags (e2e/tenancy.py). Every
Prometheus is a recording server on loopback (``Recorder``): it keeps when each request
arrived and what it asked, and answers after a chosen delay.

- Noisy neighbour (finding 5): alice creates ``NOISY`` policies, each naming its own path
  of a Prometheus that answers after 15 s (past the evaluation's 10 s deadline), so each
  is a gather group of its own and every job holds a worker until its deadline; tenant-b
  has one policy on a 10 s interval whose Prometheus answers at once. Before the fix
  tenant-a's jobs filled every worker and tenant-b's waited behind them. Measured
  from outside the operator, as the times tenant-b's Prometheus receives its queries:
  over a minute, no gap between two of tenant-b's evaluations (nor from the start or to
  the end of the minute) exceeds one interval + 5 s, and tenant-a's Prometheus keeps
  receiving queries from many of her policies (throttled, not starved).
- Query wall (finding 6): the operator reads its default Prometheus
  (``--default-prometheus-url``, a recording fake). Alice's policy with
  ``selector: {namespace: tenant-b}`` is refused ``SelectorOutsideNamespace``, her
  ``demandQuery`` reading tenant-b ``DemandQueryNotAllowed``; her plain policy is read,
  and every query the fake receives, parsed with the PromQL parser the operator's
  rewrite uses, selects on each vector selector exactly ``namespace="<tenant-a>"``.

The port-scanner half of finding 6 (open and closed ports told apart) is
e2e/test_tenancy_url.py's.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import promql_parser as pp

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import get, until
from e2e.operators import evaluated_again
from e2e.tenancy import Tenancy, tenancy, tenant_operator  # noqa: F401 (a fixture)
from tests.controller.cluster import deployment as deployment_body
from tests.controller.cluster import hpa as hpa_body
from tests.controller.cluster import policy as policy_body
from tests.gather.gather_fakes import answer_combined, form_of, vector

INTERVAL_S = 10.0
"""Every policy's ``spec.metrics.interval`` (``tests/controller/cluster.policy``)."""
ACCEPTED_LATENESS_S = INTERVAL_S + 5.0
"""Issue 53's acceptance: the victim never more than one interval + 5 s late."""
SLOW_S = 15.0
"""tenant-a's Prometheus answers after this long: past the evaluation's 10 s deadline."""
NOISY = 60
"""tenant-a's policies: each a gather group of its own, far more than the 16 workers."""
MEASURED_S = 60.0
"""How long tenant-b's evaluations are watched, once the operator has started them."""
SETTLING_S = 5.0
"""Not measured: the scheduler's start-up catch-ups, between tenant-b's first query and
the measured minute."""
EVALUATION_GAP_S = 2.0
"""Queries closer than this are one evaluation's (its detection query and its batch)."""


# -- a recording Prometheus ---------------------------------------------------------------


@dataclass
class Recorder:
    """A fake Prometheus on loopback: every request's arrival time (``time.time()``),
    path and PromQL; each answered (empty vectors, a combined query part by part) after
    ``delay_s``, or at once when the server stops."""

    url: str
    delay_s: float
    arrivals: list[tuple[float, str, str]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[tuple[float, str, str]]:
        """A copy of what arrived so far: (time, path, query)."""
        with self.lock:
            return list(self.arrivals)

    def queries(self) -> list[str]:
        """Every PromQL string received so far."""
        return [query for _at, _path, query in self.received()]


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # tenant-a's policies connect in bursts
    daemon_threads = True


def _recording_handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            arrived = time.time()
            query = form_of(self).get("query", "")
            with recorder.lock:
                recorder.arrivals.append((arrived, self.path.split("?")[0], query))
            recorder.stopping.wait(recorder.delay_s)
            _status, body = answer_combined(query, lambda _part: vector())
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the operator gave up at its deadline and hung up
                pass

        def do_POST(self) -> None:
            self.do_GET()

        def log_message(self, *_: object) -> None:
            pass

    return Handler


@contextmanager
def recording_prometheus(delay_s: float = 0.0) -> Iterator[Recorder]:
    """A :class:`Recorder` on a free loopback port for the duration of the block."""
    server = _Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    recorder = Recorder(f"http://127.0.0.1:{server.server_address[1]}", delay_s)
    server.RequestHandlerClass = _recording_handler(recorder)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.stopping.set()
        server.shutdown()
        server.server_close()


# -- targets and policies -----------------------------------------------------------------


def idle_stack(name: str) -> list[dict[str, Any]]:
    """A Deployment with no pods (nothing to schedule, the HPA controller leaves it at 0)
    and the HPA on it: a target a policy can be evaluated on, one per policy (two
    policies on one HPA would be ``TargetClaimed``)."""
    deployment = deployment_body(name, replicas=0)
    deployment["metadata"] = {"name": name}
    deployment.pop("status")
    autoscaler = hpa_body(name, target=name)
    autoscaler["metadata"] = {"name": name}
    return [deployment, autoscaler]


def tenant_policy(
    name: str, namespace: str, url: str | None, metrics: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An Advise policy on ``name``'s idle stack, reading ``url`` (None: the operator's
    default Prometheus) every 10 s, its selector in ``namespace`` unless ``metrics``
    says otherwise."""
    extra = {"metrics": {"selector": {"namespace": namespace, "model_name": name}}}
    body = policy_body(
        name,
        prometheus_url=url or "",
        mode="Advise",
        deployment_name=name,
        hpa_name=name,
        extra=extra,
    )
    if url is None:
        del body["spec"]["metrics"]["prometheusUrl"]
    body["spec"]["metrics"].update(metrics or {})
    body["metadata"] = {"name": name}
    return body


def as_list(items: list[dict[str, Any]]) -> str:
    """One ``kind: List`` document: many objects in one kubectl call."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def admin_creates(cluster: Cluster, namespace: str, items: list[dict[str, Any]]) -> None:
    """The platform team creates ``items`` in ``namespace`` (targets, tenant-b's policy)."""
    created = cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=as_list(items))
    assert created.returncode == 0, created.stderr


def tenant_creates(world: Tenancy, policies: list[dict[str, Any]]) -> None:
    """Alice creates ``policies`` in tenant-a, as herself."""
    created = world.as_tenant("create", "-n", world.a, "-f", "-", stdin=as_list(policies))
    assert created.returncode == 0, created.stderr


# -- finding 5: the noisy neighbour -------------------------------------------------------


def evaluations(arrivals: list[float]) -> list[float]:
    """When each evaluation began: the first of each run of queries closer than
    ``EVALUATION_GAP_S``."""
    times = sorted(arrivals)
    return [
        at
        for before, at in zip([-math.inf, *times], times, strict=False)
        if at - before > EVALUATION_GAP_S
    ]


def worst_gap(starts: list[float], since: float, until: float) -> float:
    """The longest time in [since, until] without an evaluation starting: each slot
    started at most ``ACCEPTED_LATENESS_S - INTERVAL_S`` late keeps it under
    ``ACCEPTED_LATENESS_S``."""
    inside = [t for t in starts if since <= t <= until]
    points = [since, *inside, until]
    return max(b - a for a, b in itertools.pairwise(points))


def most_at_once(arrivals: list[float], deadline_s: float = 10.0) -> int:
    """The most tenant-a jobs running at once, from when their queries arrived: each
    holds its worker until its deadline, so queries closer than that (less a margin)
    came from jobs running together."""
    times = sorted(arrivals)
    return max(
        (sum(1 for t in times if at - (deadline_s - 0.5) < t <= at) for at in times), default=0
    )


@dataclass(frozen=True)
class Neighbours:
    """What one noisy-neighbour run measured."""

    victim_starts: int
    """tenant-b's evaluations in the measured minute."""
    worst_gap_s: float
    """The longest stretch of the minute with no tenant-b evaluation starting."""
    noisy_requests: int
    """Requests tenant-a's Prometheus received while measured."""
    noisy_policies: int
    """tenant-a's policies (their paths) among those requests."""
    noisy_peak: int
    """The most tenant-a jobs running at once (``most_at_once``)."""


def noisy_neighbour(
    cluster: Cluster, release: Release, world: Tenancy, workdir: Path, flags: tuple[str, ...]
) -> Neighbours:
    """Run the noisy neighbour with ``flags`` added to the operator's and measure it."""
    a, b = world.a, world.b
    with ExitStack() as stack:
        slow = stack.enter_context(recording_prometheus(SLOW_S))
        fast = stack.enter_context(recording_prometheus())
        names = [f"noisy-{i}" for i in range(NOISY)]
        admin_creates(cluster, a, [obj for name in names for obj in idle_stack(name)])
        admin_creates(cluster, b, idle_stack("victim"))
        tenant_creates(world, [tenant_policy(n, a, f"{slow.url}/tenant-a/{n}") for n in names])
        admin_creates(cluster, b, [tenant_policy("victim", b, fast.url)])
        allowed = ("--allowed-prometheus-url", slow.url, "--allowed-prometheus-url", fast.url)
        operator = stack.enter_context(
            tenant_operator(cluster, release, workdir, world, flags=(*allowed, *flags))
        )
        first = until(
            lambda: fast.received()[0][0] if fast.received() else None,
            "tenant-b's first evaluation",
            60,
        )
        since = first + SETTLING_S
        ended = since + MEASURED_S
        time.sleep(max(0.0, ended - time.time()) + 1.0)
        assert operator.process.poll() is None, operator.tail()
        victim = evaluations([at for at, _path, _query in fast.received()])
        noisy = [(at, path) for at, path, _query in slow.received() if since <= at <= ended]
    return Neighbours(
        victim_starts=len([t for t in victim if since <= t <= ended]),
        worst_gap_s=worst_gap(victim, since, ended),
        noisy_requests=len(noisy),
        noisy_policies=len({path for _at, path in noisy}),
        noisy_peak=most_at_once([at for at, _path in noisy]),
    )


def test_a_tenant_with_a_slow_prometheus_keeps_no_other_tenant_waiting(
    cluster: Cluster,
    release: Release,
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    measured = noisy_neighbour(cluster, release, tenancy, tmp_path, flags=())
    print(f"noisy neighbour, default --max-concurrent-per-namespace: {measured}")
    assert measured.worst_gap_s <= ACCEPTED_LATENESS_S, measured
    assert measured.victim_starts >= MEASURED_S / ACCEPTED_LATENESS_S, measured
    # tenant-a is throttled, not starved: her policies are read in turn all along.
    assert measured.noisy_requests >= 8, measured
    assert measured.noisy_policies >= 8, measured


# -- finding 6: the query wall on the operator's default Prometheus -----------------------


def namespace_matchers(query: str) -> list[list[tuple[str, str]]]:
    """For each vector selector of ``query`` (and each alternative of an ``or`` matcher
    set): its ``namespace`` matchers, as (operator, value)."""
    found: list[list[tuple[str, str]]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, pp.VectorSelector):
            sets = [node.matchers.matchers, *node.matchers.or_matchers]
            for matchers in sets:
                found.append([(str(m.op), m.value) for m in matchers if m.name == "namespace"])
        return True

    pp.walk(pp.parse(query), pre_visit=visit)
    return found


def ready_condition(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The policy's ``Ready`` condition (None: none yet)."""
    found = get(cluster, "csp", name, "-n", namespace) or {}
    for entry in found.get("status", {}).get("conditions", []):
        if entry["type"] == "Ready":
            return dict(entry)
    return None


def refused(cluster: Cluster, namespace: str, name: str, reason: str) -> dict[str, Any]:
    """Wait for the policy's ``Ready=False`` with ``reason``; its condition."""

    def said() -> dict[str, Any] | None:
        ready = ready_condition(cluster, namespace, name)
        return ready if ready and ready["reason"] == reason else None

    try:
        return until(said, f"{name}: Ready=False {reason}", 60)
    except AssertionError as error:
        status = (get(cluster, "csp", name, "-n", namespace) or {}).get("status", {})
        conditions = json.dumps(status.get("conditions"))
        raise AssertionError(f"{error}; its conditions: {conditions}") from None


SECRET_METRIC = "SECRETMETRIC"


def test_no_query_to_the_operators_prometheus_selects_another_namespace(
    cluster: Cluster,
    release: Release,
    tenancy: Tenancy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    a, b = tenancy.a, tenancy.b
    hostile: dict[str, dict[str, Any]] = {
        "cross": {"selector": {"namespace": b, "model_name": "m"}},
        "demand": {"demandQuery": f'sum({SECRET_METRIC}{{namespace="{b}"}})'},
    }
    names = ["plain", *hostile]
    admin_creates(cluster, a, [obj for name in names for obj in idle_stack(name)])
    with (
        recording_prometheus() as prometheus,
        tenant_operator(
            cluster, release, tmp_path, tenancy, flags=("--default-prometheus-url", prometheus.url)
        ) as operator,
    ):
        policies = [tenant_policy("plain", a, None, {"selector": {"model_name": "m"}})]
        policies += [tenant_policy(n, a, None, metrics) for n, metrics in hostile.items()]
        tenant_creates(tenancy, policies)
        cross = refused(cluster, a, "cross", "SelectorOutsideNamespace")
        demand = refused(cluster, a, "demand", "DemandQueryNotAllowed")
        until(lambda: prometheus.queries() or None, "the plain policy's queries", 60)
        evaluated_again(operator, a, *names)  # one more evaluation of each
        queries = prometheus.queries()
        for name, reason in (("cross", cross["reason"]), ("demand", demand["reason"])):
            still = ready_condition(cluster, a, name)
            assert still is not None, name
            assert (still["status"], still["reason"]) == ("False", reason), still
    assert "namespace" in cross["message"], cross
    assert "demandQuery" in demand["message"], demand
    assert queries, "the plain policy was read"
    for query in queries:
        assert b not in query, query
        assert SECRET_METRIC not in query, query
        selectors = namespace_matchers(query)
        assert selectors, query
        for matchers in selectors:
            assert matchers == [("MatchOp.Equal", a)], (matchers, query)
