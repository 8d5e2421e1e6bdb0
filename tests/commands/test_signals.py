"""``cachescale signals``: exit codes, one-line failures, the table and the JSON."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import pytest

from cachescale.commands.signals import add_parser
from cachescale.exit_codes import ExitCode
from tests.gather.gather_dataset import AT, WINDOW_S, T
from tests.gather.gather_fakes import HangAfter, closed_port_url, fake_prometheus, vector


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cachescale")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["signals", *argv])
    code: int = args.handler(args)
    return code


def steady(url: str, *extra: str) -> list[str]:
    selector = 'namespace="llm",model_name="steady"'
    at = ["--at", AT.isoformat()]
    return ["--prometheus", url, "--engine", "vllm", "--selector", selector, *at, *extra]


def test_prometheus_down_is_one_line_and_a_distinct_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = closed_port_url()
    assert run(steady(url, "--timeout", "1")) == ExitCode.UNAVAILABLE
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"Prometheus is unreachable at {url}: ")


def test_a_prometheus_that_stalls_after_one_answer_gets_the_timeout_once_in_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    steady_series = {"namespace": "llm", "model_name": "steady"}
    detected = vector(
        ({**steady_series, "__name__": "vllm:prefix_cache_queries_total"}, "2"),
        ({**steady_series, "__name__": "vllm:request_prefill_kv_computed_tokens_count"}, "2"),
    )
    with fake_prometheus() as fake:
        fake.respond = HangAfter(1, lambda _q: detected)  # the detection, then nothing
        started = time.monotonic()
        code = run(steady(fake.url, "--timeout", "3"))
        took = time.monotonic() - started
        url = fake.url
    assert code == ExitCode.UNAVAILABLE
    assert took < 3.5
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert re.fullmatch(
        rf"Prometheus at {re.escape(url)} timed out: no answer within 3s: the deadline was "
        r"reached after 3\.[0-4]s",
        line,
    ), line


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_positive_number_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], timeout: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(steady(closed_port_url(), "--timeout", timeout))
    assert exited.value.code == 2
    assert "--timeout" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        # Flag values wrong on the command line itself: usage errors (exit_codes.py).
        (["--selector", 'namespace=~"llm"'], ExitCode.USAGE, "--selector: cannot read"),
        (["--window", "30s"], ExitCode.USAGE, "--window: window 30s is shorter than 1m"),
        (["--window", "5 minutes"], ExitCode.USAGE, "--window: '5 minutes' is not a duration"),
        (["--gpus-per-pod", "2"], ExitCode.USAGE, "--gpus-per-pod and --replicas together"),
        (["--selector", '__name__="up"'], ExitCode.USAGE, "reserved"),
        (["--selector", ""], ExitCode.USAGE, "--selector: select at least one label"),
        (["--selector", "  "], ExitCode.USAGE, "--selector: select at least one label"),
        (["--selector", 'namespace=""'], ExitCode.USAGE, '--selector: namespace="" is empty'),
        # What a flag points at cannot be used: invalid input.
        (
            ["--bearer-token-file", "/nonexistent/token"],
            ExitCode.INVALID,
            "/nonexistent/token",
        ),
    ],
)
def test_bad_input_fails_before_any_request(
    capsys: pytest.CaptureFixture[str], extra: list[str], code: ExitCode, message: str
) -> None:
    assert run(steady(closed_port_url(), *extra)) == code
    err = capsys.readouterr().err
    assert err.startswith("cachescale signals: ")
    assert message in err


def test_empty_token_file_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("\n")
    assert run(steady(closed_port_url(), "--bearer-token-file", str(token))) == ExitCode.INVALID
    assert "is empty" in capsys.readouterr().err


def test_table_shows_values_with_units_and_reasons(
    synthetic_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run(steady(synthetic_prometheus, "--gpus-per-pod", "2", "--replicas", "2")) == ExitCode.OK
    )
    out = capsys.readouterr().out
    assert '{model_name="steady",namespace="llm"} (vllm>=0.13' in out
    assert "token hit rate, local (token-weighted)" in out
    assert "0.800 (80.0%)" in out
    assert "full-hit share (request-weighted), <= 200 tokens computed  0.400 (40.0%)" in out
    assert re.search(r"TTFT p95 +0\.875 s", out)
    assert re.search(r"GPU-seconds per 1k requests +2000 GPU-s/1k req", out)
    assert "steady-b" in out
    assert "? steady-b hit rate: only 1 sample(s) of this pod" in out


def test_served_and_offered_side_by_side_and_a_demand_query(
    synthetic_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(steady(synthetic_prometheus)) == ExitCode.OK
    out = capsys.readouterr().out
    assert re.search(r"successful requests per second \(served\) +2 req/s", out)
    assert re.search(r"arriving requests per second \(offered\) +3 req/s", out)
    demand = 'sum(rate(vllm:request_success_total{model_name="steady",pod="steady-a"}[5m]))'
    assert run(steady(synthetic_prometheus, "--json", "--demand-query", demand)) == ExitCode.OK
    arrivals = json.loads(capsys.readouterr().out)["signals"]["arrivals_per_second"]
    assert arrivals["value"] == pytest.approx(3.0)
    assert (
        run(steady(synthetic_prometheus, "--json", "--demand-query", "vllm:num_requests_running"))
        == ExitCode.OK
    )
    arrivals = json.loads(capsys.readouterr().out)["signals"]["arrivals_per_second"]
    assert arrivals["value"] is None
    assert "it must return exactly one" in arrivals["reason"]


def test_json_has_every_signal_with_null_for_unknown(
    synthetic_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(steady(synthetic_prometheus, "--json")) == ExitCode.OK
    data = json.loads(capsys.readouterr().out)
    assert data["profile"] == "vllm>=0.13"
    assert data["window_seconds"] == WINDOW_S
    assert data["signals"]["token_hit_rate_local"] == {
        "value": pytest.approx(0.8),
        "unit": "ratio",
        "reason": None,
    }
    cost = data["signals"]["gpu_seconds_per_1k_requests"]
    assert cost["value"] is None
    assert cost["reason"].startswith("needs GPUs per pod")
    assert [pod["pod"] for pod in data["pods"]] == ["steady-a", "steady-b"]


def test_ambiguous_selector_exits_1_naming_the_series(
    synthetic_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--prometheus", synthetic_prometheus, "--engine", "vllm", "--at", str(T)]
    assert run([*argv, "--selector", 'namespace="twins"']) == ExitCode.INVALID
    assert 'model_name="y"' in capsys.readouterr().err


def test_without_the_operator_extra_the_command_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "requests", None)
    monkeypatch.delitem(sys.modules, "cachescale.gather.prometheus")
    assert run(steady(closed_port_url())) == ExitCode.INVALID
    assert (
        "needs requests: pip install '.[operator]' in a clone of the cachescale repository"
        in capsys.readouterr().err
    )


def test_a_ttft_past_the_last_bucket_prints_as_a_lower_bound(
    synthetic_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    selector = 'namespace="llm",model_name="sgslow"'
    argv = ["--prometheus", synthetic_prometheus, "--engine", "sglang", "--selector", selector]
    assert run([*argv, "--at", AT.isoformat()]) == ExitCode.OK
    table = capsys.readouterr().out
    for label in ("p50", "p95", "p99"):
        (line,) = [row for row in table.splitlines() if f"TTFT {label}" in row]
        assert "> 400 s (past the histogram's last finite bucket" in line
    assert run([*argv, "--at", AT.isoformat(), "--json"]) == ExitCode.OK
    p95 = json.loads(capsys.readouterr().out)["signals"]["ttft_p95_seconds"]
    assert p95 == {"value": 400.0, "unit": "s", "reason": None, "lower_bound": True}
