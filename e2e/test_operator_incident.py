"""Points 2, 3 and 6: the operator as the chart's ServiceAccount, the incident end to end,
and a ``kill -9`` in the middle of it, on a real API server.

What runs where: the API server, etcd and the controllers are real (envtest, or the
cluster in KUBECONFIG); the chart is installed with its default values (``release``
fixture); the operator runs out of cluster as ``cachescale run`` with a TokenRequest
token for the chart's ServiceAccount (so only the chart's RBAC lets it act); the serving
Deployment's pods are real (e2e/serving.py) and their engines' metrics come from
``cachescale emulate`` through a real Prometheus, under the real pods' names.

The scenario is the incident's release mid-run (tests/controller/test_operator_process.py
explains the numbers): the token hit rate falls from ~0.8 to ~0.1 at flat traffic. The
tests in this module run in order on one stack (module-scoped): the collapse, then the
restart, then the delete.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tests.controller.test_operator_process as scenario
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, events_for, get, until
from e2e.serving import APP, Metrics, create_stack, emulated_metrics
from e2e.tenancy import grant_enforce
from tests.controller.cluster import learned_baseline
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess, run_operator

COLLAPSE_TIMEOUT_S = 200.0
DESCRIBE_LINES = 125
"""``kubectl describe csp`` of the collapsed policy: 13 lines of metadata, 21 of spec as
written, 2 Events and their header, 7 conditions of 5 lines, the signals the decision used,
the last decision, the alert, the suspected change and the summary."""


@dataclass
class Incident:
    """The module's stack: cluster, namespace, metrics, the operator (replaceable)."""

    cluster: Cluster
    namespace: str
    kubeconfig: Path
    workdir: Path
    metrics: Metrics
    original_hpa: dict[str, Any]
    stack: ExitStack
    operator: OperatorProcess
    user: str
    timeline: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def mark(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.1f}s: {what}")

    def status(self) -> dict[str, Any]:
        found = get(self.cluster, "csp", APP, "-n", self.namespace)
        return found.get("status", {}) if found else {}

    def condition(self, kind: str) -> tuple[str, str] | None:
        for entry in self.status().get("conditions", []):
            if entry["type"] == kind:
                return entry["status"], entry["reason"]
        return None

    def hpa(self) -> dict[str, Any]:
        found: dict[str, Any] = get(self.cluster, "hpa", APP, "-n", self.namespace)
        return found

    def warnings(self, reason: str) -> list[dict[str, Any]]:
        events = events_for(self.cluster, self.namespace, "CacheScalingPolicy", APP)
        return [e for e in events if e["type"] == "Warning" and e["reason"] == reason]

    def patches(self) -> dict[str, int] | None:
        """Writes by the operator's ServiceAccount to the HPA, the Deployment and the
        policy's status, from the API server's audit log (None: not an envtest cluster)."""
        plane = self.cluster.plane
        if plane is None:
            return None
        return {
            resource: len(plane.writes(self.user, resource, self.namespace))
            for resource in ("horizontalpodautoscalers", "deployments")
        }

    def start_operator(self, name: str) -> OperatorProcess:
        workdir = self.workdir / name
        workdir.mkdir()
        self.operator = self.stack.enter_context(
            run_operator(workdir, self.kubeconfig, self.namespace, LOOPBACK_PROMETHEUS)
        )
        return self.operator

    def story(self) -> str:
        brief = {k: self.status().get(k) for k in ("state", "conditions", "signals", "alerts")}
        return "\n".join(
            [
                *self.timeline,
                json.dumps(brief, indent=1, default=str),
                json.dumps(self.hpa().get("spec"), indent=1),
                self.operator.tail(40),
            ]
        )


