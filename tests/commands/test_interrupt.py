"""Ctrl-C ends the long-running commands with exit 130 (``ExitCode.INTERRUPTED``, the
README's exit-code table) once they serve, without a traceback; SIGTERM, a supervisor's
stop, stays 0.

Each test runs the real command as a subprocess, waits until it serves (the emulator's
pods in its file_sd, the operator's ``/healthz``), signals it and reads its exit code.
``cachescale run`` needs no cluster for this: it is pointed at an API server that is not
there, which also shows what a user sees then (``controller/runtime/health.py``): a
``/readyz`` that fails and says why, and one WARNING naming the server, not a retry storm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from cachescale.controller.runtime.health import STALE_S
from cachescale.exit_codes import ExitCode
from tests.controller.process_fixture import IN_CLUSTER_ENV, cachescale_command
from tests.polling import wait_for
from tests.prometheus_fixture import fixed_fleet_scenario, free_port_block

START_TIMEOUT_S = 30.0
"""Imports and start-up on a loaded machine."""
STOP_TIMEOUT_S = 30.0
"""kopf's shutdown with its requests to an absent API server in retry (several seconds)."""
NOWHERE = "https://127.0.0.1:1"
"""An API server address where nothing listens."""
TOKEN = "s3cret-t0ken-never-logged"


def as_from_a_terminal() -> None:
    """In the child, before exec: SIGINT unblocked and at its default action, as a shell
    starts a command (a test runner's worker may have it ignored, which Python keeps)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def started(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` running, its output in ``log``; killed on the way out if still alive."""
    env = {k: v for k, v in os.environ.items() if k not in (*IN_CLUSTER_ENV, "KUBECONFIG")}
    with log.open("wb") as stream:
        process = subprocess.Popen(
            command, stdout=stream, stderr=subprocess.STDOUT, env=env, preexec_fn=as_from_a_terminal
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def stopped_by(process: subprocess.Popen[bytes], sig: int, log: Path) -> int:
    """Send ``sig``; the exit code (a failure if it does not exit in time)."""
    process.send_signal(sig)
    try:
        return process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still running {STOP_TIMEOUT_S:g} s after {sig!r}:\n{log.read_text()}"
        ) from None


def alive(process: subprocess.Popen[bytes], log: Path) -> None:
    """Fail at once, with its output, if it exited."""
    if process.poll() is not None:
        raise AssertionError(f"exited with {process.returncode}:\n{log.read_text()}")


# -- cachescale emulate ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [[*cachescale_command(), "emulate"], [sys.executable, "-m", "cachescale.emulator"]],
    ids=["cachescale-emulate", "python-m-cachescale.emulator"],
)
def test_ctrl_c_stops_the_emulator_with_130(tmp_path: Path, entry: list[str]) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(fixed_fleet_scenario(replicas=1, duration_s=3600)))
    file_sd, log = tmp_path / "targets.json", tmp_path / "emulate.log"
    command = [*entry, "--scenario-file", str(scenario), "--write-file-sd", str(file_sd)]
    with started(command, log) as process:

        def serving() -> bool | None:
            alive(process, log)
            return True if file_sd.exists() and json.loads(file_sd.read_text()) else None

        wait_for(serving, START_TIMEOUT_S, "the emulator's first pod in file_sd")
        code = stopped_by(process, signal.SIGINT, log)
    output = log.read_text()
    assert code == ExitCode.INTERRUPTED, output
    assert "Traceback" not in output, output
    assert json.loads(file_sd.read_text()) == [], "file_sd not emptied on the way out"


# -- cachescale run --------------------------------------------------------------------------


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig for an API server where nothing listens, with a token in it."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": NOWHERE}}],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def answer(url: str) -> tuple[int | None, str]:
    """The HTTP status and body of ``url`` (None, "": nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return None, ""


@contextmanager
def operator_without_api_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``cachescale run`` on :data:`NOWHERE`, serving its probes: the process and the base
    URL of its health port."""
    port = free_port_block(2)
    command = [
        *cachescale_command(),
        "run",
        "--kubeconfig", str(unreachable_kubeconfig(tmp_path / "kubeconfig")),
        "--health-port", str(port),
        "--metrics-port", str(port + 1),
    ]  # fmt: skip
    log = tmp_path / "operator.log"
    health = f"http://127.0.0.1:{port}"
    with started(command, log) as process:

        def serving() -> bool | None:
            alive(process, log)
            return True if answer(f"{health}/healthz")[0] == 200 else None

        wait_for(serving, START_TIMEOUT_S, "the operator's /healthz")
        yield process, health


def test_ctrl_c_stops_the_operator_with_130_and_it_was_never_ready_without_its_api_server(
    tmp_path: Path,
) -> None:
    log = tmp_path / "operator.log"
    with operator_without_api_server(tmp_path) as (process, health):
        warned = f"the API server {NOWHERE.removeprefix('https://')} has not answered"

        def told() -> bool | None:
            alive(process, log)
            return True if warned in log.read_text() else None

        wait_for(told, STALE_S + 15, "the operator's WARNING that the API server is gone")
        status, why = answer(f"{health}/readyz")
        assert status == 503, why
        assert why.startswith(f"not ready: {warned}"), why
        code = stopped_by(process, signal.SIGINT, log)
    output = log.read_text()
    assert code == ExitCode.INTERRUPTED, output
    assert "Traceback" not in output, output
    assert TOKEN not in output
    ours = [line for line in output.splitlines() if "cachescale.operator" in line]
    assert len([line for line in ours if warned in line]) == 1, output
    assert "Retrying (Retry(" not in output, "urllib3's retries are logged one by one"
    assert "Request attempt" not in output, "kopf's retries are logged one by one"


def test_sigterm_stops_the_operator_with_0(tmp_path: Path) -> None:
    with operator_without_api_server(tmp_path) as (process, _):
        code = stopped_by(process, signal.SIGTERM, tmp_path / "operator.log")
    assert code == ExitCode.OK, (tmp_path / "operator.log").read_text()
