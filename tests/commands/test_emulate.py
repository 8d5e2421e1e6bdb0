"""``cachescale emulate`` as users run it: a subprocess, its output, its files, its exit.

The in-process tests call ``python -m cachescale.emulator``'s ``main`` for what ends fast
(usage errors, a taken port, a one-second scenario); the rest run the real subprocess and
stop it the way a user or a supervisor would.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from cachescale.emulator.__main__ import main
from cachescale.exit_codes import ExitCode
from tests.polling import wait_for
from tests.prometheus_fixture import (
    fixed_fleet_scenario,
    free_port_block,
    http_get,
    refuses_connections,
    run_emulator,
    small_scenario,
)


def test_follows_the_fleet_in_file_sd_then_exits_at_the_end(tmp_path: Path) -> None:
    with run_emulator(tmp_path, small_scenario(), speed=20) as emulator:
        emulator.wait_for_targets()
        # Scaled up at 30 s (pods ready at 35 s), replaced by the rollout from 60 s.
        pods = wait_for(
            lambda: emulator.pods() if "vllm-engine-3" in emulator.pods() else None,
            timeout_s=10,
            what="the scale-up in file_sd",
        )
        assert "vllm-engine-0" not in pods  # drained at 15 s
        for group in emulator.targets():
            assert group["labels"]["namespace"] == "llm"
        assert emulator.process.wait(30) == 0
        output = emulator.output()
    assert "+ llm/vllm-engine-0  http://127.0.0.1:" in output
    assert "- llm/vllm-engine-0" in output  # the HPA's scale-down at 15 s
    assert "+ llm/vllm-engine-9" in output  # the rollout's pods
    assert "scenario finished" in output
    assert emulator.targets() == []  # nothing is served any more
    truth = emulator.truth()
    assert truth["done"] is True
    assert truth["sim_time_s"] == 90
    assert truth["fleet"]["finished_requests"] > 500
    assert not any(pod["served"] for pod in truth["pods"].values())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_servers_and_empties_file_sd(tmp_path: Path, sig: int) -> None:
    scenario = fixed_fleet_scenario(replicas=2, duration_s=3600)
    base_port = str(free_port_block(2))
    with run_emulator(tmp_path, scenario, "--base-port", base_port, speed=1) as emu:
        groups = emu.wait_for_targets()
        assert emu.pods() == {"vllm-engine-0", "vllm-engine-1"}
        addresses = [group["targets"][0] for group in groups]
        assert addresses == [f"127.0.0.1:{int(base_port) + index}" for index in range(2)]
        assert all(http_get(f"http://{address}/metrics") for address in addresses)
        interrupted = sig == signal.SIGINT
        assert emu.stop(sig) == (ExitCode.INTERRUPTED if interrupted else ExitCode.OK)
    assert all(refuses_connections(address) for address in addresses)
    assert emu.targets() == []
    assert "stopped at simulated" in emu.output()
    assert emu.truth()["done"] is False


def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--speed", "0"], ["--engine", "trtllm"], ["--base-port", "70000"]):
        with pytest.raises(SystemExit) as exit_info:
            main(flags)
        assert exit_info.value.code == 2, flags
    assert "must be a finite number above 0, got 0" in capsys.readouterr().err


def test_an_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # A flag value (exit_codes.py: wrong on the command line itself, exit 2).
    with pytest.raises(SystemExit) as exit_info:
        main(["--scenario", "no-such-scenario"])
    assert exit_info.value.code == 2
    assert "no built-in scenario 'no-such-scenario'" in capsys.readouterr().err


def test_a_taken_port_is_invalid_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(fixed_fleet_scenario(replicas=1, duration_s=5)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--scenario-file", str(scenario), "--base-port", str(port)]) == 1
    assert f"port {port} is already in use" in capsys.readouterr().err


def test_static_scrape_config_lists_the_first_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(fixed_fleet_scenario(replicas=2, duration_s=1)))
    flags = ["--scenario-file", str(scenario), "--speed", "50", "--print-scrape-config"]
    assert main([*flags, "--engine", "sglang", "--namespace", "serving"]) == 0
    out = capsys.readouterr().out
    config_text = out[out.index("scrape_configs:") : out.index("[sim")]
    (job,) = yaml.safe_load(config_text)["scrape_configs"]
    assert [group["labels"] for group in job["static_configs"]] == [
        {"namespace": "serving", "pod": "sglang-engine-0"},
        {"namespace": "serving", "pod": "sglang-engine-1"},
    ]
    assert "engine sglang" in out


def test_the_truth_is_rewritten_while_lingering(tmp_path: Path) -> None:
    scenario = fixed_fleet_scenario(replicas=1, duration_s=2)
    with run_emulator(tmp_path, scenario, "--linger", "5") as emulator:
        first = emulator.wait_until_done()

        def rewritten() -> dict[str, Any] | None:
            truth = emulator.truth()
            return truth if truth["wall_time_s"] > first["wall_time_s"] + 0.5 else None

        later = wait_for(rewritten, timeout_s=4, what="a truth rewritten after the scenario ended")
        assert emulator.process.poll() is None  # still lingering
        assert later["done"] is True
        assert later["sim_time_s"] == first["sim_time_s"]
