"""GPU-s per 1k requests as cachescale reads it, against the simulator's truth, in one run.

Run from the repository root (a few minutes on a 2-core machine; the report half needs the
``prometheus`` and ``promtool`` binaries)::

    .venv/bin/python -m bench.bench_cost                      # rag-rechunk, its own seed
    .venv/bin/python -m bench.bench_cost --scenario traffic-doubling --seed 11

One closed-loop simulation under cachescale, read two ways:

1. **The policy**: every evaluation's ``gpu_seconds_per_1k_requests`` (what ``decide``, the
   status and the messages quote) against the truth over the same window (``sim.report``:
   GPU-seconds every pod held, starting and draining ones included, per 1000 requests
   finished in it). Printed: the worst deviation over the run and after the change, how
   many evaluations are off by more than 5%, and the evaluations of the first 15 minutes
   after the change.
2. **``cachescale report``**: every ready pod's vLLM ``/metrics`` and kube-state-metrics'
   view of every pod (GPU requests, scheduled, owners), every 30 s, backfilled into a real
   Prometheus; the report's windows (the scenario's ``report.window_s``) read without and
   with ``--kube-state-metrics``, beside the truth per window, and the verdict's cost change
   against the true change (medians of the windows before and after, as the verdict takes
   them).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

from bench.provenance import provenance
from cachescale.api.spec import Engine
from cachescale.commands.simulate import build_autoscaler
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from cachescale.gather.report import Row, Shift, Window, read_report, windows
from cachescale.gather.selector import Selector
from cachescale.gather.signals import SignalRequest
from cachescale.sim import policy_loop
from cachescale.sim.drive import run
from cachescale.sim.fleet import Pod
from cachescale.sim.observe import ScrapedFleet
from cachescale.sim.report import Windows
from cachescale.sim.scenario import load_builtin
from cachescale.sim.vllm_metrics import VllmReplicaCollector
from cachescale.snapshot import EngineSignals
from tests.gather.gather_tsdb import Series, backfilled_prometheus, prometheus_available

NAMESPACE, MODEL, EXPORT_EVERY_S = "rag", "m", 30.0
TOLERANCE = 0.05

Points = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]
Seen = tuple[float, float | None, float | None, float | None]
"""An evaluation: its time, the cost the policy read, the true cost, the deviation."""


class Recording(ScrapedFleet):
    """The closed loop's simulated Prometheus, also keeping what it returned to the policy
    and what a real Prometheus and kube-state-metrics would have stored."""

    seen: ClassVar[list[tuple[float, float, float | None]]] = []
    points: ClassVar[Points] = {}
    exported: ClassVar[set[str]] = set()
    """The pods kube-state-metrics listed at the last export."""

    def signals(self, now_s: float, window_s: float, *, observed_at: datetime) -> EngineSignals:
        out = super().signals(now_s, window_s, observed_at=observed_at)
        Recording.seen.append((now_s, window_s, out.gpu_seconds_per_1k_requests.value))
        return out

    def scrape(self, pods: Iterable[Pod], now_s: float) -> None:
        pods = list(pods)
        super().scrape(pods, now_s)
        if now_s % EXPORT_EVERY_S == 0:
            export(pods, now_s)


def put(name: str, labels: dict[str, str], t: float, value: float) -> None:
    Recording.points.setdefault((name, tuple(sorted(labels.items()))), []).append((t, value))


def export(pods: list[Pod], now_s: float) -> None:
    """One scrape of every pod's engine series (ready ones) and kube-state-metrics. A pod
    gone since the last export is written once as no longer scheduled: a backfilled TSDB
    has no staleness markers, so its series would otherwise count for the 5 minutes of
    lookback after its last sample, where a scraping Prometheus drops it at once."""
    for name in Recording.exported - {pod.name for pod in pods}:
        put(
            "kube_pod_status_scheduled",
            {"namespace": NAMESPACE, "pod": name, "condition": "true"},
            now_s,
            0,
        )
    Recording.exported = {pod.name for pod in pods}
    sets = set()
    for pod in pods:
        ids = {"namespace": NAMESPACE, "pod": pod.name}
        replicaset = f"vllm-{pod.revision}"
        sets.add(replicaset)
        gpu = {**ids, "container": "vllm", "resource": "nvidia_com_gpu", "unit": "integer"}
        put("kube_pod_container_resource_requests", gpu, now_s, pod.gpus)
        put("kube_pod_status_scheduled", {**ids, "condition": "true"}, now_s, 1)
        owner = {**ids, "owner_kind": "ReplicaSet", "owner_name": replicaset}
        put("kube_pod_owner", owner, now_s, 1)
        if pod.ready_s <= now_s and pod.gone_s is None:
            for family in VllmReplicaCollector(pod.engine, pod.series, MODEL).collect():
                for sample in family.samples:
                    put(sample.name, {**sample.labels, **ids}, now_s, sample.value)
    for replicaset in sets:
        labels = {"namespace": NAMESPACE, "replicaset": replicaset, "owner_name": "vllm"}
        put("kube_replicaset_owner", {**labels, "owner_kind": "Deployment"}, now_s, 1)


def policy_part(truth: Windows, change_s: float) -> None:
    rows: list[Seen] = []
    for t, window, value in Recording.seen:
        true = truth.signals(t - window, t).gpu_s_per_1k
        deviation = None if value is None or true is None else value / true - 1
        rows.append((t, value, true, deviation))

    def summary(label: str, part: list[Seen]) -> None:
        known = [abs(r[3]) for r in part if r[3] is not None]
        over = sum(d > TOLERANCE for d in known)
        print(f"  {label}: worst {max(known):.1%}, {over} of {len(known)} off by > 5%")

    print("the policy's GPU-s/1k against the truth over the same window:")
    summary("every evaluation", rows)
    summary("after the change", [r for r in rows if r[0] > change_s])
    for t, value, true, deviation in rows:
        if change_s < t <= change_s + 900 and value is not None and true is not None:
            print(f"    t={t:5.0f}s  seen {value:6.0f}  true {true:6.0f}  {deviation:+.1%}")


def report_part(truth: Windows, change_s: float, duration_s: float, step_s: float) -> None:
    t0 = (int(time.time()) // 60) * 60 - int(duration_s) - 600
    series = Series()
    for (name, labels), points in Recording.points.items():
        series.add(name, dict(labels), [(t0 + t, v) for t, v in points])
    before = (change_s // step_s - 1) * step_s  # the first window warms the caches
    around = datetime.fromtimestamp(t0 + change_s, UTC)
    spans, _ = windows(around, step_s, before, duration_s - change_s, datetime.now(UTC))
    selector = Selector.of({"namespace": NAMESPACE, "model_name": MODEL})
    scraped = SignalRequest(Engine.VLLM, selector, step_s, gpus_per_pod=truth_gpus(truth))
    ksm = SignalRequest(Engine.VLLM, selector, step_s, kube_state_metrics=True)
    with (
        tempfile.TemporaryDirectory() as folder,
        backfilled_prometheus(series, Path(folder)) as url,
        PrometheusClient(PrometheusConfig(url=url, timeout_seconds=60)) as client,
    ):
        reads = {
            "scraped": read_report(client, scraped, spans),
            "ksm": read_report(client, ksm, spans),
        }

    def true(window: Window) -> tuple[float | None, float | None]:
        signals = truth.signals(change_s + window.start_offset_s, change_s + window.end_offset_s)
        return signals.replicas, signals.gpu_s_per_1k

    print("`cachescale report` (pods / GPU-s/1k: truth, engine series only, kube-state-metrics):")
    for index, window in enumerate(spans):
        pods, cost = true(window)
        shown = [pods, *(reads[k][index].replicas.value for k in reads)]
        costs = [cost, *(reads[k][index].gpu_seconds_per_1k.value for k in reads)]
        cells = " ".join(f"{v:6.1f}" if v is not None else "     ?" for v in shown)
        money = " ".join(f"{v:6.0f}" if v is not None else "     ?" for v in costs)
        print(f"  {window.label:>12}  pods {cells}   GPU-s/1k {money}")
    side = {
        "before": [true(w)[1] for w in spans if w.end_offset_s <= 0],
        "after": [true(w)[1] for w in spans if w.start_offset_s >= 0],
    }
    first = statistics.median(v for v in side["before"] if v is not None)
    then = statistics.median(v for v in side["after"] if v is not None)
    real = then / first - 1
    print(f"  true cost change {first:,.0f} → {then:,.0f}: {real:+.1%}")
    for name, rows in reads.items():
        print(f"  verdict, {name}: {verdict_change(rows, real)}")


def verdict_change(rows: list[Row], real: float) -> str:
    known = Shift.of(rows, "gpu_seconds_per_1k").known
    if known is None:
        return "unknown"
    before, after, change = known
    return f"{before:,.0f} → {after:,.0f}: {change:+.1%} ({100 * (change - real):+.1f} points)"


def truth_gpus(truth: Windows) -> float:
    return float(truth.result.pods[0].gpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="rag-rechunk")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    print("\n".join(provenance()))
    scenario = load_builtin(args.scenario)
    if args.seed is not None:
        scenario = scenario.model_copy(update={"seed": args.seed})
    policy_loop.ScrapedFleet = Recording  # type: ignore[attr-defined]
    result = run(scenario, build_autoscaler("cachescale", scenario))
    truth = Windows(result)
    change_s = scenario.change_at_s
    if change_s is None:
        raise SystemExit(f"{scenario.name} has no change to centre on")
    print(f"{scenario.name}, seed {scenario.seed}, change at {change_s:.0f} s")
    policy_part(truth, change_s)
    if prometheus_available():
        report_part(truth, change_s, scenario.duration_s, scenario.report.window_s)
    else:
        print("`cachescale report`: skipped (needs the prometheus and promtool binaries)")


if __name__ == "__main__":
    main()
