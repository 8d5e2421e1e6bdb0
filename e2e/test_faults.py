"""Faults on the real control plane, with one healthy policy in Enforce mode.

What runs where: etcd, the API server and the controllers are the session's envtest
control plane (the faults kill and restart them, so a cluster from KUBECONFIG is not
used: these tests skip there); the chart is installed (``release`` fixture) and the
operator runs as its ServiceAccount, as the real ``cachescale run`` process. The
"Prometheus" is a real HTTP server in this process that answers the gather layer's
queries with a healthy fleet (tests/controller/engine_fake.py) and can be switched to
slow, hanging, killed, or answering garbage.

Every case checks the same things from the API server's own record (the audit log) and
the objects: the HPA is never scaled down or half-written, no write is repeated, no alert
is raised that the fleet does not deserve, the learned baseline survives, and the policy
says what is wrong while it is wrong. Each case records what it saw and how long recovery
took; docs/reliability.md holds the table (set ``CACHESCALE_FAULTS_REPORT`` to a path to
get the rows of a run as JSON).

The machinery (the switchable Prometheus, the readers of the audit log and of the HPA's
versions, the stack and its checks) is in e2e/fault_rig.py; this module holds the stack's
fixture and the cases. The tests run in order on one stack (module-scoped), a little over
4 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from cachescale.api.policy import GROUP, ORIGINAL_ENVELOPE, PLURAL, VERSION
from e2e.fault_rig import (
    SLOW_S,
    AuditTail,
    Faults,
    HpaWatch,
    Mode,
    SwitchablePrometheus,
    managed,
    wait,
    when,
)
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply
from e2e.serving import APP, create_stack
from e2e.tenancy import grant_enforce
from tests.controller.cluster import policy as policy_body
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, run_operator
from tests.polling import wait_for

MODEL = "faults-model"
PODS = 2
INTERVAL_S = 10.0
"""The policy's evaluation interval (the smallest the API allows)."""
DOWN_S = 5.0
"""How long a killed component stays down before it is started again (its own start-up
time, several seconds for the API server, comes on top)."""
REPORT_ENV = "CACHESCALE_FAULTS_REPORT"
UNAVAILABLE = "MetricsUnavailable"
"""The one alert a Prometheus outage deserves (it says the envelope is held open)."""


# -- the stack -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faults(
    cluster: Cluster, release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Faults]:
    plane = cluster.plane
    if plane is None:
        pytest.skip("the fault tests kill and restart the control plane: envtest only")
    workdir = tmp_path_factory.mktemp("faults")
    namespace = f"cachescale-e2e-faults-{int(time.time()) % 100000}"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    kubeconfig = cluster.token_kubeconfig(
        workdir / "operator.kubeconfig", release.namespace, release.service_account
    )
    grant_enforce(cluster, release, namespace)  # Enforce: rbac.enforceNamespaces
    _, pods = create_stack(cluster, namespace, MODEL, PODS)
    selector = {"namespace": namespace, "model_name": MODEL}
    engines = EngineFake()
    engines.set(selector, EngineNumbers(pods=tuple(pods)))
    prometheus = SwitchablePrometheus(engines)
    prometheus.start()
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    with ExitStack() as stack:
        stack.callback(prometheus.kill)
        operator = stack.enter_context(
            run_operator(workdir, kubeconfig, namespace, LOOPBACK_PROMETHEUS)
        )
        found = Faults(
            cluster, plane, namespace, kubeconfig, workdir, user, prometheus, stack, operator
        )
        # A budget that does not bind at the fake's demand (32 req/s × 2000 / 1000 = 64
        # replicas > maxReplicas 40): the steady state writes nothing to the HPA, and a
        # higher budget.maxReplicas is a raise the operator applies at once (a lowering
        # would wait out the 300 s stabilization window).
        body = policy_body(
            APP,
            prometheus_url=prometheus.url,
            extra={
                "metrics": {"selector": selector},
                "budget": {"gpuSecondsPer1kRequests": 2000, "maxReplicas": 40},
            },
        )
        body["metadata"] = {"name": APP}
        apply(cluster, namespace, body)
        yield found
        report = os.environ.get(REPORT_ENV)
        if report:
            Path(report).write_text(
                json.dumps([row.__dict__ for row in found.rows], indent=1), encoding="utf-8"
            )
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


# -- the cases -----------------------------------------------------------------------------


