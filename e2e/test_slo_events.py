"""An SLO breach and its recovery, as Events on a real API server.

What runs where: the API server and the controllers are real (envtest, or the cluster in
KUBECONFIG); the operator runs out of cluster as ``cachescale run`` with a TokenRequest
token for the chart's ServiceAccount; the serving Deployment's pods are real. The
"Prometheus" is the scripted fake on loopback (tests/gather/gather_fakes.py) answering the
gather layer's queries for a healthy fleet of those pods whose TTFT p95 is
``SERVED_P95_S`` (tests/controller/engine_fake.py): no scrape to wait for.

The policy's TTFT p95 objective is set below that, in Advise mode so nothing is patched:
once the breach has held for ``cache.collapseWindows`` evaluations, ``SLOMet`` turns False
and the operator posts a Warning ``SLOAtRisk`` that quotes the p95 read and the objective.
The objective is then raised above the p95, and the next evaluation posts a Normal
``SLOMetRecovered`` quoting the p95 within the new objective and how long the breach lasted
(controller/reconcile/condition_events.py).

Wall time is bound by the policy's minimum window: nothing is decided before a full minute
of data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, condition_of, events_for, get, until
from e2e.operators import operator_process
from e2e.serving import APP, create_stack
from tests.controller.cluster import policy as policy_body
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess
from tests.gather.gather_fakes import fake_prometheus

MODEL = "llama-3-8b"
PODS = 2
SERVED_P95_S = 0.5
"""The fake engines' TTFT p95."""
TIGHT_SLO_S = 0.01
"""Below what the engines serve: a breach."""
LOOSE_SLO_S = 60.0
"""Far above it: met again."""
WINDOWS = 1
"""``cache.collapseWindows``: the breach warns at the first evaluation that may decide."""
BREACH_TIMEOUT_S = 120.0
"""Nothing is decided before the policy's first full window (1m, the least there is) of
data; evaluations are 10 s apart."""
RECOVERY_TIMEOUT_S = 40.0
SECONDS = r"([0-9][0-9,]*(?:\.[0-9]+)?) s"
WARNING = re.compile(
    rf"^SLOMet=False: TTFT p95 {SECONDS}.* above the {SECONDS} SLO, (\d+) evaluations? in a row$"
)
RECOVERED = re.compile(
    rf"^SLOMet=True: TTFT p95 {SECONDS}.* within the {SECONDS} SLO; it was False \(SLOAtRisk\)"
    r" for \d+ (s|min) from \d\d:\d\d UTC$"
)


def events(cluster: Cluster, namespace: str, kind: str, reason: str) -> list[dict[str, Any]]:
    """The policy's Events of type ``kind`` and ``reason``."""
    found = events_for(cluster, namespace, "CacheScalingPolicy", APP)
    return [e for e in found if e["type"] == kind and e["reason"] == reason]


def story(cluster: Cluster, namespace: str, operator: OperatorProcess) -> str:
    """What to read when a wait times out: conditions, Events, the operator's log."""
    status = (get(cluster, "csp", APP, "-n", namespace) or {}).get("status", {})
    brief = {key: status.get(key) for key in ("state", "conditions", "signals")}
    found = events_for(cluster, namespace, "CacheScalingPolicy", APP)
    posted = [f"{e['type']} {e['reason']}: {e['message']}" for e in found]
    return "\n".join([json.dumps(brief, indent=1, default=str), *posted, operator.tail(30)])


def one_event(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    kind: str,
    reason: str,
    timeout_s: float,
) -> dict[str, Any]:
    """Wait for the policy's ``kind`` Event of ``reason``; there must be exactly one."""

    def posted() -> list[dict[str, Any]] | None:
        return events(cluster, namespace, kind, reason) or None

    try:
        found = until(posted, f"a {kind} {reason} Event", timeout_s)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{story(cluster, namespace, operator)}") from None
    assert len(found) == 1, found
    print(f"{kind} {reason}: {found[0]['message']}")
    return found[0]


def test_an_slo_breach_warns_and_its_recovery_is_a_normal_event(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    _, pods = create_stack(cluster, namespace, MODEL, PODS)
    selector = {"namespace": namespace, "model_name": MODEL}
    engines = EngineFake()
    engines.set(selector, EngineNumbers(pods=tuple(pods), ttft_p95_s=SERVED_P95_S))
    with (
        fake_prometheus() as prometheus,
        operator_process(
            tmp_path / "operator", kubeconfig, (namespace,), flags=LOOPBACK_PROMETHEUS
        ) as operator,
    ):
        prometheus.respond = engines
        body = policy_body(
            APP,
            prometheus_url=prometheus.url,
            mode="Advise",
            extra={
                "metrics": {"selector": selector},
                "slo": {"ttftP95Seconds": TIGHT_SLO_S},
                "budget": {"gpuSecondsPer1kRequests": 100_000.0},
                "cache": {"collapseWindows": WINDOWS},
            },
        )
        body["metadata"] = {"name": APP}
        apply(cluster, namespace, body)

        warning = one_event(cluster, namespace, operator, "Warning", "SLOAtRisk", BREACH_TIMEOUT_S)
        quoted = WARNING.match(warning["message"])
        assert quoted, warning["message"]
        p95, objective, streak = float(quoted[1].replace(",", "")), quoted[2], int(quoted[3])
        assert p95 > TIGHT_SLO_S, warning["message"]
        assert objective == "0.01", warning["message"]
        assert streak == WINDOWS, warning["message"]
        policy = get(cluster, "csp", APP, "-n", namespace)
        slo = condition_of(policy, "SLOMet") or {}
        assert (slo.get("status"), slo.get("reason")) == ("False", "SLOAtRisk"), slo
        assert not events(cluster, namespace, "Normal", "SLOMetRecovered")

        raised = cluster.kubectl(
            "patch", "csp", APP, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"slo": {"ttftP95Seconds": LOOSE_SLO_S}}}),
        )  # fmt: skip
        assert raised.returncode == 0, raised.stderr

        recovery = one_event(
            cluster, namespace, operator, "Normal", "SLOMetRecovered", RECOVERY_TIMEOUT_S
        )
        quoted = RECOVERED.match(recovery["message"])
        assert quoted, recovery["message"]
        assert float(quoted[1].replace(",", "")) < LOOSE_SLO_S, recovery["message"]
        assert quoted[2] == "60", recovery["message"]
        slo = condition_of(get(cluster, "csp", APP, "-n", namespace), "SLOMet") or {}
        assert (slo.get("status"), slo.get("reason")) == ("True", "TTFTWithinSLO"), slo
        assert len(events(cluster, namespace, "Warning", "SLOAtRisk")) == 1, "one Warning"
        assert "Traceback" not in operator.output()
