"""``cachescale init`` reports only what it measured: the window its figures cover.

Two vLLM Deployments in kmock's fake API server (over real HTTP, through a kubeconfig),
and their engines' series backfilled into a real Prometheus: ``short`` has 2 minutes of
data, ``steady`` 2 hours, both ending at ``T``. Rates are linear (each pod serves 2 req/s,
TTFT p95 0.875 s), so every figure is known: on 2 pods of 2 GPUs, 4 req/s and 1,000
GPU-s per 1k requests, whatever the window, as long as the rates are taken over the span
the data covers. init refuses a ``--history`` the data does not cover, in one line; with
``--allow-short-history`` it measures over what is held and says so. The end-to-end path
on a real API server with scraped series is e2e/test_init.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from cachescale.api.spec import Engine
from cachescale.commands.init_output import span
from cachescale.commands.main import main
from cachescale.exit_codes import ExitCode
from cachescale.gather.coverage import Coverage, first_sample_query, step_seconds
from cachescale.gather.selector import Selector
from tests.commands.report_policy import kubeconfig
from tests.controller.cluster import (
    DEPLOYMENTS,
    HPAS,
    NAMESPACE,
    PODS,
    FakeCluster,
    deployment,
    fake_cluster,
    hpa,
    pods,
)
from tests.gather.gather_dataset import vllm_pod
from tests.gather.gather_tsdb import (
    Series,
    backfilled_prometheus,
    prometheus_available,
    sample_times,
)
from tests.tools import require_tool

T = (int(time.time()) // 60) * 60 - 600
"""The series' last sample: a whole minute, ten minutes ago (so every run names ``--at``)."""
AT = datetime.fromtimestamp(T, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
HELD_S = {"short": 120, "steady": 7200}
"""How far back each Deployment's series go from ``T``."""
REPLICAS, GPUS = 2, 2
RPS = 2.0 * REPLICAS
"""Requests served per second (``vllm_pod``: 2 per pod, aborts not counted)."""
COST = GPUS * REPLICAS * 1000 / RPS
"""GPU-seconds per 1k requests."""


def moment(unix_seconds: float) -> str:
    return f"{datetime.fromtimestamp(unix_seconds, UTC):%Y-%m-%d %H:%M:%S}"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus holding both Deployments' series; without the binaries it skips
    locally and fails under CI."""
    require_tool(
        prometheus_available(),
        "this needs the prometheus and promtool binaries (apt-get install -y prometheus)",
    )
    series = Series()
    for name, held in HELD_S.items():
        for index in range(REPLICAS):
            labels = {"namespace": NAMESPACE, "model_name": name, "pod": f"{name}-{index}"}
            vllm_pod(series, labels, sample_times(T - held, T))
    with backfilled_prometheus(series, tmp_path_factory.mktemp("init")) as url:
        yield url


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeCluster]:
    """Both Deployments, each under its own HPA, with their ready pods."""
    with fake_cluster() as running:
        now = datetime.now(UTC)
        for name in HELD_S:
            args = ["--model", name, "--max-num-seqs", "32"]
            running.put(DEPLOYMENTS, deployment(name, replicas=REPLICAS, gpus=GPUS, args=args))
            running.put(HPAS, hpa(name, target=name))
            for pod in pods(name, REPLICAS, now):
                running.put(PODS, pod)
        yield running


def init(cluster: FakeCluster, prometheus: str, folder: Path, name: str, *flags: str) -> int:
    config = kubeconfig(folder, cluster.url)
    return main(
        ["init", "--namespace", NAMESPACE, "--deployment", name, "--prometheus", prometheus,
         "--kubeconfig", config, *flags]
    )  # fmt: skip


def header(stdout: str) -> str:
    """The comment lines before the policy."""
    return "\n".join(line for line in stdout.splitlines() if line.startswith("# "))


def proposal(stdout: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(stdout)["spec"]
    return spec


def test_two_minutes_of_data_under_the_default_hour_is_refused_in_one_line(
    cluster: FakeCluster, prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = init(cluster, prometheus, tmp_path, "short", "--at", AT)
    out, err = capsys.readouterr()
    assert code == ExitCode.INVALID
    assert out == ""
    assert err == (
        f"cachescale init: Prometheus holds 2m of data for Deployment short (since "
        f"{moment(T - 120)} UTC), less than --history 1h: rerun with --history 2m, or add "
        "--allow-short-history to measure over those 2m\n"
    )


def test_a_window_the_data_covers_is_named_in_the_header_ending_at_at(
    cluster: FakeCluster, prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = init(cluster, prometheus, tmp_path, "steady", "--history", "1h", "--at", AT)
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, err
    shown = header(out)
    assert "from 1h of history." in shown
    assert f"# Measured over 1h, {moment(T - 3600)} .. {moment(T)} UTC,\n" in shown
    assert f"# with the selector below: {RPS:.1f} req/s served, " in shown
    assert f"{COST:,.0f} GPU-s per 1k requests" in shown
    assert "holds only" not in shown
    assert proposal(out)["budget"]["gpuSecondsPer1kRequests"] == 1150  # COST + 15%


def test_allowed_short_history_is_measured_over_the_span_held_not_the_one_asked(
    cluster: FakeCluster, prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = init(cluster, prometheus, tmp_path, "short", "--at", AT, "--allow-short-history")
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, err
    shown = header(out)
    assert "from 2m of history." in shown
    assert (
        "# Prometheus holds only 2m of the --history 1h asked for (--allow-short-history): "
        "every figure covers those alone." in shown
    )
    assert f"# Measured over 2m, {moment(T - 120)} .. {moment(T)} UTC,\n" in shown
    # Divided by the 2 minutes held, not the hour asked: the rates of the data, and the
    # same proposal as a --history that the data covers.
    assert f"# with the selector below: {RPS:.1f} req/s served, " in shown
    assert f"{COST:,.0f} GPU-s per 1k requests" in shown
    allowed = proposal(out)
    assert init(cluster, prometheus, tmp_path, "short", "--at", AT, "--history", "2m") == 0
    covered = capsys.readouterr().out
    assert f"# Measured over 2m, {moment(T - 120)} .. {moment(T)} UTC,\n" in header(covered)
    assert proposal(covered) == allowed


def test_series_absent_before_at_are_named_with_the_window_at_ends(
    cluster: FakeCluster, prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = datetime.fromtimestamp(T - 3 * 3600, UTC).isoformat()
    code = init(cluster, prometheus, tmp_path, "steady", "--at", before)
    out, err = capsys.readouterr()
    assert code == ExitCode.INVALID
    assert out == ""
    assert err.startswith(
        "cachescale init: no vllm series for Deployment steady over the 1h before "
        f"{moment(T - 3 * 3600)} UTC: "
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(3600, "1h"), (120, "2m"), (133, "2m13s"), (3605, "1h5s"), (45.4, "45s"), (0.2, "0s")],
)
def test_spans_are_written_as_history_takes_them(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_a_window_is_covered_when_its_first_sample_is_within_one_step_of_its_start() -> None:
    assert (step_seconds(3600), step_seconds(120)) == (4, 1)  # a thousandth, whole seconds
    held = Coverage(at=10_000.0, window_seconds=3600, step_seconds=4, first=6_000.0)
    assert (held.starts_late, held.covered_seconds) == (False, 3600)  # from before it
    within = Coverage(at=10_000.0, window_seconds=3600, step_seconds=4, first=6_404.0)
    assert (within.starts_late, within.covered_seconds) == (False, 3600)
    late = Coverage(at=10_000.5, window_seconds=3600, step_seconds=4, first=9_880.2)
    assert late.starts_late
    assert late.covered_seconds == 121  # rounded up: the first sample is inside


def test_the_first_sample_is_read_from_the_served_requests_under_the_selector() -> None:
    selector = Selector.of({"namespace": "llm", "model_name": "m"})
    assert first_sample_query(Engine.VLLM, selector, 3600) == (
        "min(min_over_time(timestamp(vllm:request_success_total"
        '{model_name="m",namespace="llm",finished_reason!~"abort|error"})[3600s:4s]))'
    )
    assert "sglang:num_requests_total{" in first_sample_query(Engine.SGLANG, selector, 120)