def test_a_healthy_policy_settles(faults: Faults) -> None:
    """The starting point of every case: baseline learned, nothing written to the HPA."""

    def settled() -> bool | None:
        healthy = faults.condition("CacheHealthy")
        return True if healthy and healthy[:2] == ("True", "HitRateAtBaseline") else None

    try:
        wait(settled, 120, "CacheHealthy=True with a baseline")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{faults.story()}") from None
    steady = faults.steady()
    assert steady.baseline.get("tokenHitRate"), faults.story()
    assert steady.hpa_patches == 0, f"the budget does not bind\n{faults.story()}"
    assert steady.warnings == [], steady.warnings
    available = faults.condition("MetricsAvailable")
    assert available, faults.story()
    assert available[:2] == ("True", "SignalsRead"), faults.story()
    faults.record(
        "none (the steady state)",
        f"baseline hit rate {steady.baseline['tokenHitRate']:.2f}; "
        f"{steady.hpa_patches} HPA patch(es); no alert",
        None,
    )


BURST_WINDOW_S = INTERVAL_S
"""How long after a recovery the operator's writes are counted (a burst shows there)."""
RELIST_TIMEOUT_S = 60.0
"""How long the policies' relist may take after the API server serves again. kopf retries
the 403 (authorizer not synced) and 429 (storage initializing) that a restarting API server
answers for a while with waits of 1, 1, 2, 3, 5, 8, 13 and 21 s before it reaches the 410,
so the relist can come well after the burst window."""


@pytest.mark.parametrize(
    "fault",
    [
        "kube-apiserver",
        "etcd",
        pytest.param("watch-expired", id="watch-expired"),
    ],
)
def test_control_plane_component_killed_and_restarted(faults: Faults, fault: str) -> None:
    """``watch-expired``: the API server is killed and, while it is down, etcd's history
    is compacted, so the watch the operator resumes from its last resourceVersion can only
    be answered 410 Gone: it must list again, and not write more for it."""
    component = "etcd" if fault == "etcd" else "kube-apiserver"
    before = faults.steady()
    quiet = faults.writes_between(time.time() - BURST_WINDOW_S, time.time())
    killed_at = time.time()
    faults.plane.kill(component)
    time.sleep(DOWN_S)
    if fault == "watch-expired":
        faults.plane.compact_etcd()
    faults.plane.restart(component)
    if component == "etcd":  # the API server answers again once it sees etcd
        faults.plane.wait_serving(faults.plane.component("kube-apiserver"))
    serving = time.time()
    # Its next evaluation: it writes the status only if the outage left it out of date.
    first = faults.next_evaluation(serving, 6 * INTERVAL_S)
    time.sleep(max(0.0, serving + BURST_WINDOW_S - time.time()))
    burst = faults.writes_between(serving, serving + BURST_WINDOW_S)
    assert faults.operator.process.poll() is None, faults.operator.tail()
    # Its evaluations during the outage failed as API errors, none as a crash.
    assert "Traceback" not in faults.operator.output(), faults.operator.tail()
    faults.check_unharmed(before, f"{fault} restarted")
    assert len(burst) <= len(quiet) + 1, (
        f"a write burst after {fault}: {len(burst)} writes in {BURST_WINDOW_S:g} s against "
        f"{len(quiet)} before: {[_what(e) for e in burst]}"
    )
    if fault == "watch-expired":
        relisted_at = wait(
            lambda: faults.first_policy_list(killed_at), RELIST_TIMEOUT_S, "a relist of policies"
        )
        print(f"\nrelisted {relisted_at - serving:.1f} s after the API server served again")
    reads = faults.policy_reads(killed_at)
    relisted = any(e["verb"] == "list" for e in reads)
    if component == "kube-apiserver":  # its connections died with it: a new watch or list
        assert reads, f"the operator never listed or watched policies again\n{faults.story()}"
    # etcd alone: the API server may keep the operator's watch open across it.
    how_back = "relisted" if relisted else "resumed its watch" if reads else "kept its watch"
    how = f"SIGKILL, down {DOWN_S:g} s, restarted"
    faults.record(
        {
            "kube-apiserver": f"API server killed ({how})",
            "etcd": f"etcd killed ({how})",
            "watch-expired": "watch expired: API server killed, etcd compacted, restarted",
        }[fault],
        f"operator {how_back}; "
        f"{len(burst)} write(s) in the {BURST_WINDOW_S:g} s after ({len(quiet)} in as long "
        "before); "
        "no HPA patch, no alert, baseline kept",
        first - serving,
    )


def _what(event: dict[str, Any]) -> str:
    ref = event.get("objectRef", {})
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{event.get('verb')} {ref.get('resource')}{sub} {event.get('requestURI', '')[-60:]}"


