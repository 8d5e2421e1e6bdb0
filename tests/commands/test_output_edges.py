"""The edges of the command line's output: each one exits with a code that says what
happened and prints one line at most, never a traceback.

Where the edge is the process's (a reader that left, a closed or full stdout, a taken
port, an extra that is not installed) the real command runs in a subprocess; the rest
call ``main`` in-process.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from cachescale.commands import main as cli
from cachescale.commands.main import main
from cachescale.exit_codes import ExitCode
from cachescale.extras import install_hint
from tests.prometheus_fixture import fixed_fleet_scenario

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "cachescale"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
GOOD = (REPO / "examples" / "policy-vllm.yaml").read_text(encoding="utf-8")
BAD = (REPO / "examples" / "invalid" / "bad-window.yaml").read_text(encoding="utf-8")
BAD_LINE = "spec.metrics.window: '5 minutes' is not a duration"
CLI = [sys.executable, "-m", "cachescale.commands.main"]
"""The command as a process: the console script's ``main``, with the interpreter's own
start-up and last flush."""
FULL = Path("/dev/full")
"""A device every write to fails with ENOSPC (Linux)."""
OPERATOR_EXTRA = ("kopf", "kubernetes", "aiohttp", "requests", "urllib3", "promql_parser")


def cachescale(
    *argv: str, stdout: int | None = subprocess.PIPE, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        input=stdin,
        text=True,
        timeout=120,
        check=False,
    )


def assert_no_traceback(finished: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in finished.stderr, finished.stderr
    assert "Exception ignored" not in finished.stderr, finished.stderr


def into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    """``cachescale ARGV`` with stdout on a pipe whose reader has already gone (stricter
    than ``| head -1``, which reads a line first)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return cachescale(*argv, stdout=write_end)
    finally:
        os.close(write_end)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD, encoding="utf-8")
    bad.write_text(BAD, encoding="utf-8")
    return good, bad


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A TCP port something else listens on (every address)."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        yield taken.getsockname()[1]


# 1. A reader that left early keeps the command's own exit code.


def test_validate_under_a_reader_that_left_still_exits_1_for_an_invalid_file(
    files: tuple[Path, Path],
) -> None:
    good, bad = files
    finished = into_closed_pipe("validate", str(bad), str(good))
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert BAD_LINE in finished.stderr


def test_a_reader_that_left_mid_output_does_not_stop_validate_before_the_bad_file(
    tmp_path: Path,
) -> None:
    # Far more "valid" lines than a pipe buffer holds come first: the write fails while
    # validate runs, and it must still reach the invalid file at the end.
    folder = tmp_path / "policies"
    folder.mkdir()
    for index in range(400):
        (folder / f"a{index:03}.yaml").write_text(GOOD, encoding="utf-8")
    (folder / "z-bad.yaml").write_text(BAD, encoding="utf-8")
    finished = into_closed_pipe("validate", str(folder))
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert f"z-bad.yaml: document 1 (bad-window): {BAD_LINE}" in finished.stderr


def test_a_reader_that_left_keeps_a_usage_error_and_a_success(files: tuple[Path, Path]) -> None:
    good, _ = files
    assert into_closed_pipe("validate", str(good)).returncode == ExitCode.OK
    assert into_closed_pipe("validate").returncode == ExitCode.USAGE


# 2. A closed stdout.


@pytest.mark.parametrize(("which", "code"), [(0, ExitCode.OK), (1, ExitCode.INVALID)])
def test_a_closed_stdout_runs_the_command_and_keeps_its_code(
    files: tuple[Path, Path], which: int, code: ExitCode
) -> None:
    finished = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", *CLI, "validate", str(files[which])],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )
    assert_no_traceback(finished)
    assert finished.returncode == code
    assert "cachescale: stdout is closed; the output is discarded" in finished.stderr


# 3. A stdout that cannot be written.


@pytest.mark.parametrize("argv", [["crd"], ["--version"]], ids=["large", "small"])
def test_a_full_stdout_is_one_line_and_exit_1(argv: list[str]) -> None:
    with FULL.open("w") as full:
        finished = cachescale(*argv, stdout=full.fileno())
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert finished.stderr == "cachescale: cannot write stdout: No space left on device\n"


def test_a_full_stdout_does_not_hide_an_invalid_file(files: tuple[Path, Path]) -> None:
    good, bad = files
    with FULL.open("w") as full:
        finished = cachescale("validate", str(bad), str(good), stdout=full.fileno())
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert BAD_LINE in finished.stderr
    assert "cachescale: cannot write stdout: No space left on device" in finished.stderr


# 4. --version.


def test_version_prints_the_installed_version() -> None:
    finished = cachescale("--version")
    assert finished.returncode == ExitCode.OK
    assert finished.stdout == f"cachescale {metadata.version('cachescale')}\n"
    assert finished.stderr == ""


def test_version_falls_back_to_pyproject_when_not_installed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == ExitCode.OK
    assert capsys.readouterr().out == f"cachescale {PYPROJECT['project']['version']}\n"


# 5. validate - reads standard input.


def test_validate_dash_reads_standard_input() -> None:
    valid = cachescale("validate", "-", stdin=GOOD)
    assert (valid.returncode, valid.stdout) == (ExitCode.OK, "<stdin>: valid\n")
    invalid = cachescale("validate", "-", stdin=BAD)
    assert invalid.returncode == ExitCode.INVALID
    assert f"<stdin>: document 1 (bad-window): {BAD_LINE}" in invalid.stderr
    assert "- to read standard input" in cachescale("validate", "--help").stdout


# 6. kind: List, as kubectl get -o yaml writes it.


