"""Check 5: the collapse path on real vLLM, from a prompt-template change to the alert.

What runs: two real vLLM servers started together (``referee.fleet``, one OpenMP thread
each, so both fit on two cores); the envtest API server with its real controllers and the
node stand-in, where Deployment ``vllm`` and its HPA are made as e2e/serving.py makes them
(two real pods); the chart installed with its default values; ``cachescale run`` as the
chart's ServiceAccount (a TokenRequest token), as e2e/test_operator_incident.py runs it;
a real Prometheus scraping vLLM server N as real pod N (``namespace``/``pod`` labels, as a
pod scrape adds them); a CacheScalingPolicy (Enforce, ``onCollapse: Hold``, the shortest
window and interval the CRD admits, 1m and 10s) on the Deployment, selecting vLLM's own
series by namespace and ``model_name``.

The story (module-scoped, the tests run in order on one stand):

1. Multi-turn chat load (``referee.load``) whose sessions share a few system prompts:
   the operator waits a full window, learns a baseline and evaluates
   ``STEADY_EVALUATIONS`` more times. Nothing is alarmed meanwhile: no alert of any kind,
   ``CacheHealthy`` never ``PrefixCollapse``, ``CollapseSuspected`` or ``CacheDegraded``,
   no Warning Event; and the baseline is vLLM's hit rate (within ``BASELINE_TOLERANCE``
   of raw PromQL over the last window before the switch).
2. Every client switches at once to a template that writes the time, to the millisecond,
   at the top of the system prompt (``referee.load.timestamp_at_top``): vLLM's prefix
   cache then misses from the first block of every prompt. ``PrefixCollapse`` is raised
   (``CacheHealthy=False``, one Warning Event, the HPA held at the pre-collapse replicas)
   without ``CacheDegraded`` on the way; the alert quotes the baseline and the warm hit
   rate the decision used: the status' own, and the second equal to raw PromQL over
   vLLM's counters at the evaluation's time.

The client count stays under ``--max-num-seqs`` on each server, so the running batch is
never near its ceiling and eviction pressure (which would excuse the fall) cannot hold.
Figures of a run: docs/design/real-vllm-signals.md, "The collapse path".
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from e2e.harness.cluster import Cluster, session_cluster, tool, why_no_cluster
from e2e.harness.release import CHART, Release, uninstall, wait_flags
from e2e.kube_helpers import apply, events_for, get
from e2e.serving import APP, create_stack
from e2e.tenancy import grant_enforce
from referee.fleet import FleetLoad, fleet_load, in_background, run_fleet, scrape_as_pods
from referee.load import ChatLoad
from referee.vllm import MODEL_NAME, EngineSettings, vllm_venv
from tests.controller.cluster import learned_baseline
from tests.controller.cluster import policy as policy_body
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess, run_operator
from tests.controller.test_operator_process import EVIDENCE
from tests.polling import wait_for
from tests.prometheus_fixture import PrometheusServer, prometheus_binary
from tests.tools import require_tool

T = TypeVar("T")

PODS = 2
ENGINE = EngineSettings(max_num_seqs=8)
CLIENTS = 6
"""Clients per server: under 0.9 × ``--max-num-seqs``, so eviction pressure cannot hold."""
SCRAPE_S = 2.0
"""As the other referee modules: vLLM answers /metrics slower while it serves."""
NAMESPACE = "cachescale-referee-collapse"
STEADY_EVALUATIONS = 1
"""Evaluations after the one that learns the baseline, before the template switches (and
the next few, while the window still holds mostly the old template, must stay quiet too:
no ``CacheDegraded`` on the way down)."""
BASELINE_TIMEOUT_S = 150.0
"""A full window (60 s) after the first evaluation, plus an interval, on loaded cores."""
COLLAPSE_WINDOWS = 3
"""The policy's ``collapseWindows`` (left at its default)."""
COLLAPSE_TIMEOUT_S = 180.0
"""The windowed rate falls under the threshold once about half its window holds the new
template, then three evaluations 10 s apart confirm it: about a minute."""
POLL_S = 0.5
BASELINE_TOLERANCE = 0.03
"""The learned baseline against the raw hit rate over the last window before the switch:
the baseline is the mean of the windowed rates the operator read over the steady load."""
HALF_DISPLAYED = 0.005
"""Half the last digit of a hit rate as status and messages show it (0.01)."""
SUSPECTED = ("Unknown", "CollapseSuspected")
FALSE_ALARMS = ("PrefixCollapse", "CollapseSuspected", "CacheDegraded")
"""``CacheHealthy`` reasons no steady load may show."""


