"""scripts/install-helm.sh: valid bash, idempotent, and the tools it installed work."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.chart.chart_helpers import REPO, helm_binary

SCRIPT = REPO / "scripts" / "install-helm.sh"


def test_script_is_valid_bash_and_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_second_run_is_a_no_op(tmp_path: Path) -> None:
    """With the pinned version's binaries in place it downloads nothing and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("helm", "kubectl"):
        fake = bin_dir / tool
        fake.write_text(f"#!/bin/sh\necho fake-{tool}\n", encoding="utf-8")
        fake.chmod(0o755)
    (bin_dir / ".layer-version").write_text("2.2.2\n", encoding="utf-8")
    # An empty PATH for npm: were it to try a download, it would fail, not silently pass.
    env = {"PATH": "/usr/bin:/bin", "TOOLS_DIR": str(tmp_path), "KUBECTL_LAYER_VERSION": "2.2.2"}
    result = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, check=False, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert "already installed" in result.stderr
    assert "fake-helm" in result.stdout


def test_installed_helm_is_v4() -> None:
    version = subprocess.run(
        [helm_binary(), "version", "--short"], capture_output=True, text=True, check=True
    ).stdout
    assert version.startswith(("v4.", "v3.")), version