@pytest.fixture(scope="module")
def incident(
    cluster: Cluster, release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Incident]:
    workdir = tmp_path_factory.mktemp("incident")
    namespace = f"cachescale-e2e-incident-{int(time.time()) % 100000}"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    kubeconfig = cluster.token_kubeconfig(
        workdir / "operator.kubeconfig", release.namespace, release.service_account
    )
    grant_enforce(cluster, release, namespace)  # Enforce: rbac.enforceNamespaces
    with ExitStack() as stack:
        original, pods = create_stack(cluster, namespace, scenario.MODEL, scenario.PODS)
        metrics = stack.enter_context(
            emulated_metrics(
                workdir, namespace, scenario.MODEL, scenario.collapse_scenario(), pods,
                speed=scenario.SPEED,
            )
        )  # fmt: skip
        first = stack.enter_context(
            run_operator(workdir, kubeconfig, namespace, LOOPBACK_PROMETHEUS)
        )
        user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
        incident = Incident(
            cluster, namespace, kubeconfig, workdir, metrics, original, stack, first, user
        )
        incident.mark(f"operator ready as {release.service_account}; pods {pods}")
        body = policy_body(
            APP,
            prometheus_url=metrics.prometheus.url,
            extra={
                "metrics": {"selector": {"namespace": namespace, "model_name": scenario.MODEL}},
                "budget": {"gpuSecondsPer1kRequests": scenario.BUDGET},
                "cache": {"onCollapse": "Hold"},
            },
        )
        body["metadata"] = {"name": APP}
        apply(cluster, namespace, body)
        yield incident
        print("\n".join(incident.timeline))
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_operator_runs_as_the_charts_service_account(
    incident: Incident, release: Release
) -> None:
    cluster, kubeconfig = incident.cluster, str(incident.kubeconfig)
    whoami = cluster.kubectl("--kubeconfig", kubeconfig, "auth", "whoami", "-o", "json")
    assert whoami.returncode == 0, whoami.stderr
    user = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
    assert user == f"system:serviceaccount:{release.namespace}:{release.service_account}"
    # Least privilege, proven by the server: no Secret anywhere, no delete, no pod writes.
    for verb, what in [
        ("get", ("secrets", "-n", incident.namespace)),
        ("get", ("secrets", "--all-namespaces")),
        ("get", ("secrets", "-n", release.namespace)),
    ]:
        denied = cluster.kubectl("--kubeconfig", kubeconfig, verb, *what)
        assert denied.returncode != 0, (verb, what, denied.stdout)
        assert "Forbidden" in denied.stderr, (verb, what, denied.stderr)
    for verb, resource in [
        ("delete", "deployments"),
        ("create", "pods"),
        ("update", "horizontalpodautoscalers"),
    ]:
        can = cluster.kubectl(
            "--kubeconfig", kubeconfig, "auth", "can-i", verb, resource, "-n", incident.namespace
        )
        assert can.stdout.strip() == "no", (verb, resource, can.stdout)
    # ...and yet it does its job: kopf's finalizer and the first status write.
    until(lambda: incident.condition("MetricsAvailable"), "the first status write", 60)
    policy = get(cluster, "csp", APP, "-n", incident.namespace)
    assert policy["metadata"].get("finalizers"), "kopf's finalizer"
    assert incident.condition("MetricsAvailable") == ("True", "SignalsRead"), incident.story()
    incident.mark("status written by the ServiceAccount; MetricsAvailable=True")


def test_a_collapse_is_alerted_held_and_explained(incident: Incident) -> None:
    def learned() -> bool | None:
        return True if incident.condition("CacheHealthy") == ("True", "HitRateAtBaseline") else None

    until(learned, "a baseline (CacheHealthy=True)", 120)
    incident.mark(f"baseline learned: {learned_baseline(incident.status())}")

    def collapsed() -> bool | None:
        return True if incident.condition("CacheHealthy") == ("False", "PrefixCollapse") else None

    try:
        until(collapsed, "CacheHealthy=False (PrefixCollapse)", COLLAPSE_TIMEOUT_S)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{incident.story()}") from None
    incident.mark("CacheHealthy=False PrefixCollapse")
    status = incident.status()
    assert incident.condition("ScalingHeld") == ("True", "CollapseHold"), incident.story()
    assert status["state"] == "PrefixCollapse"
    alert = status["alerts"][0]
    assert alert["reason"] == "PrefixCollapse"
    assert re.search(scenario.EVIDENCE, alert["message"]), alert["message"]
    warnings = incident.warnings("PrefixCollapse")
    assert len(warnings) == 1, warnings
    assert warnings[0]["message"] == alert["message"]
    incident.mark(f"Warning PrefixCollapse: {warnings[0]['message']}")
    hpa = incident.hpa()
    assert hpa["spec"]["maxReplicas"] == scenario.PODS, "held at the pre-collapse replicas"
    patches = incident.patches()
    assert patches in (None, {"horizontalpodautoscalers": 1, "deployments": 0}), patches
    assert "cachescale.dev/original-envelope" in hpa["metadata"]["annotations"]
    described = incident.cluster.kubectl("describe", "csp", APP, "-n", incident.namespace)
    assert described.returncode == 0, described.stderr
    for words in ("token hit rate", "PrefixCollapse", "CollapseHold", "Warning"):
        assert words in described.stdout, (words, described.stdout)
    # The spec as written: the API server stores no default but the mode's.
    for left_out in ("Cooldown:", "Collapse Relative Drop:", "Restore On Delete:", "Engine:"):
        assert left_out not in described.stdout, (left_out, described.stdout)
    # The decision memory is one packed line, not its internals.
    (memory,) = [line for line in described.stdout.splitlines() if "Learned State:" in line]
    assert memory.split()[-1].startswith("v1:"), memory
    for internal in ("Streaks:", "Max Replicas Marks:", "Recent Replicas:"):
        assert internal not in described.stdout, (internal, described.stdout)
    # Nothing said twice: no kopf diff base, no baseline or history beside learnedState and
    # the Events, the generation once for every condition (api/status.py).
    for repeated in ("last-handled-configuration", "kopf-managed", "Baseline:", "History:"):
        assert repeated not in described.stdout, (repeated, described.stdout)
    assert described.stdout.count("Observed Generation:") == 1, described.stdout
    lines = len(described.stdout.splitlines())
    assert lines <= DESCRIBE_LINES, (lines, described.stdout)
    incident.mark(f"kubectl describe csp: {lines} lines")
    listed = incident.cluster.kubectl("get", "csp", APP, "-n", incident.namespace)
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "MODE",
        "READY",
        "HIT-RATE",
        "TTFT-P95",
        "GPU-S/1K",
        "REPLICAS",
        "STATE",
        "AGE",
    ]
    cells = row.split()
    assert (cells[1], cells[2], cells[7]) == ("Enforce", "True", "PrefixCollapse"), row
    assert all(cell not in ("", "<none>") for cell in cells), row
    assert re.fullmatch(r"[01]\.[0-9]{2}", cells[3]), row  # two decimals
    assert float(cells[3]) < 0.4, row
    assert re.fullmatch(r">?[0-9.,]+s(\(.*\))?", cells[4]), row  # TTFT p95 as read
    assert re.fullmatch(r"[0-9]+", cells[5]), row  # GPU-s/1k, a whole number
    assert int(cells[5]) > 0, row
    for figure in (cells[3], cells[4].split("(")[0], cells[5]):
        digits = figure.strip(">s").replace(",", "").replace(".", "").strip("0")
        assert len(digits) <= 3, (figure, row)  # no more than 3 significant digits
    assert cells[6] == str(scenario.PODS), row
    incident.mark(f"kubectl get csp: {row}")