@dataclass(frozen=True)
class Stand:
    """The Kubernetes side: the cluster, the namespace, the operator's kubeconfig, the pods."""

    cluster: Cluster
    namespace: str
    kubeconfig: Path
    pods: list[str]


@contextmanager
def serving_stand(workdir: Path) -> Iterator[Stand]:
    """The session cluster (started in this thread: its binaries die with the thread that
    forked them), the chart installed once, the Deployment and HPA with Ready pods."""
    with session_cluster() as cluster:
        release = Release()
        installed = cluster.helm(
            "install", release.name, str(CHART), "-n", release.namespace,
            "--create-namespace", *wait_flags(cluster),
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        created = cluster.kubectl("create", "namespace", NAMESPACE)
        assert created.returncode == 0, created.stderr
        grant_enforce(cluster, release, NAMESPACE)
        kubeconfig = cluster.token_kubeconfig(
            workdir / "operator.kubeconfig", release.namespace, release.service_account
        )
        _, pods = create_stack(cluster, NAMESPACE, MODEL_NAME, PODS, ENGINE.max_num_seqs)
        try:
            yield Stand(cluster, NAMESPACE, kubeconfig, pods)
        finally:
            if not cluster.envtest:  # an envtest control plane goes with everything in it
                cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
                uninstall(cluster, release)


@dataclass
class Seen:
    """One poll of the policy: when (Unix time), its state, CacheHealthy, the alerts'
    reasons."""

    at: float
    state: str | None
    cache_healthy: tuple[str, str] | None
    alerts: list[str]


@dataclass
class Story:
    """The running stand, what the test saw of it, and the figures it measured."""

    stand: Stand
    operator: OperatorProcess
    prometheus: PrometheusServer
    load: FleetLoad
    started: float = field(default_factory=time.monotonic)
    timeline: list[str] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    switched_at: float | None = None
    """Unix time of the template switch."""

    def mark(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.1f}s: {what}")

    def status(self) -> dict[str, Any]:
        found = get(self.stand.cluster, "csp", APP, "-n", self.stand.namespace)
        return dict(found.get("status", {})) if found else {}

    def observe(self) -> dict[str, Any]:
        """The policy's status now, recorded when it differs from the last poll."""
        status = self.status()
        healthy = next(
            (
                (entry["status"], entry["reason"])
                for entry in status.get("conditions", [])
                if entry["type"] == "CacheHealthy"
            ),
            None,
        )
        seen = Seen(
            time.time(),
            status.get("state"),
            healthy,
            [alert["reason"] for alert in status.get("alerts", [])],
        )
        last = self.seen[-1] if self.seen else None
        if last is None or (last.state, last.cache_healthy, last.alerts) != (
            seen.state,
            seen.cache_healthy,
            seen.alerts,
        ):
            self.seen.append(seen)
            self.mark(f"{seen.state}, CacheHealthy {seen.cache_healthy}, alerts {seen.alerts}")
        return status

    def until(self, check: Callable[[dict[str, Any]], T | None], what: str, timeout_s: float) -> T:
        """Observe every ``POLL_S`` until ``check(status)`` is not None; fail with the story."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.operator.process.poll() is not None:
                raise AssertionError(f"the operator exited while waiting for {what}\n{self}")
            found = check(self.observe())
            if found is not None:
                self.mark(what)
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}\n{self}")
            time.sleep(POLL_S)

    def evaluated_after(self, after: float) -> Callable[[dict[str, Any]], bool | None]:
        """A check for ``until``: the operator began an evaluation of the policy after
        ``after`` and finished it (its own gauge, which moves even when the status write
        is skipped as unchanged)."""

        def evaluated(_: dict[str, Any]) -> bool | None:
            at = self.operator.last_evaluation(self.stand.namespace, APP)
            return True if at is not None and at > after else None

        return evaluated

    def warnings(self) -> list[dict[str, Any]]:
        events = events_for(self.stand.cluster, self.stand.namespace, "CacheScalingPolicy", APP)
        return [event for event in events if event["type"] == "Warning"]

    def raw(self, metric: str, at: float) -> float:
        """Raw PromQL: the fleet's rate of vLLM counter ``metric`` over the policy's 1m
        window at Unix time ``at``."""
        selector = f'{{namespace="{self.stand.namespace}",model_name="{MODEL_NAME}"}}'
        promql = f"sum(rate({metric}{selector}[1m]))"
        data = self.prometheus.api("query", query=promql, time=f"{at:.3f}")
        return float(data["result"][0]["value"][1])

    def hit_rate(self, at: float) -> float:
        """The fleet's token hit rate over the policy's window at ``at``, from vLLM's own
        counters (every pod is warm: ``podWarmupSeconds`` is 0)."""
        hits = self.raw("vllm:prefix_cache_hits_total", at)
        return hits / self.raw("vllm:prefix_cache_queries_total", at)

    def requests_per_second(self, at: float) -> float:
        """Requests served per second over the policy's window at ``at``."""
        return self.raw("vllm:request_success_total", at)

    def __str__(self) -> str:
        status = self.status()
        brief = {key: status.get(key) for key in ("state", "conditions", "signals", "alerts")}
        brief["baseline"] = learned_baseline(status)
        return "\n".join(
            [*self.timeline, json.dumps(brief, indent=1, default=str), self.operator.tail(40)]
        )


def wait_for_rates(prometheus: PrometheusServer, namespace: str) -> None:
    """Until every pod has a request rate, a TTFT rate and a hit rate (the operator's
    required signals), so its first evaluation reads them and freezes on nothing."""
    selector = f'{{namespace="{namespace}",model_name="{MODEL_NAME}"}}'
    queries = [
        f"rate(vllm:prefix_cache_queries_total{selector}[1m]) > 0",
        f"rate(vllm:time_to_first_token_seconds_count{selector}[1m]) > 0",
        f"rate(vllm:request_success_total{selector}[1m]) > 0",
    ]
    wait_for(
        lambda: True if all(len(prometheus.query(q)) >= PODS for q in queries) else None,
        60.0,
        "Prometheus to hold rates for every vLLM pod",
    )


def apply_policy(stand: Stand, prometheus: PrometheusServer) -> None:
    """The policy on the Deployment: the e2e incident's, with vLLM's ``model_name`` and a
    TTFT SLO the CPU engine keeps (the test is about the cache, not latency)."""
    body = policy_body(
        APP,
        prometheus_url=prometheus.url,
        extra={
            "metrics": {"selector": {"namespace": stand.namespace, "model_name": MODEL_NAME}},
            "budget": {"gpuSecondsPer1kRequests": 100_000.0},
            "cache": {"onCollapse": "Hold"},
            "slo": {"ttftP95Seconds": 30.0},
        },
    )
    body["metadata"] = {"name": APP}
    apply(stand.cluster, stand.namespace, body)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    """The whole stand, the load running with the stable template and the policy applied."""
    reason = why_no_cluster()
    require_tool(reason is None, reason or "")
    require_tool(tool("helm") is not None, "helm is not in .tools/bin (make tools) nor on PATH")
    prometheus_binary()
    vllm_venv()
    workdir = tmp_path_factory.mktemp("collapse")
    started = time.monotonic()
    with ExitStack() as stack:
        fleet = stack.enter_context(in_background(run_fleet(workdir, ENGINE, PODS)))
        stand = stack.enter_context(serving_stand(workdir))
        operator = stack.enter_context(
            run_operator(workdir, stand.kubeconfig, stand.namespace, LOOPBACK_PROMETHEUS)
        )
        ready = f"stand ready in {time.monotonic() - started:.1f}s: pods {stand.pods}"
        servers = fleet.result()
        metrics = workdir / "prometheus"
        metrics.mkdir()
        prometheus = stack.enter_context(
            scrape_as_pods(metrics, servers, stand.namespace, stand.pods, SCRAPE_S)
        )
        load = stack.enter_context(fleet_load(servers, ChatLoad(clients=CLIENTS)))
        story = Story(stand, operator, prometheus, load, started=started)
        story.mark(ready)
        story.mark(f"{PODS} vLLM servers healthy, scraped; load started")
        wait_for_rates(prometheus, stand.namespace)
        apply_policy(stand, prometheus)
        story.mark("policy applied")
        yield story
    runs = story.load.runs
    story.mark(f"load stopped: {[run.requests for run in runs]} requests per server")
    print("\n".join(story.timeline))
    print(json.dumps(story.figures, indent=1))
    assert not [failure for run in runs for failure in run.failures], runs


def test_no_false_alarm_while_the_prompts_share_their_prefixes(story: Story) -> None:
    def learned(status: dict[str, Any]) -> float | None:
        rate: float | None = learned_baseline(status).get("tokenHitRate")
        return rate

    baseline = story.until(learned, "a baseline learned", BASELINE_TIMEOUT_S)
    for count in range(1, STEADY_EVALUATIONS + 1):
        story.until(story.evaluated_after(time.time()), f"steady evaluation {count}", 60.0)
    healthy = [seen.cache_healthy for seen in story.seen]
    assert ("True", "HitRateAtBaseline") in healthy, str(story)
    alarms = [s for s in story.seen if s.alerts or (s.cache_healthy or ("", ""))[1] in FALSE_ALARMS]
    assert not alarms, str(story)
    assert story.warnings() == [], str(story)
    at_switch = learned_baseline(story.observe())["tokenHitRate"]
    story.switched_at = time.time()
    story.load.stamp.set()
    story.mark("template switched: the time at the top of the system prompt")
    raw = story.hit_rate(story.switched_at)
    story.figures |= {
        "baseline_learned": baseline,
        "baseline_at_switch": at_switch,
        "hit_rate_at_switch_raw": raw,
        "requests_per_second_at_switch": story.requests_per_second(story.switched_at),
    }
    assert at_switch == pytest.approx(raw, abs=BASELINE_TOLERANCE), story.figures


def test_the_timestamp_at_the_top_raises_prefix_collapse(story: Story) -> None:
    if story.switched_at is None:
        pytest.fail("the template never switched: the steady phase failed (see above)")
    switched = story.switched_at

    def collapsed(status: dict[str, Any]) -> dict[str, Any] | None:
        healthy = [seen.cache_healthy for seen in story.seen]
        assert ("False", "CacheDegraded") not in healthy, "CacheDegraded on the way down"
        alerts = [a for a in status.get("alerts", []) if a["reason"] == "PrefixCollapse"]
        return status if alerts else None

    status = story.until(collapsed, "PrefixCollapse raised", COLLAPSE_TIMEOUT_S)
    alert = next(a for a in status["alerts"] if a["reason"] == "PrefixCollapse")
    condition = next(c for c in status["conditions"] if c["type"] == "CacheHealthy")
    assert (condition["status"], condition["reason"]) == ("False", "PrefixCollapse"), str(story)
    evidence = re.search(EVIDENCE, alert["message"])
    assert evidence, alert["message"]
    before, after, windows, warm = evidence.groups()
    baseline = learned_baseline(status)
    assert before == f"{baseline['tokenHitRate']:.2f}", (alert["message"], status)
    assert after == f"{status['signals']['tokenHitRate']:.2f}", (alert["message"], status)
    assert int(windows) >= COLLAPSE_WINDOWS, alert["message"]
    assert int(warm) == PODS, alert["message"]
    observed = datetime.fromisoformat(status["signals"]["observedAt"]).timestamp()
    raw_after = story.hit_rate(observed)
    # Asked again at the same timestamp, Prometheus may hold a scrape it had not yet
    # ingested when the operator read (the scrape is stamped at its start): the windowed
    # rate then moves by that one sample. Equal to what users read (two decimals) stays.
    assert status["signals"]["tokenHitRate"] == pytest.approx(raw_after, abs=HALF_DISPLAYED)
    since = datetime.fromisoformat(alert["since"]).timestamp()
    suspected = next(s.at for s in story.seen if s.cache_healthy == SUSPECTED)
    story.mark(f"alert: {alert['message']}")
    story.figures |= {
        "baseline_at_raise": baseline["tokenHitRate"],
        "hit_rate_at_raise": status["signals"]["tokenHitRate"],
        "hit_rate_at_raise_raw": raw_after,
        "requests_per_second_at_raise": story.requests_per_second(observed),
        "suspected_after_switch_s": suspected - switched,
        "raised_after_switch_s": since - switched,
    }
    warnings = [w for w in story.warnings() if w["reason"] == "PrefixCollapse"]
    assert [w["message"] for w in warnings] == [alert["message"]], warnings
    assert [w["reason"] for w in story.warnings()] == ["PrefixCollapse"], story.warnings()

    def held() -> bool | None:
        hpa = get(story.stand.cluster, "hpa", APP, "-n", story.stand.namespace)
        return True if hpa["spec"]["maxReplicas"] == PODS else None

    wait_for(held, 30.0, f"the HPA's maxReplicas held at the pre-collapse {PODS}")
    assert "Traceback" not in story.operator.output()
