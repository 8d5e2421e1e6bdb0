"""`cachescale validate` is as strict as the API server, and reads a GitOps folder.

Each case edits the example policy the way a user might, and checks the exit code and the
one line that names the file, the field and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cachescale.commands.main import main
from cachescale.exit_codes import ExitCode

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "examples" / "policy-vllm.yaml").read_text(encoding="utf-8")


def run_validate(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str, str]:
    status = main(["validate", *(str(path) for path in paths)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def edited(old: str, new: str) -> str:
    assert old in EXAMPLE, old
    return EXAMPLE.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "maxReplicas: 20",
            'maxReplicas: "20"',
            "spec.budget.maxReplicas: expected an integer, got the string '20'",
        ),
        (
            "gpuSecondsPer1kRequests: 900",
            "gpuSecondsPer1kRequests: .inf",
            "spec.budget.gpuSecondsPer1kRequests: must be a finite number",
        ),
        (
            "gpuSecondsPer1kRequests: 900",
            "gpuSecondsPer1kRequests: 1.0e400",
            "spec.budget.gpuSecondsPer1kRequests: must be a finite number",
        ),
        (
            "gpuSecondsPer1kRequests: 900",
            "gpuSecondsPer1kRequests: .nan",
            "spec.budget.gpuSecondsPer1kRequests: must be a finite number",
        ),
        ("weightsGiB: 16", "weightsGiB: 500", "model.weightsGiB (500) does not fit"),
        ("window: 5m", "window: 99999999999h", "spec.metrics.window: '99999999999h' is too long"),
        ("window: 5m", "window: 25h", "spec.metrics.window: window 25h is longer than 24h"),
        ("cooldown: 30m", "cooldown: 1000h", "spec.batching.cooldown: cooldown 1000h is longer"),
        (
            "manageMaxNumSeqs: true",
            "manageMaxNumSeqs: 1",
            "spec.batching.manageMaxNumSeqs: expected true or false, got 1",
        ),
        (
            "apiVersion: cachescale.dev/v1alpha1",
            "apiVersion: cachescale.dev/v1",
            "expected cachescale.dev/v1alpha1 CacheScalingPolicy, found cachescale.dev/v1/",
        ),
    ],
)
def test_what_the_api_server_refuses_validate_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(edited(old, new), encoding="utf-8")
    status, _, err = run_validate(capsys, path)
    assert status == ExitCode.INVALID
    assert f"{path}: document 1" in err
    assert expected in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("value", "status"),
    [("20.0", ExitCode.OK), ("2e1", ExitCode.OK), ("20.5", ExitCode.INVALID)],
)
def test_a_whole_float_is_an_integer_as_in_kubectl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, status: ExitCode
) -> None:
    # kubectl turns YAML into JSON through a float, and writes a whole one as an integer.
    path = tmp_path / "policy.yaml"
    path.write_text(edited("maxReplicas: 20", f"maxReplicas: {value}"))
    outcome, _, err = run_validate(capsys, path)
    assert outcome == status, err
    if status == ExitCode.INVALID:
        assert "spec.budget.maxReplicas: expected an integer, got 20.5" in err


def test_an_exponent_without_a_dot_is_a_number_as_in_kubectl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(edited("gpuSecondsPer1kRequests: 900", "gpuSecondsPer1kRequests: 9e2"))
    assert run_validate(capsys, path)[0] == ExitCode.OK


@pytest.mark.parametrize(
    "text", ["", "\n", "# only a comment\n", "---\n", "---\n---\n# nothing\n---\n"]
)
def test_a_file_without_a_policy_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    status, _, err = run_validate(capsys, path)
    assert status == ExitCode.INVALID
    assert err == (
        f"{path}: no CacheScalingPolicy found: no YAML documents (empty, only "
        "comments, or only --- separators)\n"
    )


def test_a_gitops_folder_validates_with_notes(capsys: pytest.CaptureFixture[str]) -> None:
    stack = REPO / "examples" / "stack"
    status, out, err = run_validate(capsys, stack)
    assert (status, err) == (ExitCode.OK, "")
    assert f"{stack / '10-vllm-deployment.yaml'}: document 1: skipped, not a " in out
    assert "CacheScalingPolicy: apps/v1/Deployment" in out
    assert f"{stack / '50-cachescalingpolicy.yaml'}: valid" in out


def test_a_multi_document_file_skips_other_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n" + EXAMPLE)
    status, out, err = run_validate(capsys, path)
    assert (status, err) == (ExitCode.OK, "")
    assert out == (
        f"{path}: document 1: skipped, not a CacheScalingPolicy: v1/Service\n{path}: valid\n"
    )


def test_a_folder_without_a_policy_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "svc.yml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    (tmp_path / "notes.txt").write_text("not yaml: [")
    status, _, err = run_validate(capsys, tmp_path)
    assert status == ExitCode.INVALID
    assert err == (
        f"{tmp_path}: no CacheScalingPolicy found (expected cachescale.dev/v1alpha1 "
        "CacheScalingPolicy, found v1/Service)\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_validate(capsys, empty)[2] == f"{empty}: no .yaml or .yml files in this folder\n"


def test_one_bad_file_in_a_folder_fails_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.yaml").write_text(EXAMPLE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.yaml").write_text(edited("maxReplicas: 20", "maxReplicas: 0"))
    status, out, err = run_validate(capsys, tmp_path)
    assert status == ExitCode.INVALID
    assert f"{tmp_path / 'good.yaml'}: valid" in out
    assert f"{tmp_path / 'sub' / 'bad.yaml'}: document 1 (llama3-8b-chat): " in err


def test_non_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(EXAMPLE.replace("# ", "# caf\xe9 ", 1).encode("latin-1"))
    status, _, err = run_validate(capsys, path)
    assert status == ExitCode.INVALID
    assert err.count("\n") == 1
    assert err.startswith(f"{path}: not UTF-8 text: byte 0xe9 on line ")


def test_anchors_in_a_policy_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "anchors.yaml"
    text = edited("  target:\n", "  target: &target\n").replace(
        "  slo:", "  labels: *target\n  slo:", 1
    )
    path.write_text(text)
    status, _, err = run_validate(capsys, path)
    assert status == ExitCode.INVALID
    assert err.count("\n") == 1
    assert "YAML anchors and aliases are not accepted in a policy (line " in err
    assert ": *target)" in err


def test_merge_keys_in_other_documents_are_read_as_kubectl_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
        "x: &base {a: 1}\ndata:\n  <<: *base\n  b: '2'\n---\n" + EXAMPLE
    )
    assert run_validate(capsys, path)[:2] == (
        ExitCode.OK,
        f"{path}: document 1: skipped, not a CacheScalingPolicy: v1/ConfigMap\n{path}: valid\n",
    )


def test_anchors_in_other_documents_are_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: &x b, c: *x}\n---\n"
        + EXAMPLE
    )
    assert run_validate(capsys, path)[0] == ExitCode.OK


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a:\n\tb: 1\n", "not valid YAML: line 2, column 1: found character '\\t' that cannot"),
        ("a: 1\na: 2\n", "not valid YAML: line 2, column 1: key 'a' is written twice"),
        ("spec: [unclosed\n", "not valid YAML: line 2, column 1: expected ',' or ']'"),
        ("? [a, b]\n: 1\n", "not valid YAML: line 1, column 3: found unhashable key"),
    ],
)
def test_yaml_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    status, _, err = run_validate(capsys, path)
    assert status == ExitCode.INVALID
    assert err.count("\n") == 1
    assert err.startswith(f"{path}: {expected}"), err