def test_operator_killed_with_sigkill_during_a_patch_sequence(faults: Faults) -> None:
    """A higher budget.maxReplicas makes the operator raise the HPA's maxReplicas (and
    record the original envelope); it is killed the moment the API server records that
    patch (before the status write and Event that follow it), restarted, and every version
    of the HPA the server published meanwhile is either the old or the new one."""
    old = faults.envelope()
    patches = faults.hpa_patches()
    watch = HpaWatch(faults.plane, faults.namespace)
    listed = faults.api.get(
        f"/apis/autoscaling/v2/namespaces/{faults.namespace}/horizontalpodautoscalers"
    )
    watch.start(listed["metadata"]["resourceVersion"])  # the list's: newer than a compaction
    tail = AuditTail(faults.plane.directory / "audit.log")
    faults.api.patch(
        f"/apis/{GROUP}/{VERSION}/namespaces/{faults.namespace}/{PLURAL}/{APP}",
        {"spec": {"budget": {"maxReplicas": 48}}},
    )

    def patched() -> dict[str, Any] | None:
        for event in tail.events():
            ref = event.get("objectRef", {})
            if (
                event.get("user", {}).get("username") == faults.user
                and ref.get("resource") == "horizontalpodautoscalers"
                and event.get("verb") == "patch"
            ):
                return event
        return None

    try:
        found = wait_for(patched, 3 * INTERVAL_S, "an HPA patch after the raise", every_s=0.01)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{faults.story()}") from None
    faults.operator.process.kill()
    faults.operator.process.wait()
    killed_at = time.time()
    patched_at = when(found)
    # What the killed process still wrote after the patch (status, Event): from the record.
    after = [e for e in faults.status_writes() if when(e) >= patched_at]
    restarted = faults.start_operator()
    ready = time.time()
    first = faults.next_status_write(ready, 4 * INTERVAL_S)  # a restart's first one writes
    faults.next_evaluation(first, 2 * INTERVAL_S)  # the next one writes only what changed
    watch.stop()
    new = faults.envelope()
    assert old["spec"]["maxReplicas"] == 40, old
    assert new["spec"]["maxReplicas"] == 48, faults.story()
    assert new["annotations"][ORIGINAL_ENVELOPE], "the original envelope is recorded"
    seen = [managed(version) for version in watch.versions]
    assert not watch.errors, watch.errors
    assert seen, "the watch saw no version of the HPA"
    half = [version for version in seen if version not in (old, new)]
    assert not half, f"half-applied HPA versions: {half}"
    assert faults.hpa_patches() == patches + 1, "the restarted operator patched again"
    assert faults.status().get("alerts", []) == [], faults.story()
    assert "Traceback" not in restarted.output()
    faults.record(
        "operator killed (SIGKILL) right after its HPA patch",
        f"{len(seen)} HPA version(s) watched, each old or new (maxReplicas "
        f"{old['spec']['maxReplicas']} → {new['spec']['maxReplicas']}); "
        f"{'a status write landed before the kill' if after else 'killed before its status write'}"
        "; no second patch after restart",
        first - killed_at,
    )


def _tamper(faults: Faults, text: str | None) -> None:
    """Set (or remove, with None) the HPA's original-envelope annotation, as an admin."""
    faults.api.patch(
        f"/apis/autoscaling/v2/namespaces/{faults.namespace}/horizontalpodautoscalers/{APP}",
        {"metadata": {"annotations": {ORIGINAL_ENVELOPE: text}}},
    )


def test_a_tampered_original_envelope_is_refused_and_the_hpa_left_alone(faults: Faults) -> None:
    recorded = faults.envelope()["annotations"][ORIGINAL_ENVELOPE]
    assert recorded, "the previous case left an original envelope on the HPA"
    patches = faults.hpa_patches()
    tampered_at = time.time()
    _tamper(faults, '{"minReplicas": 2, "maxRepl')  # truncated by a hand edit
    # The policy now wants maxReplicas higher still: it must not act on it.
    raised = faults.api.patch(
        f"/apis/{GROUP}/{VERSION}/namespaces/{faults.namespace}/{PLURAL}/{APP}",
        {"spec": {"budget": {"maxReplicas": 56}}},
    )
    generation = raised["metadata"]["generation"]
    before = faults.envelope()

    def refused() -> str | None:
        # From an evaluation that read the raise (its generation) and the tampered record.
        status = faults.status()
        for entry in status.get("conditions", []):
            if (
                entry["type"] == "Ready"
                and (entry["status"], entry["reason"]) == ("False", "TargetMismatch")
                and status.get("observedGeneration") == generation
            ):
                return str(entry["message"])
        return None

    message = wait(refused, 3 * INTERVAL_S, "Ready=False TargetMismatch")
    detected = time.time() - tampered_at
    assert ORIGINAL_ENVELOPE in message, message
    assert "not JSON" in message, message
    assert "TargetMismatch" in faults.warnings(), faults.warnings()
    assert faults.envelope() == before, "the HPA was touched"
    assert faults.hpa_patches() == patches, "a patch on a tampered HPA"
    fixed_at = time.time()
    _tamper(faults, recorded)

    def accepted() -> bool | None:
        ready = faults.condition("Ready")
        raised = faults.hpa()["spec"]["maxReplicas"] == 56
        return True if raised and ready and ready[:2] == ("True", "Evaluated") else None

    wait(accepted, 3 * INTERVAL_S, "Ready=True and the pending raise once the record is back")
    assert faults.hpa_patches() == patches + 1, "one patch: the raise held back meanwhile"
    faults.record(
        "original-envelope annotation truncated by hand",
        f"refused within {detected:.1f} s: Ready=False TargetMismatch and a Warning Event "
        "naming the annotation; no HPA write while it stood (a raise it wanted meanwhile "
        "was held back, then applied once the record was put back)",
        time.time() - fixed_at,
    )


