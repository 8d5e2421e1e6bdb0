"""Every subcommand, fed bad input, answers with one line and a code from the table.

Each case runs the real ``cachescale`` in a subprocess (what a user's shell sees, the
interpreter's last words included) and checks three things: the exit code is the one
``exit_codes.py`` and README.md's "Exit codes" table give for that kind of mistake (2:
the command line itself is wrong; 1: what it points at is; 3: Prometheus cannot be
reached), stderr is exactly one line naming the flag or the file, and no "Traceback"
appears anywhere. No case reaches a cluster or a listening Prometheus, and none gets past
the first simulated second: each fails within seconds.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cachescale.exit_codes import ExitCode
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[1]
POLICY = (REPO / "examples" / "policy-vllm.yaml").read_text(encoding="utf-8")
SCENARIO = (REPO / "examples" / "scenarios" / "batch-pressure-loop.yaml").read_text("utf-8")
CLOSED = "http://127.0.0.1:1"
"""A Prometheus URL nothing listens at (port 1 refuses at once)."""
SIGNALS = ["signals", "--engine", "vllm", "--selector", 'namespace="llm"']
REPORT = [
    "report",
    "--engine",
    "vllm",
    "--selector",
    'namespace="llm"',
    "--around",
    "2026-01-01T00:00:00Z",
    "--step",
    "12h",
]
AROUND_POLICY = ["report", "--around", "policy/vllm", "--step", "12h"]
INIT = ["init", "--namespace", "llm", "--deployment", "vllm", "--prometheus", CLOSED]


def _kubeconfig(cluster: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def _bad_policy_scenario() -> str:
    scenario = yaml.safe_load(SCENARIO)
    scenario["policy"]["budget"]["maxReplicas"] = "ten"
    return yaml.safe_dump(scenario)


FILES: dict[str, str | bytes] = {
    "tabs.yaml": "name: x\n\tdescription: tabs\n",
    "latin1.yaml": "# caf\xe9\n".encode("latin-1") + POLICY.encode(),
    "comments.yaml": "# nothing but a comment\n",
    "dashes.yaml": "---\n---\n",
    "list.yaml": "- a\n- b\n",
    "quoted.yaml": POLICY.replace("maxReplicas: 20", 'maxReplicas: "20"'),
    "inf.yaml": POLICY.replace("gpuSecondsPer1kRequests: 900", "gpuSecondsPer1kRequests: .inf"),
    "weights.yaml": POLICY.replace("weightsGiB: 16", "weightsGiB: 500"),
    "window.yaml": POLICY.replace("window: 5m", "window: 99999999999h"),
    "anchors.yaml": POLICY.replace("  target:\n", "  target: &t\n").replace(
        "  slo:", "  labels: *t\n  slo:", 1
    ),
    "empty.yaml": "",
    "gpt9.yaml": SCENARIO.replace("profile: llama2-7b-a100", "profile: gpt-9"),
    "bad-policy.yaml": _bad_policy_scenario(),
    "a-file": "not a folder\n",
    "deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "two-documents.yaml": SCENARIO + "---\n" + SCENARIO,
    "typo.yaml": SCENARIO + "sead: 7\n",
    "closed-kubeconfig": yaml.safe_dump(_kubeconfig({"server": "https://127.0.0.1:1"})),
    "garbled-ca-kubeconfig": yaml.safe_dump(
        _kubeconfig(
            {
                "server": "https://127.0.0.1:1",
                "certificate-authority-data": base64.b64encode(b"not a certificate").decode(),
            }
        )
    ),
}

# (id, argv with {tmp} for the prepared folder, exit code, what the one line must name)
CASES: list[tuple[str, list[str], ExitCode, str]] = [
    # The command line itself.
    ("no-command", [], ExitCode.USAGE, "COMMAND"),
    ("unknown-command", ["frobnicate"], ExitCode.USAGE, "frobnicate"),
    ("crd-unknown-flag", ["crd", "--bogus"], ExitCode.USAGE, "--bogus"),
    ("crd-extra-argument", ["crd", "extra"], ExitCode.USAGE, "extra"),
    # validate
    ("validate-no-file", ["validate"], ExitCode.USAGE, "FILE"),
    ("validate-absent", ["validate", "{tmp}/absent.yaml"], ExitCode.INVALID, "absent.yaml"),
    ("validate-not-utf8", ["validate", "{tmp}/latin1.yaml"], ExitCode.INVALID, "latin1.yaml"),
    ("validate-tabs", ["validate", "{tmp}/tabs.yaml"], ExitCode.INVALID, "tabs.yaml"),
    ("validate-comments", ["validate", "{tmp}/comments.yaml"], ExitCode.INVALID, "comments"),
    ("validate-dashes", ["validate", "{tmp}/dashes.yaml"], ExitCode.INVALID, "dashes.yaml"),
    ("validate-a-list", ["validate", "{tmp}/list.yaml"], ExitCode.INVALID, "list.yaml"),
    ("validate-quoted", ["validate", "{tmp}/quoted.yaml"], ExitCode.INVALID, "maxReplicas"),
    ("validate-inf", ["validate", "{tmp}/inf.yaml"], ExitCode.INVALID, "gpuSecondsPer1k"),
    ("validate-weights", ["validate", "{tmp}/weights.yaml"], ExitCode.INVALID, "weightsGiB"),
    ("validate-window", ["validate", "{tmp}/window.yaml"], ExitCode.INVALID, "metrics.window"),
    ("validate-anchors", ["validate", "{tmp}/anchors.yaml"], ExitCode.INVALID, "anchors.yaml"),
    ("validate-empty-folder", ["validate", "{tmp}/empty-dir"], ExitCode.INVALID, "empty-dir"),
    ("validate-too-deep", ["validate", "{tmp}/deep.yaml"], ExitCode.INVALID, "deep.yaml"),
    # groups: the files as validate checks them; the flag as signals checks --prometheus
    ("groups-no-file", ["groups"], ExitCode.USAGE, "FILE"),
    ("groups-absent", ["groups", "{tmp}/absent.yaml"], ExitCode.INVALID, "absent.yaml"),
    ("groups-window", ["groups", "--json", "{tmp}/window.yaml"], ExitCode.INVALID, "window"),
    ("groups-empty-folder", ["groups", "{tmp}/empty-dir"], ExitCode.INVALID, "empty-dir"),
    (
        "groups-default-url",
        ["groups", "--default-prometheus-url", "prometheus:9090", "{tmp}/window.yaml"],
        ExitCode.USAGE,
        "--default-prometheus-url",
    ),
    # simulate: flags
    ("simulate-seed-negative", ["simulate", "--seed", "-1"], ExitCode.USAGE, "--seed"),
    ("simulate-seed-word", ["simulate", "--seed", "abc"], ExitCode.USAGE, "--seed"),
    ("simulate-seed-huge", ["simulate", "--seed", "1" + "0" * 30], ExitCode.USAGE, "--seed"),
    ("simulate-duration-words", ["simulate", "--duration", "ten min"], ExitCode.USAGE, "--dur"),
    ("simulate-duration-zero", ["simulate", "--duration", "0s"], ExitCode.USAGE, "--duration"),
    (
        "simulate-duration-huge",
        ["simulate", "--duration", "99999999999h"],
        ExitCode.USAGE,
        "--duration",
    ),
    ("simulate-duration-a-year", ["simulate", "--duration", "8760h"], ExitCode.USAGE, "--dur"),
    ("simulate-unknown-scenario", ["simulate", "--scenario", "nope"], ExitCode.USAGE, "--scen"),
    ("simulate-autoscaler", ["simulate", "--autoscaler", "keda"], ExitCode.USAGE, "--autoscaler"),
    (
        "simulate-two-sources",
        ["simulate", "--scenario", "steady", "--scenario-file", "x.yaml"],
        ExitCode.USAGE,
        "--scenario-file",
    ),
    # simulate: files and paths
    (
        "simulate-file-absent",
        ["simulate", "--scenario-file", "{tmp}/absent.yaml"],
        ExitCode.INVALID,
        "absent.yaml",
    ),
    (
        "simulate-file-tabs",
        ["simulate", "--scenario-file", "{tmp}/tabs.yaml"],
        ExitCode.INVALID,
        "tabs.yaml",
    ),
    (
        "simulate-file-not-utf8",
        ["simulate", "--scenario-file", "{tmp}/latin1.yaml"],
        ExitCode.INVALID,
        "latin1.yaml",
    ),
    (
        "simulate-file-empty",
        ["simulate", "--scenario-file", "{tmp}/empty.yaml"],
        ExitCode.INVALID,
        "empty.yaml",
    ),
    (
        "simulate-file-a-folder",
        ["simulate", "--scenario-file", "{tmp}/empty-dir"],
        ExitCode.INVALID,
        "empty-dir",
    ),
    (
        "simulate-file-too-deep",
        ["simulate", "--scenario-file", "{tmp}/deep.yaml"],
        ExitCode.INVALID,
        "deep.yaml: not valid YAML: nested too deeply",
    ),
    (
        "simulate-two-documents",
        ["simulate", "--scenario-file", "{tmp}/two-documents.yaml"],
        ExitCode.INVALID,
        "two-documents.yaml: 2 YAML documents",
    ),
    (
        "simulate-unknown-profile",
        ["simulate", "--scenario-file", "{tmp}/gpt9.yaml"],
        ExitCode.INVALID,
        "gpt9.yaml",
    ),
    (
        "simulate-unknown-field",
        ["simulate", "--scenario-file", "{tmp}/typo.yaml"],
        ExitCode.INVALID,
        "typo.yaml: sead: unknown field (scenario fields are snake_case",
    ),
    (
        "simulate-invalid-policy",
        ["simulate", "--scenario-file", "{tmp}/bad-policy.yaml", "--autoscaler", "both"],
        ExitCode.INVALID,
        "bad-policy.yaml: policy.budget.maxReplicas",
    ),
    (
        "simulate-out-is-a-file",
        ["simulate", "--scenario", "steady", "--out", "{tmp}/a-file"],
        ExitCode.INVALID,
        "--out",
    ),
    (
        "simulate-out-unwritable",
        ["simulate", "--scenario", "steady", "--out", "{tmp}/a-file/plots"],
        ExitCode.INVALID,
        "--out",
    ),
    # emulate
    ("emulate-seed-negative", ["emulate", "--seed", "-1"], ExitCode.USAGE, "--seed"),
    ("emulate-speed-zero", ["emulate", "--speed", "0"], ExitCode.USAGE, "--speed"),
    ("emulate-speed-inf", ["emulate", "--speed", "inf"], ExitCode.USAGE, "--speed"),
    ("emulate-port", ["emulate", "--base-port", "70000"], ExitCode.USAGE, "--base-port"),
    ("emulate-linger", ["emulate", "--linger", "-1"], ExitCode.USAGE, "--linger"),
    ("emulate-engine", ["emulate", "--engine", "tgi"], ExitCode.USAGE, "--engine"),
    (
        "emulate-ports-past-65535",
        ["emulate", "--scenario", "steady", "--base-port", "65530"],
        ExitCode.INVALID,
        "--base-port 65530: a pod's port is past 65535",
    ),
    (
        "emulate-file-tabs",
        ["emulate", "--scenario-file", "{tmp}/tabs.yaml"],
        ExitCode.INVALID,
        "tabs.yaml",
    ),
    (
        "emulate-truth-under-a-file",
        ["emulate", "--scenario", "steady", "--ground-truth", "{tmp}/a-file/truth.json"],
        ExitCode.INVALID,
        "--ground-truth",
    ),
    (
        "emulate-file-sd-a-folder",
        ["emulate", "--scenario", "steady", "--write-file-sd", "{tmp}/empty-dir"],
        ExitCode.INVALID,
        "--write-file-sd",
    ),
    # signals
    ("signals-no-flags", ["signals"], ExitCode.USAGE, "--prometheus"),
    (
        "signals-url-without-scheme",
        [*SIGNALS, "--prometheus", "prometheus:9090"],
        ExitCode.USAGE,
        "--prometheus 'prometheus:9090' is not an http:// or https:// URL",
    ),
    (
        "signals-url-broken",
        [*SIGNALS, "--prometheus", "http://[::1"],
        ExitCode.USAGE,
        "--prometheus",
    ),
    (
        "signals-url-bad-port",
        [*SIGNALS, "--prometheus", "http://prometheus:99999"],
        ExitCode.USAGE,
        "--prometheus",
    ),
    (
        "signals-selector-regex",
        ["signals", "--engine", "vllm", "--prometheus", CLOSED, "--selector", 'ns=~"x"'],
        ExitCode.USAGE,
        "--selector",
    ),
    (
        "signals-window",
        [*SIGNALS, "--prometheus", CLOSED, "--window", "30s"],
        ExitCode.USAGE,
        "--window",
    ),
    (
        "signals-timeout",
        [*SIGNALS, "--prometheus", CLOSED, "--timeout", "-1"],
        ExitCode.USAGE,
        "--timeout",
    ),
    (
        "signals-timeout-nan",
        [*SIGNALS, "--prometheus", CLOSED, "--timeout", "nan"],
        ExitCode.USAGE,
        "--timeout",
    ),
    (
        "signals-gpus",
        [*SIGNALS, "--prometheus", CLOSED, "--gpus-per-pod", "-1"],
        ExitCode.USAGE,
        "--gpus-per-pod",
    ),
    ("signals-at", [*SIGNALS, "--prometheus", CLOSED, "--at", "yesterday"], ExitCode.USAGE, "--at"),
    (
        "signals-demand-empty",
        [*SIGNALS, "--prometheus", CLOSED, "--demand-query", ""],
        ExitCode.USAGE,
        "--demand-query",
    ),
    (
        "signals-token-absent",
        [*SIGNALS, "--prometheus", CLOSED, "--bearer-token-file", "{tmp}/absent"],
        ExitCode.INVALID,
        "absent",
    ),
    (
        "signals-token-not-utf8",
        [*SIGNALS, "--prometheus", CLOSED, "--bearer-token-file", "{tmp}/latin1.yaml"],
        ExitCode.INVALID,
        "latin1.yaml",
    ),
    (
        "signals-ca-absent",
        [*SIGNALS, "--prometheus", CLOSED, "--ca-file", "{tmp}/absent.pem"],
        ExitCode.INVALID,
        "absent.pem",
    ),
    (
        "signals-unreachable",
        [*SIGNALS, "--prometheus", CLOSED, "--timeout", "2"],
        ExitCode.UNAVAILABLE,
        CLOSED,
    ),
    # report
    ("report-no-flags", ["report"], ExitCode.USAGE, "--around"),
    ("report-no-prometheus", REPORT, ExitCode.USAGE, "--prometheus"),
    ("report-url", [*REPORT, "--prometheus", "prometheus:9090"], ExitCode.USAGE, "--prometheus"),
    ("report-step", [*REPORT, "--prometheus", CLOSED, "--step", "soon"], ExitCode.USAGE, "--step"),
    (
        "report-step-short",
        [*REPORT, "--prometheus", CLOSED, "--step", "30s"],
        ExitCode.USAGE,
        "--step",
    ),
    (
        "report-before-not-whole-steps",
        [*REPORT, "--prometheus", CLOSED, "--before", "30h"],
        ExitCode.USAGE,
        "--before",
    ),
    (
        "report-too-many-windows",
        [*REPORT, "--prometheus", CLOSED, "--step", "1m"],
        ExitCode.USAGE,
        "--step",
    ),
    (
        "report-around",
        [*REPORT, "--prometheus", CLOSED, "--around", "yesterday"],
        ExitCode.USAGE,
        "--around",
    ),
    (
        "report-around-policy-name",
        [*REPORT, "--prometheus", CLOSED, "--around", "policy/Rag_1"],
        ExitCode.USAGE,
        "--around",
    ),
    (
        "report-namespace-without-policy",
        [*REPORT, "--prometheus", CLOSED, "--namespace", "rag"],
        ExitCode.USAGE,
        "--namespace",
    ),
    (
        "report-around-policy-kubeconfig-absent",
        [*AROUND_POLICY, "--kubeconfig", "{tmp}/absent-kubeconfig"],
        ExitCode.INVALID,
        "--kubeconfig",
    ),
    (
        "report-around-policy-api-server-down",
        [*AROUND_POLICY, "--kubeconfig", "{tmp}/closed-kubeconfig"],
        ExitCode.UNAVAILABLE,
        "the API server cannot be reached",
    ),
    (
        "report-around-future",
        [*REPORT, "--prometheus", CLOSED, "--around", "2999-01-01"],
        ExitCode.USAGE,
        "--around",
    ),
    (
        "report-selector-regex",
        [*REPORT[:4], 'ns=~"x"', *REPORT[5:], "--prometheus", CLOSED],
        ExitCode.USAGE,
        "--selector",
    ),
    (
        "report-format",
        [*REPORT, "--prometheus", CLOSED, "--format", "xml"],
        ExitCode.USAGE,
        "--format",
    ),
    (
        "report-slo",
        [*REPORT, "--prometheus", CLOSED, "--slo-ttft-p95", "0"],
        ExitCode.USAGE,
        "--slo",
    ),
    (
        "report-gpus",
        [*REPORT, "--prometheus", CLOSED, "--gpus-per-pod", "-1"],
        ExitCode.USAGE,
        "--gpus",
    ),
    (
        "report-out-a-file",
        [*REPORT, "--prometheus", CLOSED, "--out", "{tmp}/a-file"],
        ExitCode.INVALID,
        "--out",
    ),
    (
        "report-token-absent",
        [*REPORT, "--prometheus", CLOSED, "--bearer-token-file", "{tmp}/absent"],
        ExitCode.INVALID,
        "absent",
    ),
    (
        "report-unreachable",
        [*REPORT, "--prometheus", CLOSED, "--timeout", "2"],
        ExitCode.UNAVAILABLE,
        CLOSED,
    ),
    # run (none of these reaches a cluster)
    ("run-metrics-port", ["run", "--metrics-port", "-1"], ExitCode.USAGE, "--metrics-port"),
    ("run-health-port", ["run", "--health-port", "http"], ExitCode.USAGE, "--health-port"),
    ("run-namespace", ["run", "--namespace", "Bad_NS"], ExitCode.USAGE, "--namespace"),
    ("run-peering", ["run", "--peering", "two words"], ExitCode.USAGE, "--peering"),
    (
        "run-policy-selector",
        ["run", "--policy-selector", "team in search"],
        ExitCode.USAGE,
        "--policy-selector",
    ),
    ("run-policy-selector-empty", ["run", "--policy-selector", ""], ExitCode.USAGE, "empty"),
    ("run-log-format", ["run", "--log-format", "xml"], ExitCode.USAGE, "--log-format"),
    ("run-status-refresh", ["run", "--status-refresh", "10s"], ExitCode.USAGE, "--status-refresh"),
    (
        "run-allowed-url-regex",
        ["run", "--allowed-prometheus-url", "re:("],
        ExitCode.USAGE,
        "--allowed-prometheus-url",
    ),
    (
        "run-kubeconfig-absent",
        ["run", "--kubeconfig", "{tmp}/absent-kubeconfig"],
        ExitCode.INVALID,
        "--kubeconfig",
    ),
    (
        "run-kubeconfig-not-yaml",
        ["run", "--kubeconfig", "{tmp}/tabs.yaml"],
        ExitCode.INVALID,
        "--kubeconfig",
    ),
    (
        "run-kubeconfig-ca-not-a-certificate",
        ["run", "--kubeconfig", "{tmp}/garbled-ca-kubeconfig"],
        ExitCode.INVALID,
        "CA or client certificate is not usable",
    ),
    (
        "run-kubeconfig-a-folder",
        ["run", "--kubeconfig", "{tmp}/empty-dir"],
        ExitCode.INVALID,
        "--kubeconfig",
    ),
    # init (none of these gets an answer from a cluster or a Prometheus)
    ("init-no-deployment", [*INIT[:2], *INIT[4:]], ExitCode.USAGE, "--deployment"),
    ("init-url-no-scheme", [*INIT[:6], "prometheus:9090"], ExitCode.USAGE, "--prometheus"),
    ("init-history", [*INIT, "--history", "soon"], ExitCode.USAGE, "--history"),
    ("init-history-short", [*INIT, "--history", "30s"], ExitCode.USAGE, "--history"),
    ("init-at", [*INIT, "--at", "yesterday"], ExitCode.USAGE, "--at"),
    ("init-policy-url", [*INIT, "--policy-prometheus", "x"], ExitCode.USAGE, "--policy-prometheus"),
    (
        "init-kubeconfig-absent",
        [*INIT, "--kubeconfig", "{tmp}/absent-kubeconfig"],
        ExitCode.INVALID,
        "--kubeconfig",
    ),
    (
        "init-api-server-down",
        [*INIT, "--kubeconfig", "{tmp}/closed-kubeconfig"],
        ExitCode.UNAVAILABLE,
        "the API server cannot be reached",
    ),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad-input")
    for name, content in FILES.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content, encoding="utf-8")
    (folder / "empty-dir").mkdir()
    return folder


def test_the_matrix_is_large_and_covers_every_subcommand() -> None:
    assert len(CASES) >= 40
    assert len({case[0] for case in CASES}) == len(CASES)
    commands = {case[1][0] for case in CASES if case[1]}
    assert {
        "crd",
        "validate",
        "groups",
        "simulate",
        "emulate",
        "signals",
        "report",
        "run",
        "init",
    } <= commands


@pytest.mark.parametrize(
    ("argv", "code", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_and_a_documented_code(
    prepared: Path, argv: list[str], code: ExitCode, named: str
) -> None:
    args = [arg.replace("{tmp}", str(prepared)) for arg in argv]
    finished = subprocess.run(
        [sys.executable, "-m", "cachescale.commands.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=prepared,
    )
    both = finished.stdout + finished.stderr
    assert "Traceback" not in both, both
    assert finished.returncode == code, both
    lines = finished.stderr.splitlines()
    assert len(lines) == 1, finished.stderr
    assert named in lines[0], lines[0]


def as_from_a_terminal() -> None:
    """In the child, before exec: SIGINT unblocked and at its default action, as a shell
    starts a command. Both are inherited across exec, and a test runner's worker process
    may have SIGINT ignored or blocked, which Python would keep: no KeyboardInterrupt."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_in_a_simulation_is_exit_130_without_a_traceback() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "cachescale.commands.main", "simulate", "--scenario", "rag-rechunk"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    # Past the imports (under a second of CPU), inside the simulation (about a minute of
    # CPU): counted in CPU time, which a loaded machine does not stretch as it does wall time.
    wait_for(
        lambda: True if cpu_seconds(process.pid) >= 2.0 else None, 60, "the simulation running"
    )
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.INTERRUPTED, err
    assert "Traceback" not in out + err
    assert err.strip() == "cachescale: interrupted"
