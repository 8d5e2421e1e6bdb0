"""The CRD on a real API server: it installs, and it rejects a bad policy readably."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], capture_output=True, text=True, check=False)


def test_crd_installs_and_is_established() -> None:
    applied = kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    assert applied.returncode == 0, applied.stderr
    waited = kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/cachescalingpolicies.cachescale.dev",
    )
    assert waited.returncode == 0, waited.stderr


def test_good_policy_accepted_by_dry_run() -> None:
    result = kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        str(REPO / "examples" / "policy-vllm.yaml"),
    )
    assert result.returncode == 0, result.stderr


def test_min_above_max_rejected_with_message() -> None:
    result = kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        str(REPO / "examples" / "invalid" / "min-above-max-replicas.yaml"),
    )
    assert result.returncode != 0
    assert "minReplicas must be less than or equal to maxReplicas" in result.stderr