def kubectl_list(*items: object) -> str:
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}}
    return yaml.safe_dump({**listed, "items": list(items)})


def test_a_kubectl_list_is_validated_item_by_item(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = yaml.safe_load(GOOD)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    listed = tmp_path / "csp.yaml"
    listed.write_text(kubectl_list(policy, deployment), encoding="utf-8")
    assert main(["validate", str(listed)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"{listed}: valid" in out
    assert (
        f"{listed}: document 1: skipped, not a CacheScalingPolicy: apps/v1/Deployment (items[1])"
    ) in out

    listed.write_text(kubectl_list(policy, yaml.safe_load(BAD)), encoding="utf-8")
    assert main(["validate", str(listed)]) == ExitCode.INVALID
    err = capsys.readouterr().err
    assert f"{listed}: document 1 (bad-window): items[1].{BAD_LINE}" in err


def test_a_list_without_a_policy_is_refused_as_any_file_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = tmp_path / "deployments.yaml"
    listed.write_text(kubectl_list({"apiVersion": "apps/v1", "kind": "Deployment"}))
    assert main(["validate", str(listed)]) == ExitCode.INVALID
    assert "no CacheScalingPolicy found" in capsys.readouterr().err


# 7. A taken port is named.


def test_emulate_names_a_taken_port(tmp_path: Path, taken_port: int) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(fixed_fleet_scenario(replicas=1, duration_s=5)))
    flags = ["--scenario-file", str(scenario), "--base-port", str(taken_port)]
    for command in ([*CLI, "emulate"], [sys.executable, "-m", "cachescale.emulator"]):
        finished = subprocess.run(
            [*command, *flags], capture_output=True, text=True, timeout=120, check=False
        )
        assert_no_traceback(finished)
        assert finished.returncode == ExitCode.INVALID
        assert finished.stderr == f"cachescale emulate: port {taken_port} is already in use\n"


@pytest.mark.parametrize("flag", ["--metrics-port", "--health-port"])
def test_run_names_a_taken_port(tmp_path: Path, taken_port: int, flag: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # an API server nothing answers at: never reached
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    ports = {"--metrics-port": "0", "--health-port": "0", flag: str(taken_port)}
    argv = ["run", "--kubeconfig", str(kubeconfig)]
    finished = cachescale(*argv, *(part for pair in ports.items() for part in pair))
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert f"cachescale run: {flag}: port {taken_port} is already in use\n" in finished.stderr


# 8. A missing extra: one line, naming an install that exists, before any work.


WITHOUT = """
import sys
sys.modules.update(dict.fromkeys({blocked!r}))  # None: "not installed" to import and find_spec
from cachescale.commands.main import main
sys.exit(main(sys.argv[1:]))
"""
"""``cachescale`` in an install without the ``blocked`` top-level modules."""


def without(blocked: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT.format(blocked=set(blocked)), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def readme_extra_row(extra: str) -> set[str]:
    """The subcommands README.md's extras table lists for ``pip install '.[EXTRA]'``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| `pip install '\.\[{extra}\]'` \| (.*) \|$", readme, re.MULTILINE)
    assert row is not None, f"README.md has no extras row for [{extra}]"
    return set(re.findall(r"`([a-z]+)`", row.group(1)))


NEEDS_OPERATOR = {
    "run": ["run", "--kubeconfig", "/nonexistent"],
    "init": ["init", "--namespace", "llm", "--deployment", "vllm", "--prometheus", "http://p:9"],
    "signals": ["signals", "--prometheus", "http://p:9", "--engine", "vllm", "--selector", "a=b"],
    "report": [
        "report", "--prometheus", "http://p:9", "--engine", "vllm", "--selector", "a=b",
        "--around", "2026-01-01T00:00:00", "--step", "1h",
    ],
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(NEEDS_OPERATOR))
def test_a_command_without_the_operator_extra_says_how_to_install_it(command: str) -> None:
    finished = without(OPERATOR_EXTRA, *NEEDS_OPERATOR[command])
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert finished.stderr.count("\n") == 1, finished.stderr
    assert finished.stderr.endswith(f"{install_hint('operator')}\n"), finished.stderr


def test_the_readme_extras_table_lists_what_needs_the_operator_extra(
    files: tuple[Path, Path],
) -> None:
    assert readme_extra_row("operator") == set(NEEDS_OPERATOR)
    # and what it does not list runs without it
    assert without(OPERATOR_EXTRA, "validate", str(files[0])).returncode == ExitCode.OK
    assert without(OPERATOR_EXTRA, "groups", str(files[0])).returncode == ExitCode.OK


def test_simulate_out_without_matplotlib_refuses_before_simulating(tmp_path: Path) -> None:
    # The default scenario takes a minute and more: a refusal must come at once.
    finished = without(("matplotlib",), "simulate", "--out", str(tmp_path / "out"))
    assert_no_traceback(finished)
    assert finished.returncode == ExitCode.INVALID
    assert finished.stderr == (
        f"cachescale simulate: --out needs matplotlib: {install_hint('plots')}\n"
    )
    assert not (tmp_path / "out").exists()


HINTED = re.compile(r"""(?:install_hint|needs_extra|missing_extra)\(.*?["'](\w+)["']\)""")
"""The extra a call of ``cachescale.extras`` names."""


def test_every_install_hint_names_an_extra_that_exists() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    named: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "pip install 'cachescale[" not in source, path  # not on PyPI
        named |= set(HINTED.findall(source))
    assert named == {"operator", "plots", "audit"}
    assert named <= extras
    assert install_hint("plots") == "pip install '.[plots]' in a clone of the cachescale repository"
