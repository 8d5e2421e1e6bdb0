"""What N idle kopf daemons cost, against the scheduler's bookkeeping for N policies.

Why: the operator keeps one kopf daemon per policy (``controller/runtime/handlers.py``) that only
registers the policy with the scheduler and waits, so that kopf's peering pause, deletion
and relabelling still stop it. This measures that choice
(``docs/design/operator-scale.md``):

1. N ``CacheScalingPolicy`` objects in a real API server (envtest, ``e2e/harness``);
2. a kopf operator process with the operator's kopf settings, watching them, twice:
   with a daemon per policy that waits on ``stopped`` (``--daemons``), and with no daemon
   (an event handler only, what kopf costs anyway); peak RSS once every daemon runs, and
   CPU-seconds over an idle window;
3. ``controller.scheduler.Schedule`` holding N policies: its memory, and the CPU of one
   wake (``take`` + ``next_wake``).

Usage: ``KUBEBUILDER_ASSETS=$(scripts/envtest-assets.sh) python -m bench.bench_idle_daemons
1000 3000`` (prints a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from bench.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent
IDLE_WINDOW_S = 60.0
"""CPU is measured over this long once every daemon has started (``--window``)."""
NAMESPACE = "idle"


def policies(count: int) -> str:
    """``count`` valid policies as one JSON List (nothing else exists: they stay idle)."""
    items = [
        {
            "apiVersion": "cachescale.dev/v1alpha1",
            "kind": "CacheScalingPolicy",
            "metadata": {"name": f"p{i}", "namespace": NAMESPACE},
            "spec": {
                "target": {"deploymentName": f"d{i}", "hpaName": f"d{i}"},
                "metrics": {"prometheusUrl": "http://127.0.0.1:1", "interval": "30s"},
                "slo": {"ttftP95Seconds": 1.0},
                "budget": {"gpuSecondsPer1kRequests": 800, "minReplicas": 1, "maxReplicas": 4},
            },
        }
        for i in range(count)
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def operate(daemons: bool) -> None:
    """The operator under measurement (a child process): prints how many daemons run."""
    import asyncio

    import kopf

    from cachescale.api.policy import GROUP, PLURAL, VERSION
    from cachescale.controller.runtime.handlers import configure, kubeconfig_login

    started = [0]
    registry = kopf.OperatorRegistry()  # not the operator's handlers, imported with configure

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        return kubeconfig_login(os.environ["KUBECONFIG"])

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, scanning=False)

    if daemons:

        @kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0, registry=registry)
        async def _idle(stopped: kopf.DaemonStopped, **_: Any) -> None:
            started[0] += 1
            await stopped.wait()
    else:

        @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
        def _seen(**_: Any) -> None:
            started[0] += 1

    async def report() -> None:
        while True:
            print(started[0], flush=True)
            await asyncio.sleep(1.0)

    async def main() -> None:
        asyncio.get_running_loop().create_task(report())
        await kopf.operator(registry=registry, namespaces=[NAMESPACE], standalone=True)

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def measure_operator(
    kubeconfig: Path, count: int, daemons: bool, window: float
) -> dict[str, float]:
    """Start the operator, wait for ``count`` handled policies, then measure idle."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    command = [sys.executable, "-m", "bench.bench_idle_daemons", "--operate"]
    command += ["--daemons"] if daemons else []
    began = time.monotonic()
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if int(line) >= count:
                break
        else:
            raise RuntimeError(f"the operator exited with {child.wait()}")
        settled = time.monotonic() - began
        before = cpu_seconds(child.pid)
        time.sleep(window)
        cpu = cpu_seconds(child.pid) - before
        rss = peak_rss_mib(child.pid)
        child.terminate()
        child.wait(30)
    return {"start_s": settled, "cpu_per_min": cpu * 60 / window, "rss_mib": rss}


def _constant(value: Hashable) -> Callable[[], Hashable]:
    return lambda: value


def measure_schedule(count: int) -> dict[str, float]:
    """The scheduler's bookkeeping for ``count`` policies in 20 groups."""
    from cachescale.controller.reconcile.schedule import Schedule

    tracemalloc.start()
    schedule: Schedule[str] = Schedule()
    groups = [_constant(("prom", g)) for g in range(20)]
    for i in range(count):
        schedule.add(f"uid-{i}", lambda: 30.0, groups[i % 20], 0.0)
    memory, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    began = time.process_time()
    for t in range(0, 3000):  # 100 intervals, a wake a second
        for job in schedule.take(float(t)).jobs:
            schedule.done(job)
        schedule.next_wake(float(t))
    per_wake = (time.process_time() - began) / 3000
    return {"kib": memory / 1024, "wake_ms": per_wake * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1000, 3000])
    parser.add_argument("--window", type=float, default=IDLE_WINDOW_S, help="idle seconds")
    parser.add_argument("--operate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--daemons", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operate:
        operate(args.daemons)
        return 0
    from e2e.harness.cluster import session_cluster

    os.environ.pop("KUBECONFIG", None)
    print("\n".join(provenance()), end="\n\n")
    print(
        "| policies | kopf, no daemon: RSS MiB / CPU-s per min / start s | kopf + idle daemons "
        "| Schedule: KiB / ms per wake |"
    )
    print("|---|---|---|---|")
    with session_cluster() as cluster:
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))
        cluster.kubectl("create", "namespace", NAMESPACE)
        created = 0
        for count in sorted(args.sizes):
            with tempfile.NamedTemporaryFile("w", suffix=".json") as batch:
                batch.write(policies(count))
                batch.flush()
                done = cluster.kubectl("apply", "--server-side", "-f", batch.name)
                assert done.returncode == 0, done.stderr[-2000:]
            created = count
            row = [
                measure_operator(cluster.kubeconfig, created, d, args.window) for d in (False, True)
            ]
            book = measure_schedule(count)
            cells = [
                f"{r['rss_mib']:.0f} / {r['cpu_per_min']:.2f} / {r['start_s']:.0f}" for r in row
            ]
            print(
                f"| {count:,} | {cells[0]} | {cells[1]} | {book['kib']:.0f} / "
                f"{book['wake_ms']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
