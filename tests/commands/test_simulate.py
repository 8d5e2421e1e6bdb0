"""`cachescale simulate`: flags, output formats, files, errors."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachescale.commands.main import main
from cachescale.commands.simulate import SimulationRequest
from cachescale.exit_codes import ExitCode
from tests.polling import wait_for


def test_json_output_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "rag-rechunk", "--duration", "10m", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scenario"] == "rag-rechunk"
    assert report["seed"] == 7
    run = report["runs"]["hpa"]
    for key in (
        "change_at_s",
        "before",
        "after",
        "from_change",
        "slo_breaches",
        "replicas_max",
        "alerts",
        "max_num_seqs",
        "timeline",
    ):
        assert key in run
    assert (
        set(run["before"])
        == set(run["after"])
        == set(run["from_change"])
        == {
            "token_hit_rate",
            "request_hit_share",
            "prefill_tokens_per_request",
            "ttft_p95_s",
            "replicas",
            "req_per_s",
            "offered_req_per_s",
            "aborted_per_s",
            "gpu_s_per_1k",
            "preemptions_per_s",
        }
    )
    assert run["max_num_seqs"] == [{"at_s": 0.0, "value": 32}]


def test_text_report_has_table_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "steady", "--duration", "10m", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "scenario steady (seed 3)" in out
    assert "tok-hit" in out
    assert "req-hit" in out
    assert "GPU-s/1k" in out
    assert "token-weighted hit rate" in out


def test_sweep_json_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "cold-dilution", "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["sweep"]) == 8
    for row in report["sweep"]:
        assert {"replicas", "router", "throughput_tok_s", "ttft_p50_s", "ttft_p99_s"} <= set(row)
    assert (out / "cold-dilution-sweep.json").exists()


def test_out_dir_writes_csv_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert (
        main(["simulate", "--scenario", "rechunk-heals", "--duration", "5m", "--out", str(out)])
        == ExitCode.OK
    )
    capsys.readouterr()
    rows = list(csv.DictReader((out / "rechunk-heals-hpa.csv").open()))
    assert len(rows) == 20  # 5 minutes at the scenario's 15 s timeline
    assert "request_hit_share" in rows[0]
    png = (out / "rechunk-heals.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_scenario_file_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "cold-dilution.yaml"
    assert main(["simulate", "--scenario-file", str(good), "--json"]) == ExitCode.OK
    capsys.readouterr()
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("profile: llama3-8b-a100", "profile: gpt-9"))
    assert main(["simulate", "--scenario-file", str(bad)]) == ExitCode.INVALID
    assert "unknown profile 'gpt-9'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "nope"], "argument --scenario: no built-in scenario 'nope'"),
        (["--duration", "ten minutes"], "argument --duration: 'ten minutes' is not a duration"),
    ],
)
def test_a_bad_flag_value_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    # A flag value is wrong on the command line itself: exit 2, as argparse's own errors
    # (exit_codes.py draws the line between 2 and 1).
    with pytest.raises(SystemExit) as raised:
        main(["simulate", *argv])
    assert raised.value.code == ExitCode.USAGE
    assert message in capsys.readouterr().err


def test_scenario_and_file_are_exclusive() -> None:
    with pytest.raises(SystemExit) as raised:
        main(["simulate", "--scenario", "steady", "--scenario-file", "x.yaml"])
    assert raised.value.code == 2


def test_a_duration_that_ends_before_the_change_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--scenario", "rechunk-heals", "--duration", "5m", "--json"]
    assert main(argv) == ExitCode.OK
    err = capsys.readouterr().err
    assert err == (
        "cachescale simulate: warning: --duration ends at 300 s, before the scenario's "
        "first change at 1800 s: the run shows only the time before it\n"
    )


@pytest.mark.parametrize(("duration_s", "warned"), [(1800.0, True), (1801.0, False), (None, False)])
def test_the_warning_needs_a_duration_at_or_before_the_change(
    duration_s: float | None, warned: bool
) -> None:
    request = SimulationRequest.from_cli("rechunk-heals", None, "hpa", None, duration_s)
    assert bool(request.warnings) == warned


def test_an_invalid_policy_fails_before_any_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "loop.yaml"
    good = (
        Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "batch-pressure-loop.yaml"
    )
    scenario.write_text(
        good.read_text().replace("gpuSecondsPer1kRequests: 3000", "gpuSecondsPer1kRequests: -1")
    )
    started = time.monotonic()
    assert main(["simulate", "--scenario-file", str(scenario), "--autoscaler", "both"]) == 1
    assert time.monotonic() - started < 5  # not after a simulation
    assert capsys.readouterr().err == (
        f"cachescale simulate: {scenario}: policy.budget.gpuSecondsPer1kRequests: "
        "Input should be greater than 0 (got -1)\n"
    )


def _children(pid: int) -> list[int]:
    """The processes ``pid`` forked that are still running (Linux ``/proc``)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text(encoding="ascii").split()]


def test_a_killed_worker_process_is_a_warning_and_the_same_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker process killed mid-run (the OOM killer, a stray ``kill -9``): the command
    runs the scenario again in one process and prints the answer it would have printed, with
    a one-line warning instead of a traceback."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a simulation forks no worker")
    flags = ["simulate", "--scenario", "rag-rechunk", "--duration", "30m", "--json"]
    process = subprocess.Popen(
        [sys.executable, "-m", "cachescale.commands.main", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    feeder = wait_for(lambda: _children(process.pid) or None, 60, "the stream's feeder")[0]
    os.kill(feeder, signal.SIGKILL)  # the first fork is the feeder, drawing the whole stream
    out, err = process.communicate(timeout=600)
    assert process.returncode == ExitCode.OK, err
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if "running it again" in line]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("cachescale simulate: warning: the request stream's feeder")
    assert warnings[0].endswith("; running it again in one process")
    assert main(flags) == ExitCode.OK
    assert json.loads(out) == json.loads(capsys.readouterr().out)
