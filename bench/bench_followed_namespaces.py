"""What a namespace a label shard follows costs in memory, against one cluster-wide scope.

Why: a cluster-wide shard (``--policy-selector`` without ``--namespace``) follows each
namespace its policies are in with one watch per target kind, each on a connection of its
own (``controller/kube/target_informers.py``); one process watching the cluster holds one
watch per kind. This measures the difference, apart from any policy:

1. a real API server (envtest, ``e2e/harness``) with N empty namespaces;
2. a fresh process that makes the operator's API client, then either opens the target
   informers of the N namespaces on demand or starts the cluster-wide ones, and reads its
   RSS 8 s later, against its RSS before.

Usage: ``KUBEBUILDER_ASSETS=$(scripts/envtest-assets.sh) python -m bench.bench_followed_namespaces
25`` (prints a Markdown table; each row is measured twice, in alternating order).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench.provenance import provenance
from e2e.harness.control_plane import control_plane

ROOT = Path(__file__).resolve().parent.parent
SETTLE_S = 8.0
"""How long the informers run (and list) before the RSS is read."""

CHILD = """
import sys, time
from cachescale.controller.kube.client import api_client_or_reason
from cachescale.controller.kube.target_informers import target_informers

def rss_kib():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0])

namespaces, kubeconfig, settle = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
api = api_client_or_reason(kubeconfig, connections=8)
before = rss_kib()
informers = target_informers(api, (), keda=False, on_demand=namespaces > 0)
if namespaces:
    for i in range(namespaces):
        informers.open(f"ns-{i}")
else:
    informers.start()
time.sleep(settle)
print(rss_kib() - before)
informers.stop()
"""


def added_kib(namespaces: int, kubeconfig: Path) -> int:
    """The RSS a fresh process adds by following ``namespaces`` (0: the cluster)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    command = [sys.executable, "-c", CHILD, str(namespaces), str(kubeconfig), str(SETTLE_S)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return int(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("namespaces", type=int, nargs="?", default=25)
    args = parser.parse_args()
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        parser.error("set KUBEBUILDER_ASSETS (scripts/envtest-assets.sh prints it)")
    print("\n".join(provenance()))
    with control_plane(Path(assets)) as plane:
        api = plane.admin_api()
        for i in range(args.namespaces):
            api.post("/api/v1/namespaces", {"metadata": {"name": f"ns-{i}"}})
        rows: dict[int, list[int]] = {0: [], args.namespaces: []}
        for order in ((0, args.namespaces), (args.namespaces, 0)):
            for count in order:
                rows[count].append(added_kib(count, plane.kubeconfig))
    print("\n| followed | RSS added (MiB), two runs | per namespace (MiB) |\n|---|---|---|")
    for count, added in rows.items():
        scope = "the cluster (one watch per kind)" if count == 0 else f"{count} namespaces"
        runs = " / ".join(f"{kib / 1024:.1f}" for kib in added)
        each = f"{sum(added) / len(added) / 1024 / count:.2f}" if count else "—"
        print(f"| {scope} | {runs} | {each} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
