"""``/readyz`` on the real API server: it fails while the API server is gone and passes
again once it is back and kopf's policy watch has reopened (``controller/runtime/health.py``).

The operator runs as the chart's ServiceAccount (``release`` fixture), the real ``cachescale
run`` process, scoped to a fresh namespace. The API server is the session's envtest one,
killed with SIGKILL (as a crash) and started again on the same port and data: a cluster
from KUBECONFIG is not used (the test skips there, as the other control-plane faults do).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cachescale.controller.runtime.health import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, STALE_S
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from tests.controller.process_fixture import OperatorProcess, run_operator
from tests.polling import wait_for

DOWN_WITHIN_S = 30.0
"""The issue's bound: ``/readyz`` fails within this long of the API server going away."""
BACK_WITHIN_S = 120.0
"""How long after the API server serves again ``/readyz`` may take to pass: kopf retries
its policy watch with waits of up to 21 s, and a restarting API server answers 403 and 429
for a while (e2e/test_faults.py, ``RELIST_TIMEOUT_S``)."""
WARNED_WITHIN_S = STALE_S + PROBE_INTERVAL_S + PROBE_TIMEOUT_S + 10.0
"""The WARNING's bound (``health.py``), with a margin for a loaded machine."""
APISERVER = "kube-apiserver"


def readyz(operator: OperatorProcess) -> tuple[int | None, str]:
    """``/readyz``'s status and body (None, "": nothing answers)."""
    try:
        with urllib.request.urlopen(f"{operator.health_url}/readyz", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return None, ""


def until_status(
    operator: OperatorProcess, wanted: bool, timeout_s: float, what: str
) -> tuple[float, str]:
    """Poll ``/readyz`` until it passes (``wanted``) or fails; seconds it took and the
    body it answered last. Fails if the operator exits or the time runs out."""
    started = time.monotonic()
    body = ""
    while time.monotonic() - started < timeout_s:
        if operator.process.poll() is not None:
            raise AssertionError(f"the operator exited:\n{operator.tail()}")
        status, body = readyz(operator)
        if (status == 200) == wanted and status is not None:
            return time.monotonic() - started, body
        time.sleep(0.5)
    raise AssertionError(f"/readyz not {what} after {timeout_s:g} s ({body!r})\n{operator.tail()}")


def test_readyz_fails_while_the_api_server_is_gone_and_passes_once_it_is_back(
    cluster: Cluster, release: Release, namespace: str, tmp_path: Path
) -> None:
    plane = cluster.plane
    if plane is None:
        pytest.skip("kills and restarts the API server: the session's own control plane only")
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "operator.kubeconfig", release.namespace, release.service_account
    )
    server = cluster.kubectl(
        "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    ).stdout
    host_port = server.removeprefix("https://").rstrip("/")
    gone = f"[WARNING ] the API server {host_port} has not answered for "
    again = f"[INFO    ] the API server {host_port} answers again"
    with run_operator(tmp_path, kubeconfig, namespace) as operator:
        assert operator.probe("/readyz") == 200  # run_operator waited for it
        killed = time.monotonic()
        plane.kill(APISERVER)
        try:
            down_s, why = until_status(operator, False, DOWN_WITHIN_S, "failing")
            print(f"\n/readyz failed {down_s:.1f} s after the API server was killed: {why!r}")
            left = WARNED_WITHIN_S - (time.monotonic() - killed)
            wait_for(lambda: gone in operator.output() or None, left, "the WARNING")
            assert readyz(operator)[0] == 503, "passes again while the API server is gone"
        finally:
            plane.restart(APISERVER)  # waits until it serves
        back_s, _ = until_status(operator, True, BACK_WITHIN_S, "passing")
        print(f"/readyz passed {back_s:.1f} s after the API server served again")
        output = operator.output()
    ours = [line for line in output.splitlines() if "cachescale.operator" in line]
    told = ["gone" if gone in line else "back" for line in ours if gone in line or again in line]
    assert told == ["gone", "back"], "\n".join(ours)
    assert "Traceback" not in output, operator.tail()
    assert "Retrying (Retry(" not in output, "urllib3's retries are logged one by one"
    assert "ClientConnectorError" not in output, "kopf's retries are logged one by one"
