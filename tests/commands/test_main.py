"""The `cachescale` command line: exit codes, crd output, validate messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cachescale.api.crd import render_crd_yaml
from cachescale.commands.main import main
from cachescale.exit_codes import ExitCode

REPO = Path(__file__).resolve().parents[2]
INVALID = sorted((REPO / "examples" / "invalid").glob("*.yaml"))

# What each invalid example must name, in the words a user wrote.
NAMED_FIELD = {
    "bad-selector.yaml": "spec.metrics.selector",
    "bad-window.yaml": "spec.metrics.window",
    "empty-selector-value.yaml": "spec.metrics.selector: namespace: selector values must not",
    "managed-without-shape.yaml": "manageMaxNumSeqs",
    "min-above-max-replicas.yaml": "minReplicas (8) must be less than or equal to maxReplicas (4)",
    "negative-budget.yaml": "spec.budget.gpuSecondsPer1kRequests",
    "no-autoscaler.yaml": "spec.target: set exactly one of hpaName",
    "num-seqs-inverted.yaml": "minNumSeqs (64)",
    "p99-below-p95.yaml": "ttftP99Seconds (1.0) must be at least ttftP95Seconds (2.0)",
    "prompt-source-bad-namespace.yaml": "spec.cache.promptSources[0].namespace: 'RAG_Prod' "
    "has the wrong form",
    "two-autoscalers.yaml": "scaledObjectName (a KEDA ScaledObject, which owns the HPA it "
    "generates); both are set",
    "unknown-field.yaml": "spec.slo.ttftP95: unknown field",
}


def test_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == ExitCode.OK
    assert capsys.readouterr().out == render_crd_yaml()


def test_good_example_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO / "examples" / "policy-vllm.yaml")]) == ExitCode.OK
    assert "valid" in capsys.readouterr().out


def test_every_invalid_example_has_an_expectation() -> None:
    assert {path.name for path in INVALID} == set(NAMED_FIELD)


@pytest.mark.parametrize("path", INVALID, ids=[p.name for p in INVALID])
def test_invalid_example_fails_and_names_the_field(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(path)]) == ExitCode.INVALID
    err = capsys.readouterr().err
    assert NAMED_FIELD[path.name] in err
    assert "document 1" in err


def test_multi_document_reports_only_the_bad_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["validate", str(REPO / "examples" / "invalid" / "p99-below-p95.yaml")]) == 1
    err = capsys.readouterr().err
    assert "document 1 (p99-below-p95)" in err
    assert "document 2" not in err


def test_not_a_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n")
    assert main(["validate", str(path)]) == ExitCode.INVALID
    assert "expected cachescale.dev/v1alpha1 CacheScalingPolicy, found apps/v1/Deployment" in (
        capsys.readouterr().err
    )


def test_broken_yaml_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    assert main(["validate", str(broken), str(tmp_path / "absent.yaml")]) == ExitCode.INVALID
    err = capsys.readouterr().err
    assert "not valid YAML" in err
    assert "absent.yaml: cannot read" in err


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("\n")
    assert main(["validate", str(empty)]) == ExitCode.INVALID


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["validate"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == ExitCode.USAGE


def test_installed_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cachescale.commands.main", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    for command in ("crd", "validate"):
        assert command in result.stdout
