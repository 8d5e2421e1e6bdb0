"""The reusable CI entry points: the composite GitHub Action (``action.yml``) and the
pre-commit hook (``.pre-commit-hooks.yaml``).

The action's gate step (``examples/ci/action.sh``) runs for real in a scratch app
repository whose change regresses the cache, with the environment the action's step gives
it (its inputs as ``INPUT_*``, the runner's output and summary files): it must report
status 1, name the cause in the job summary, and leave the failing to the action's last
step. The pre-commit hook's entry runs as pre-commit runs a ``script`` hook: from the
app's root, with the hook's arguments and no file names.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from tests.audit.helpers import REPO, gate_fixture

ACTION = REPO / "action.yml"
HOOKS = REPO / ".pre-commit-hooks.yaml"


def _action() -> dict[str, object]:
    action: dict[str, object] = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    return action


def test_the_action_is_composite_and_feeds_its_inputs_to_the_gate_script() -> None:
    action = _action()
    runs = action["runs"]
    assert isinstance(runs, dict)
    assert runs["using"] == "composite"
    steps = {step["name"]: step for step in runs["steps"]}
    gate = next(step for step in steps.values() if step.get("id") == "gate")
    assert gate["run"] == '"$GITHUB_ACTION_PATH/examples/ci/action.sh"'
    inputs = action["inputs"]
    assert isinstance(inputs, dict)
    assert inputs["build-corpus"]["required"] is True
    for name in ("base-ref", "build-corpus", "audit-flags", "gate-flags", "out-dir"):
        variable = "INPUT_" + name.upper().replace("-", "_")
        assert gate["env"][variable] == f"${{{{ inputs.{name} }}}}"
    assert all(step["shell"] == "bash" for step in steps.values())  # composite steps need it
    fail = runs["steps"][-1]
    assert fail["if"] == "steps.gate.outputs.status != '0'"
    assert "exit 1" in fail["run"]
    outputs = action["outputs"]
    assert isinstance(outputs, dict)
    assert outputs["status"]["value"] == "${{ steps.gate.outputs.status }}"


def test_the_actions_gate_step_reports_a_regression_in_a_fixture_repo(tmp_path: Path) -> None:
    repo, env = gate_fixture(tmp_path)
    output, summary = tmp_path / "github_output", tmp_path / "summary.md"
    env |= {
        "GITHUB_ACTION_PATH": str(REPO),
        "GITHUB_OUTPUT": str(output),
        "GITHUB_STEP_SUMMARY": str(summary),
        "INPUT_BASE_REF": "main",
        "INPUT_BUILD_CORPUS": "examples/ci/build-corpus.sh",
        "INPUT_AUDIT_FLAGS": "--hit-fraction 0.8",
        "INPUT_GATE_FLAGS": "--max-hit-rate-drop 0.05",
        "INPUT_OUT_DIR": str(tmp_path / "action-out"),
    }
    step = subprocess.run(
        ["bash", "-c", _action_step_run()],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert step.returncode == 0, step.stderr  # the action's last step fails, not this one
    outputs = dict(line.split("=", 1) for line in output.read_text(encoding="utf-8").split())
    assert outputs["status"] == "1"
    comment = Path(outputs["comment"]).read_text(encoding="utf-8")
    assert "a span that differs on every request" in comment
    assert summary.read_text(encoding="utf-8") == comment


def _action_step_run() -> str:
    runs = _action()["runs"]
    assert isinstance(runs, dict)
    run: str = next(step for step in runs["steps"] if step.get("id") == "gate")["run"]
    return run


def test_the_pre_commit_hook_runs_the_gate_before_a_push(tmp_path: Path) -> None:
    (hook,) = yaml.safe_load(HOOKS.read_text(encoding="utf-8"))
    assert hook["id"] == "cachescale-audit"
    assert hook["language"] == "script"
    assert hook["pass_filenames"] is False
    assert hook["stages"] == ["pre-push"]
    entry = REPO / hook["entry"]
    assert os.access(entry, os.X_OK)
    repo, env = gate_fixture(tmp_path)
    # As pre-commit runs a script hook: the entry from the hook's repository, run in the
    # app's root with the configured arguments (a base and the corpus builder).
    done = subprocess.run(
        [str(entry), "main", "examples/ci/build-corpus.sh"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "variable-span" in done.stdout