def test_prometheus_killed_slow_and_answering_garbage(faults: Faults) -> None:
    """One fault after another, each held until an evaluation that queried it wrote
    MetricsAvailable=False; then a healthy Prometheus again. Nothing is lowered meanwhile
    (the HPA is compared whole), and the only alert is the outage's own."""
    prometheus = faults.prometheus
    before = faults.steady()

    def unavailable(fault: str, since: float) -> None:
        def down() -> str | None:
            queried = prometheus.first_query_at
            if queried is None:
                return None
            # An evaluation that began after the query: the one that sent it has ended, and
            # written its status (two faults that read alike leave it unchanged, unwritten).
            evaluated = faults.operator.last_evaluation(faults.namespace, APP)
            available = faults.condition("MetricsAvailable")
            done = evaluated is not None and evaluated > queried
            return available[2] if done and available and available[0] == "False" else None

        message = wait(down, 4 * INTERVAL_S + SLOW_S, f"MetricsAvailable=False ({fault})")
        assert "<html" not in message.lower(), f"a response body echoed: {message}"
        faults.check_unharmed(before, fault, UNAVAILABLE)
        cause = message.rsplit("until data returns: ", 1)[-1].split("; ")[0]
        faults.record(
            f"Prometheus {fault}",
            f"MetricsAvailable=False after {time.time() - since:.1f} s: {cause[:160]}; "
            "HPA untouched",
            None,
        )

    # Killed mid-query: a query hangs, then the server dies under it and stays down.
    prometheus.switch(Mode.HANG)
    wait(lambda: True if prometheus.pending else None, 2 * INTERVAL_S, "a pending query")
    killed = time.time()
    prometheus.kill()
    prometheus.first_query_at = killed  # nothing answers now: any later write saw that
    unavailable("killed mid-query (and down)", killed)
    prometheus.switch(Mode.SLOW)
    prometheus.start()
    unavailable(f"slow ({SLOW_S:g} s per query)", time.time())
    for mode in (Mode.MALFORMED, Mode.HTML, Mode.ERROR, Mode.NAN):
        prometheus.switch(mode)
        unavailable(f"answering {mode}", time.time())
    prometheus.switch(Mode.GOOD)
    healthy = time.time()

    def recovered() -> bool | None:
        available = faults.condition("MetricsAvailable")
        return True if available and available[:2] == ("True", "SignalsRead") else None

    wait(recovered, 3 * INTERVAL_S + SLOW_S, "MetricsAvailable=True again")
    recovery = time.time() - healthy
    faults.check_unharmed(before, "after recovery")  # the MetricsUnavailable alert cleared
    warned = faults.warnings().count(UNAVAILABLE) - before.warnings.count(UNAVAILABLE)
    assert warned == 1, f"{warned} Warning Events {UNAVAILABLE}: one for the whole outage"
    decision = (faults.status().get("lastDecision") or {}).get("reason")
    faults.record(
        "Prometheus healthy again after the faults above",
        "MetricsAvailable=True, the MetricsUnavailable alert cleared (one Warning Event for "
        f"the whole outage), HPA untouched, baseline kept; next decision: {decision}",
        recovery,
    )


def test_deleting_the_policy_with_a_tampered_record_restores_nothing(faults: Faults) -> None:
    _tamper(faults, '{"minReplicas": 9, "maxReplicas": 3}')
    before = faults.envelope()
    patches = faults.hpa_patches()
    deleted = faults.cluster.kubectl("delete", "csp", APP, "-n", faults.namespace, "--timeout=60s")
    assert deleted.returncode == 0, deleted.stderr
    assert faults.envelope() == before, "the HPA was restored from a tampered record"
    assert faults.hpa_patches() == patches
    events = faults.api.get(f"/api/v1/namespaces/{faults.namespace}/events")["items"]
    said = [
        e["message"]
        for e in events
        if e["reason"] == "TargetMismatch" and "deleted without restoring" in e["message"]
    ]
    assert said, [e["message"] for e in events]
    assert "minReplicas 9 is above maxReplicas 3" in said[0], said
    faults.record(
        "policy deleted while the record says min 9 > max 3",
        "HPA not restored, left as it was; Warning Event 'deleted without restoring'; "
        "the finalizer released",
        None,
    )
