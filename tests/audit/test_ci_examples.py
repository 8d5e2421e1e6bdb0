"""The CI examples (``examples/ci/``) parse, and the shell gate runs end to end.

The gate script runs for real in a scratch git repository: a ``main`` commit and a change
commit whose corpus builder writes a regressed corpus, with ``cachescale`` on ``PATH``
pointing at this checkout. It must exit 1 and leave the Markdown comment behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CI = REPO / "examples" / "ci"
SCRIPTS = ("build-corpus.sh", "audit-gate.sh")


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


def _git(cwd: Path, *args: str) -> None:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)


def test_the_shell_gate_fails_a_regressed_change_and_writes_the_comment(tmp_path: Path) -> None:
    repo = tmp_path / "app"
    (repo / "examples" / "ci").mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy2(CI / name, repo / "examples" / "ci" / name)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "gate")
    _git(repo, "checkout", "-qb", "change")
    builder = repo / "examples" / "ci" / "build-corpus.sh"
    # The change's app puts a timestamp at the top of its prompts: its builder writes the
    # demo's candidate corpus when run on the change, the baseline on main.
    text = builder.read_text(encoding="utf-8").replace(
        'cp "$scratch/baseline.jsonl"',
        'side=baseline; [ -e CHANGED ] && side=candidate\ncp "$scratch/$side.jsonl"',
    )
    builder.write_text(text, encoding="utf-8")
    (repo / "CHANGED").write_text("", encoding="utf-8")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "change")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cachescale").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -m cachescale.commands.main "$@"\n', encoding="utf-8"
    )
    (bin_dir / "cachescale").chmod(0o755)
    env = os.environ | {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "operator"),
        "OUT_DIR": str(tmp_path / "out"),
    }
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
    comment = (tmp_path / "out" / "audit.md").read_text(encoding="utf-8")
    assert "variable" in comment
    assert comment in gate.stdout
