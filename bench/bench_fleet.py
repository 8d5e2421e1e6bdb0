"""Fleet-scale benchmark: ``cachescale run`` against a real API server and a real Prometheus.

Run from the repository root (``make envtest``'s binaries, i.e. ``KUBEBUILDER_ASSETS`` or
``../shared/envtest`` through scripts/envtest-assets.sh, and Debian's Prometheus)::

    nice -n 10 .venv/bin/python -m bench.bench_fleet --policies 1000
    nice -n 10 .venv/bin/python -m bench.bench_fleet --policies 10000 --rounds 3 --append

What runs, all on this machine and on loopback, stood up by ``bench/fleet_rig.py`` (the
engines by ``bench/fleet_engines.py``, each policy's place in the fleet from
``bench/fleet_shape.py``):

* **Kubernetes**: etcd and kube-apiserver from the e2e harness (``e2e/harness/``), without
  the controller-manager: no ReplicaSets, pods or HPA controller, so the API server serves
  the operator and nothing else. Per policy a Deployment (1 replica, its status written as
  a settled rollout's), its one pod (created by the bench, its status written Running and
  ready since an hour back, so ``read_target`` knows its age), an HPA on it, and the policy
  itself, its status seeded with ``memory.dataSince`` an hour back so the decisions are
  real from the first round, ``cache.podWarmupSeconds`` the default 600 (every first pod
  is warm). ``--namespaces N`` (default 1: every policy in ``llm``)
  spreads the policies round-robin over ``llm-0`` … ``llm-{N-1}``, each created first
  (with the default ServiceAccount the absent controller-manager would add), each
  policy's objects and selector in its own namespace.
* **Engines**: no emulator process (at 10,000 policies it would be 10,000 scrape targets).
  An HTTP thread serves ``bench/vllm_engine.prom`` (one emulated vLLM pod, trimmed to
  the families the operator reads) once per policy, with the labels a PodMonitor would
  give (``namespace`` the policy's, ``model_name``, ``pod``), counters advancing at the
  pod's rate. Each engine has a hit rate of its own, 0.3 to 0.9 by policy index (its
  prefix-cache hits that share of its lookups, the prefill it computes the rest). The
  fleet is cut into shards of 500 policies, each a scrape target of its own.
* **Prometheus**: ``/usr/bin/prometheus``, a throw-away TSDB, scraping every 15 s. The
  "two servers" are one process reached through two URLs (``127.0.0.1`` and
  ``localhost``): the operator keeps one client per URL, so it sees two.
* **The mix**: 90% of the policies select ``{namespace, model_name}`` (same label names,
  distinct values); 10% add a label name of their own (``adapter_<policy>``), a unique
  label set. Half the policies use each URL, half each window (2m and 5m). Two options
  (both 0 by default; e.g. ``--namespaces 100 --moving 0.1 --restarting 0.05``) make
  some of them change, so the writes and Events a change costs are measured too:

  - ``--moving F``: that share of policies (a fixed draw) falls for 2 minutes in every
    10, the falls staggered evenly over the 10 so each interval holds as many: its
    engine's hit rate halves, requests queue (half a request more each second, drained
    as fast afterwards) and every request it finishes waits 1.5 s for its first token
    (over the policies' 1 s SLO); then it recovers, as a cache lost under load would.
  - ``--restarting F``: that share of pods (another fixed draw) is deleted and created
    again under the next name (``p00042-0`` → ``p00042-1``), ready from then on, as a
    rollout replaces a pod; spread over the steady window but its last interval, so
    each policy is evaluated after its restart within it (not in the ``--then`` one).
    The engine's series follow the new pod, its counters from 0; its policy, with no
    warm pod left, waits for it (``WaitingForWarmPods``). The bench's own requests for
    it (a DELETE, a POST and a status PATCH per pod) are left out of the API-server
    rows.
* **The operator**: the real ``cachescale run`` process (``e2e/operators.py``), standalone,
  admin kubeconfig, 30 s interval; ``--namespace llm`` with one namespace, every
  namespace (as an operator serving a cluster) with more. ``--shards K`` runs K
  cluster-wide processes instead, each ``--policy-selector shard=I`` over the policies
  of every K-th namespace (``bench/fleet_operators.py``): each shard's CPU, CPU per
  evaluation (over its own count), peak RSS and evaluations are shown, and their sum.
  ``--status-refresh DURATION`` passes that flag to every operator (default: theirs).
* **A slow chunk** (``--slow-chunk SECONDS``): one chunk's policies (the first 200 that
  read ``localhost`` over the 5m window: a URL and a window of their own, so one gather
  group, one chunk) read Prometheus through a delaying proxy (``bench/fleet_proxy.py``),
  which from the steady window's start holds each request SECONDS, past the operator's
  Prometheus deadline (10 s). The window holds the fault's onset; shown beside the
  rest: the slowed and the other policies' evaluations and missed intervals, the
  others' lateness, the proxy's requests, and the API writes against N/10.

The operator starts once every window holds scraped data only (``FULL_WINDOWS_S`` after
the first scrape). Measured over ``--rounds`` intervals after every policy was evaluated
once, kopf's first pass over the policies (its finalizer and annotation on each) ended,
and one more interval passed, from each component's own counters: Prometheus's
``prometheus_http_requests_total`` (by handler), kube-apiserver's
``apiserver_request_total`` (by verb, resource and subresource, minus the rate it showed
before the operator started), the operator's ``/proc`` CPU time and peak RSS (VmHWM), and
its ``/metrics`` for the evaluations: the headline count is the operator's own (its
lateness histogram's count, one per evaluation started), and CPU per evaluation is the
operator's CPU-seconds over it; beside it (read every 15 s, as a Prometheus would; the
longest gap between two reads is shown, since two evaluations between reads count as one)
each policy's ``cachescale_last_evaluation_timestamp_seconds`` gives the gaps between its
evaluations; lateness is a gap minus the interval, and a gap spanning more than 1.5
intervals counts its extra intervals as missed (a policy with no evaluation in the window
misses them all). Beside them, the deltas of the operator's own counters: decisions by
reason, evaluation errors by kind and, when it exports them,
``cachescale_evaluation_lateness_seconds`` (its p95 bucket),
``cachescale_evaluation_missed_intervals_total`` and ``cachescale_kube_requests_total``.

``--then restart`` or ``--then relist`` adds a second window, measured the same way from
the moment of a fault (the operator killed and started again; or the API server killed,
etcd compacted and the API server started again, so every watch lists anew), its first
round included: whether a restart or a relist is a burst of writes, and whether the
policies stay on schedule through it.

``--profile FILE`` samples the operator's Python stacks with py-spy (the dev extra) over the
steady window only, 100 times a second, and writes them to FILE as collapsed stacks (one
line per distinct stack: frames joined by ``;``, then its sample count);
``bench/profile_summary.py`` ranks its functions. Only the thread holding the GIL is
sampled (``--gil``): py-spy counts threads waiting on a queue or a condition as running,
and the operator's Python runs on that one thread at a time anyway; C code that releases
the GIL (zlib, TLS) is left out, the operator's CPU-seconds row counts it. py-spy stops
the operator for each sample (its non-blocking mode reads stacks while they change and
mixes frames of different calls), so a profiled window is a little slower.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from bench.fleet_counts import (
    INTERVAL_S,
    POLL_S,
    PROFILE_RATE,
    Disruption,
    Evaluations,
    Run,
    delta,
    profiled,
    snapshot,
)
from bench.fleet_engines import SHARD, Engines
from bench.fleet_operators import (
    DISRUPTIONS,
    disrupt,
    operator_pids,
    peak_rss,
    start_operators,
    wait_for_first_pass,
)
from bench.fleet_proxy import SlowProxy
from bench.fleet_report import render
from bench.fleet_rig import (
    ROOT,
    SCRAPE_S,
    Kube,
    Rollout,
    api_requests,
    create_fleet,
    envtest_assets,
    prometheus,
)
from bench.fleet_shape import Shape
from cachescale.commands.flags import at_least_one
from e2e.harness.control_plane import control_plane
from tests.polling import wait_for

FULL_WINDOWS_S = 5 * 60 + 2 * SCRAPE_S
"""From the first scrape until every window holds only scraped data; the operator starts
then. Before, a windowed rate still ramps (Prometheus does not extrapolate back past a
series' first sample): a first decision capped the envelope on a cost read from a partial
window and raised it again five minutes later, inside the measured window."""
BASELINE_S = 20.0


# --- the run -------------------------------------------------------------------------------


def measure(args: argparse.Namespace, workdir: Path) -> Run:
    shape = Shape(
        args.policies,
        args.namespaces,
        args.moving,
        args.restarting,
        args.shards,
        args.slow_chunk is not None,
    )
    with ExitStack() as stack:
        plane = stack.enter_context(control_plane(envtest_assets(workdir)))
        engines = Engines(shape)
        exporter_port = stack.enter_context(engines.serve())
        targets = math.ceil(shape.count / SHARD)
        server = stack.enter_context(prometheus(workdir, exporter_port, targets))
        prom_port = server.port
        proxy = SlowProxy(prom_port) if shape.slowed else None
        slow_port = stack.enter_context(proxy.serve()) if proxy is not None else None
        creation_s = create_fleet(plane, shape, prom_port, args.threads, slow_port)
        print(f"created {shape.count} policies in {creation_s:.0f} s: {shape.words()}", flush=True)
        wait_for(
            lambda: len(server.query("up == 1")) == targets or None,
            120.0,
            "every shard scraped",
            every_s=1.0,
        )
        windows_full_at = time.time() + FULL_WINDOWS_S
        kube = Kube(plane, 2)
        before = api_requests(kube)
        time.sleep(BASELINE_S)
        baseline = delta(api_requests(kube), before, BASELINE_S / INTERVAL_S)
        time.sleep(max(0.0, windows_full_at - time.time()))  # the first decisions are steady
        operators = start_operators(stack, workdir, plane.kubeconfig, shape, operator_flags(args))
        pids = {
            **operator_pids(operators),
            "prometheus": server.process.pid,
            "apiserver": plane.component("kube-apiserver").process.pid,
        }
        evaluations = Evaluations([o.metrics_url for o in operators])
        names = shape.keys()
        started = time.time()

        def all_evaluated() -> bool | None:
            evaluations.poll()
            return True if all(evaluations.times.get(n) for n in names) else None

        with contextlib.suppress(AssertionError):  # never all evaluated: measured all the same
            wait_for(all_evaluated, args.settle, "every policy evaluated", every_s=5.0)
        first_round_s = time.time() - started
        evaluated = sum(1 for n in names if evaluations.times.get(n))
        spaces = len({n.split("/")[0] for n in names if evaluations.times.get(n)})
        print(
            f"{evaluated} policies in {spaces} namespaces evaluated after {first_round_s:.0f} s",
            flush=True,
        )
        first_pass_s = wait_for_first_pass(kube, args.settle) - started
        print(f"kopf's first pass over the policies ended after {first_pass_s:.0f} s", flush=True)
        time.sleep(args.warmup)  # the first round's writes are not steady
        evaluations.poll()
        window_s = args.rounds * INTERVAL_S
        rollout = Rollout(Kube(plane, 2), shape, engines)
        profiled_pid = operators[0].process.pid
        with profiled(args.profile, profiled_pid, window_s, workdir / "py-spy.log"):
            if proxy is not None:
                proxy.arm(args.slow_chunk)  # the fault's onset is in the window
            a = snapshot(prom_port, kube, pids, evaluations, rollout, proxy)
            rollout.start(window_s - INTERVAL_S)  # each restart evaluated in the window
            while time.time() < a.at + window_s:
                time.sleep(POLL_S)
                evaluations.poll()
            rollout.join()
            b = snapshot(prom_port, kube, pids, evaluations, rollout, proxy)
        run = Run(
            shape,
            creation_s,
            first_round_s,
            first_pass_s,
            evaluated,
            spaces,
            a,
            b,
            baseline,
            evaluations,
            peak_rss(operators),
        )
        if args.then:
            operators = disrupt(
                args.then, plane, stack, workdir, operators, shape, operator_flags(args)
            )
            pids |= operator_pids(operators)
            pids["apiserver"] = plane.component("kube-apiserver").process.pid  # after a relist
            evaluations.urls = [o.metrics_url for o in operators]
            evaluations.poll()  # a restarted operator's own counters start from 0
            c = snapshot(prom_port, Kube(plane, 2), pids, evaluations, proxy=proxy)
            if args.then == "relist":
                c.api = {}  # the restarted API server counts from 0
            while time.time() < c.at + args.rounds * INTERVAL_S:
                time.sleep(POLL_S)
                evaluations.poll()
            d = snapshot(prom_port, Kube(plane, 2), pids, evaluations, proxy=proxy)
            run.then = Disruption(args.then, c, d, peak_rss(operators))
    return run


def share_of(text: str) -> float:
    """An argument that is a share, 0 to 1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: not within 0..1")
    return value


def operator_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags the bench's options give every operator it starts."""
    return () if args.status_refresh is None else ("--status-refresh", args.status_refresh)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="intervals measured")
    parser.add_argument(
        "--settle",
        type=float,
        default=300.0,
        help="seconds to wait for every first evaluation, and again for kopf's first pass",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=INTERVAL_S,
        help="seconds between kopf's first pass and the steady window: a fleet created "
        "before its operator is first written in full (every status, HPA and finalizer), "
        "which at 10,000 policies on 2 cores outlasts one interval",
    )
    parser.add_argument("--threads", type=int, default=16, help="creation threads")
    parser.add_argument(
        "--namespaces",
        type=at_least_one,
        default=1,
        metavar="N",
        help="spread the policies round-robin over N namespaces (llm-0 … llm-{N-1}, the "
        "operator watching all namespaces); 1: all in llm, the operator watching it alone",
    )
    parser.add_argument(
        "--moving",
        type=share_of,
        default=0.0,
        metavar="F",
        help="share of policies whose hit rate halves, a queue grows and TTFT passes the "
        "SLO for 2 of every 10 minutes, staggered",
    )
    parser.add_argument(
        "--restarting",
        type=share_of,
        default=0.0,
        metavar="F",
        help="share of pods deleted and re-created under a new name during the steady window",
    )
    parser.add_argument(
        "--shards",
        type=at_least_one,
        default=1,
        metavar="K",
        help="K operator processes, each cluster-wide with --policy-selector shard=I over "
        "the policies of the namespaces whose index modulo K is I (needs --namespaces ≥ K; "
        "--then restart only with one)",
    )
    parser.add_argument(
        "--slow-chunk",
        type=float,
        metavar="SECONDS",
        help="from the steady window's start, one chunk's policies (up to 200, one URL and "
        "window of their own) read Prometheus through a proxy holding each request SECONDS "
        "(over the operator's 10 s deadline: that chunk times out)",
    )
    parser.add_argument(
        "--status-refresh",
        metavar="DURATION",
        help="the operators' --status-refresh (default: theirs, 10m)",
    )
    parser.add_argument(
        "--then",
        choices=DISRUPTIONS,
        help="after the steady window, a fault and --rounds more intervals measured",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help=f"sample the operator's GIL holder with py-spy ({PROFILE_RATE} Hz) over the "
        "steady window into FILE, as collapsed stacks (python -m bench.profile_summary FILE "
        "ranks them); with --shards, the first shard's",
    )
    parser.add_argument("--append", action="store_true", help="append to bench/RESULTS.md")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR (new or empty) and keep it: the operators' logs are "
        "DIR/operator/operator.log (with --shards, DIR/shard-I/operator.log) and, after "
        "--then restart, DIR/restarted/operator.log",
    )
    args = parser.parse_args(argv)
    if args.shards > 1 and args.namespaces < args.shards:
        parser.error("--shards K splits by namespace: it needs --namespaces ≥ K")
    if args.slow_chunk is not None and args.slow_chunk <= 0:
        parser.error("--slow-chunk: SECONDS must be more than 0")
    if args.shards > 1 and args.then == "restart":
        parser.error("--then restart restarts one operator: not with --shards")
    with contextlib.ExitStack() as scope:
        if args.keep is None:
            workdir = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-")))
        else:
            args.keep.mkdir(parents=True, exist_ok=True)
            if any(args.keep.iterdir()):
                parser.error(f"--keep {args.keep}: not empty")
            workdir = args.keep
        try:
            block = render(args, measure(args, workdir))
        except Exception:
            for log in sorted(workdir.rglob("*.log")):
                print(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    print(block)
    if args.append:
        with (ROOT / "bench" / "RESULTS.md").open("a", encoding="utf-8") as results:
            results.write("\n" + block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
