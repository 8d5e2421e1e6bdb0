"""Every ``cachescale`` subcommand whose reader has gone (``| head -1``) exits 0, quietly.

Each test runs the real command in a subprocess (the interpreter's own last flush is part
of what can fail) with stdout on a pipe whose read end is already closed, so the very first
write meets a broken pipe: stricter than ``head -1``, which reads one line first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cachescale.exit_codes import ExitCode
from tests.gather.gather_fakes import FakePrometheus, fake_prometheus
from tests.prometheus_fixture import fixed_fleet_scenario

REPO = Path(__file__).resolve().parents[1]


def into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``cachescale ARGV`` with stdout on a pipe nobody reads."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "cachescale.commands.main", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


def assert_quiet_success(finished: subprocess.CompletedProcess[str]) -> None:
    assert finished.stderr == ""
    assert finished.returncode == ExitCode.OK


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    with fake_prometheus() as fake:
        yield fake


def test_crd() -> None:
    assert_quiet_success(into_closed_pipe("crd"))


def test_validate() -> None:
    assert_quiet_success(into_closed_pipe("validate", str(REPO / "examples" / "policy-vllm.yaml")))


def test_simulate() -> None:
    assert_quiet_success(into_closed_pipe("simulate", "--scenario", "steady", "--duration", "2m"))


def test_signals(prometheus: FakePrometheus) -> None:
    # No engine series: every signal unknown, printed as a table (exit 0 when read).
    finished = into_closed_pipe(
        "signals", "--prometheus", prometheus.url, "--engine", "vllm",
        "--selector", 'namespace="llm"',
    )  # fmt: skip
    assert_quiet_success(finished)
    assert prometheus.queries  # it did read Prometheus before printing


def test_emulate(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(fixed_fleet_scenario(replicas=1, duration_s=2)))
    assert_quiet_success(into_closed_pipe("emulate", "--scenario-file", str(scenario)))


def _emulate_then_leave(tmp_path: Path, lines_read: int, *flags: str) -> list[str]:
    """Run ``emulate`` on a fixed one-pod fleet (20 simulated s), read ``lines_read`` lines
    of its stdout and close it, as ``| head -N``; assert it then stopped within 15 s,
    cleanly, with file_sd emptied; return the lines read."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(fixed_fleet_scenario(replicas=1, duration_s=20)))
    file_sd = tmp_path / "targets.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "cachescale.commands.main", "emulate",
         "--scenario-file", str(scenario),
         "--write-file-sd", str(file_sd), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(lines_read)]
    process.stdout.close()
    started = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 15  # it stopped, not at the scenario's end
    assert stderr == ""
    assert process.returncode == ExitCode.OK
    assert json.loads(file_sd.read_text(encoding="utf-8")) == []
    return lines


def test_emulate_under_head_stops_and_still_empties_file_sd(tmp_path: Path) -> None:
    # The reader takes the banner and leaves; the pod's line meets the closed pipe.
    banner = _emulate_then_leave(tmp_path, 1)
    assert "scenario" in banner[0]


def test_emulate_stops_when_the_reader_leaves_a_settled_fleet(tmp_path: Path) -> None:
    # The pod's line is read too: the settled fleet never prints again, so only watching
    # stdout for the hang-up stops it before the scenario's end.
    banner, pod = _emulate_then_leave(tmp_path, 2)
    assert "scenario" in banner
    assert " + llm/" in pod


def test_emulate_stops_when_the_reader_leaves_while_it_lingers(tmp_path: Path) -> None:
    # 20 simulated s at 10x, then --linger 60 printing nothing: the hang-up ends it.
    *_, lingering = _emulate_then_leave(tmp_path, 3, "--speed", "10", "--linger", "60")
    assert "serving the final state for 60s" in lingering


def test_run_help() -> None:
    # The operator itself needs a cluster; what it prints on its own is its help.
    assert_quiet_success(into_closed_pipe("run", "--help"))


def test_usage_errors_keep_their_code() -> None:
    finished = into_closed_pipe("signals", "--engine", "vllm")
    assert finished.returncode == ExitCode.USAGE
    assert "--prometheus" in finished.stderr
