"""``make envtest``: a control plane and the node stand-in for local use, until Ctrl-C.

Prints the admin kubeconfig's path (``export KUBECONFIG=...`` in another shell, then
``kubectl``, ``helm`` or ``make e2e`` use it). Ctrl-C or SIGTERM stops every process and
removes the temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from e2e.harness.cluster import session_cluster, why_no_cluster


def main() -> int:
    """Start, print, wait for a signal, stop."""
    os.environ.pop("KUBECONFIG", None)  # always start our own control plane here
    reason = why_no_cluster()
    if reason:
        print(f"cannot start a control plane: {reason}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with session_cluster() as cluster:
        print(f"control plane up; its admin kubeconfig:\n  export KUBECONFIG={cluster.kubeconfig}")
        print("Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    print("stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