def test_kill_9_and_restart_changes_nothing_twice(incident: Incident) -> None:
    before = incident.status()
    hpa_before = incident.hpa()
    deployment = get(incident.cluster, "deployment", APP, "-n", incident.namespace)
    patches = incident.patches()
    warnings = len(incident.warnings("PrefixCollapse"))
    assert incident.condition("CacheHealthy") == ("False", "PrefixCollapse"), "mid-collapse"
    incident.operator.process.kill()  # SIGKILL: no cleanup, no handover
    incident.operator.process.wait()
    incident.mark("operator killed with SIGKILL mid-collapse")
    incident.start_operator("restarted")
    incident.mark("operator restarted")
    seen: list[float | None] = [None]

    def evaluated_twice() -> bool | None:
        # The restarted process's own gauge: its status writes happen only on change.
        observed = incident.operator.last_evaluation(incident.namespace, APP)
        if observed != seen[-1]:
            seen.append(observed)
        return True if len(seen) >= 3 else None

    until(evaluated_twice, "two evaluations by the restarted operator", 60)
    incident.mark("two evaluations after the restart")
    after = incident.status()
    assert incident.condition("CacheHealthy") == ("False", "PrefixCollapse"), incident.story()
    assert learned_baseline(after) == learned_baseline(before), "the baseline survives, frozen"
    assert [a["reason"] for a in after["alerts"]] == ["PrefixCollapse"]
    assert after["alerts"][0]["since"] == before["alerts"][0]["since"], "the same alert"
    assert incident.hpa()["spec"] == hpa_before["spec"]
    now = get(incident.cluster, "deployment", APP, "-n", incident.namespace)
    assert now["metadata"]["generation"] == deployment["metadata"]["generation"], "no args patch"
    if patches is not None:  # the API server's own count (envtest's audit log)
        assert incident.patches() == patches, "no second HPA or Deployment patch"
        incident.mark(f"writes by the operator so far (audit log): {patches}")
    assert len(incident.warnings("PrefixCollapse")) == warnings, "no duplicate Warning Event"


def test_deleting_the_policy_restores_the_hpa_and_releases_the_finalizer(
    incident: Incident,
) -> None:
    deleted = incident.cluster.kubectl(
        "delete", "csp", APP, "-n", incident.namespace, "--timeout=60s"
    )
    assert deleted.returncode == 0, deleted.stderr
    incident.mark("kubectl delete csp returned")
    assert get(incident.cluster, "csp", APP, "-n", incident.namespace) is None
    hpa = incident.hpa()
    assert hpa["spec"]["maxReplicas"] == incident.original_hpa["maxReplicas"]
    assert hpa["spec"]["minReplicas"] == incident.original_hpa["minReplicas"]
    assert "cachescale.dev/original-envelope" not in hpa["metadata"].get("annotations", {})
    assert "Traceback" not in incident.operator.output()
