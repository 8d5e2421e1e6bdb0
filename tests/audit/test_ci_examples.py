"""The CI examples (``examples/ci/``) parse, and the shell gate runs end to end.

The gate script runs for real in a scratch git repository: a ``main`` commit and a change
commit whose corpus builder writes a regressed corpus, with ``cachescale`` on ``PATH``
pointing at this checkout. It must exit 1 and leave the Markdown comment behind.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.audit.helpers import SCRIPTS, gate_fixture

REPO = Path(__file__).resolve().parents[2]
CI = REPO / "examples" / "ci"


def test_the_workflow_is_yaml_with_the_gate_steps() -> None:
    workflow = yaml.safe_load((CI / "cachescale-audit.yml").read_text(encoding="utf-8"))
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the bare key `on` as true
    assert workflow["permissions"]["pull-requests"] == "write"
    steps = workflow["jobs"]["prefix-cache-gate"]["steps"]
    script = "\n".join(step.get("run", "") for step in steps)
    assert "examples/ci/audit-gate.sh" in script
    assert "gh pr comment" in script
    assert steps[0]["with"]["fetch-depth"] == 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_scripts_are_bash_that_parses(name: str) -> None:
    path = CI / name
    assert os.access(path, os.X_OK)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_shell_gate_fails_a_regressed_change_and_writes_the_comment(tmp_path: Path) -> None:
    repo, env = gate_fixture(tmp_path)
    builder = repo / "examples" / "ci" / "build-corpus.sh"
    gate = subprocess.run(
        [str(builder.parent / "audit-gate.sh"), "main"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gate.returncode == 1, gate.stderr
    comment = (Path(env["OUT_DIR"]) / "audit.md").read_text(encoding="utf-8")
    assert "variable" in comment
    assert comment in gate.stdout
