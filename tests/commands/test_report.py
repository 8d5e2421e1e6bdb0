"""``cachescale report`` on the incident, backfilled into a real Prometheus.

Four days of a vLLM fleet (``report_dataset``): the report must print the incident's shape
(hit rate 0.85 → 0.04, replicas 10 → 18, GPU-s/1k ~630 → ~1,140) and a verdict naming
the divergence, in every format, through the same PromQL as ``cachescale signals``.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cachescale.api.spec import Engine
from cachescale.commands.main import main
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from cachescale.gather.report import SCRAPED_ONLY, Row, read_report, verdict, windows
from cachescale.gather.selector import Selector
from cachescale.gather.signals import SignalRequest
from tests.commands import report_dataset as incident
from tests.commands.report_policy import RESOURCE, alert, kubeconfig, stored_policy
from tests.controller.cluster import fake_cluster
from tests.gather.gather_dataset import AT
from tests.gather.gather_tsdb import backfilled_prometheus, prometheus_available
from tests.tools import require_tool

HOUR = 3600.0
AROUND = datetime.fromtimestamp(incident.AROUND, UTC)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_tool(
        prometheus_available(),
        "this needs the prometheus and promtool binaries (apt-get install -y prometheus)",
    )
    with backfilled_prometheus(incident.incident(), tmp_path_factory.mktemp("incident")) as url:
        yield url


@pytest.fixture(scope="module")
def rows(prometheus: str) -> list[Row]:
    spans, future = windows(AROUND, 12 * HOUR, 48 * HOUR, 48 * HOUR, datetime.now(UTC))
    assert (len(spans), future) == (8, 0)
    request = SignalRequest(
        engine=Engine.VLLM,
        selector=Selector.parse(incident.SELECTOR),
        window_seconds=12 * HOUR,
        gpus_per_pod=2,
    )
    started = time.monotonic()
    with PrometheusClient(PrometheusConfig(url=prometheus, timeout_seconds=30)) as client:
        read = read_report(client, request, spans)
    assert time.monotonic() - started < 30  # eight windows of about twenty queries each
    return read


def column(rows: list[Row], name: str) -> list[float | None]:
    return [getattr(row, name).value for row in rows]


def test_every_window_reads_the_incident_shape(rows: list[Row]) -> None:
    before, after = rows[:4], rows[4:]
    assert [r.window.label for r in rows[3:5]] == ["-12h..+0h", "+0h..+12h"]
    assert column(before, "token_hit_rate") == pytest.approx([0.85] * 4, abs=0.005)
    assert column(after, "token_hit_rate") == pytest.approx([0.04] * 4, abs=0.005)
    assert column(before, "request_hit_share") == pytest.approx([0.6] * 4, abs=0.01)
    assert column(after, "request_hit_share") == pytest.approx([0.0] * 4, abs=0.01)
    assert column(before, "replicas") == pytest.approx([10.0] * 4)
    # The first window after the change holds 18 pods for all but its first 20 minutes.
    assert column(after, "replicas") == pytest.approx([17.8, 18.0, 18.0, 18.0], abs=0.05)
    assert column(rows, "requests_per_second") == pytest.approx(
        [incident.RPS_BEFORE] * 4 + [incident.RPS_AFTER] * 4, rel=0.01
    )
    assert column(before, "gpu_seconds_per_1k") == pytest.approx([631] * 4, rel=0.01)
    assert column(after, "gpu_seconds_per_1k")[1:] == pytest.approx([1139] * 3, rel=0.01)
    assert column(before, "ttft_p95_seconds") == pytest.approx(
        [incident.TTFT_P95_BEFORE] * 4, rel=0.01
    )
    assert column(after, "ttft_p95_seconds") == pytest.approx(
        [incident.TTFT_P95_AFTER] * 4, rel=0.01
    )
    assert column(before, "prefill_tokens_per_request") == pytest.approx([900] * 4, rel=0.01)
    assert column(after, "prefill_tokens_per_request") == pytest.approx([5760] * 4, rel=0.01)
    assert column(before, "preemptions_per_second") == pytest.approx([0.0] * 4)
    assert column(after, "preemptions_per_second")[1:] == pytest.approx([0.36] * 3, rel=0.01)


def test_the_verdict_names_the_divergence(rows: list[Row]) -> None:
    cost, ttft, divergence = verdict(rows, slo_ttft_p95_s=1.0)
    assert cost.startswith("Cost per request rose 81% (GPU-s/1k 631 → 1,139)"), cost
    assert cost.endswith("while demand stayed flat (31.7 → 31.6 req/s, -0.3%)."), cost
    assert ttft.startswith("TTFT p95 stayed within the 1 s SLO in every window"), ttft
    assert divergence.startswith(
        "Divergence: the token hit rate went 0.85 → 0.04 (-95%) and replicas 10 → 18 (+80%): "
        "175 percentage points apart, in opposite directions at flat demand."
    ), divergence


def _cli(prometheus: str, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    code = main(
        [
            "report",
            "--prometheus",
            prometheus,
            "--engine",
            "vllm",
            "--selector",
            incident.SELECTOR,
            "--around",
            AROUND.isoformat(),
            "--step",
            "12h",
            "--gpus-per-pod",
            "2",
            "--slo-ttft-p95",
            "1",
            *flags,
        ]
    )
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    return out


def test_the_table_shows_the_rows_and_the_verdict(
    prometheus: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = _cli(prometheus, capsys, "--out", str(tmp_path))
    lines = out.splitlines()
    assert lines[0].startswith('report for {model_name="llama-3-8b",namespace="rag"} (vllm)')
    header = lines[2].split()
    assert header == [
        "window", "tok-hit", "req-hit", "TTFT-p95", "replicas", "req/s", "GPU-s/1k",
        "prefill/req", "preempt/s",
    ]  # fmt: skip
    first, last = lines[3].split(), lines[10].split()
    assert first == ["-48h..-36h", "0.85", "0.60", "0.47s", "10.0", "31.70", "631", "900", "0.00"]
    assert last[:7] == ["+36h..+48h", "0.04", "0.00", "0.89s", "18.0", "31.60", "1,139"]
    assert "verdict:" in lines
    assert "Divergence:" in out
    assert f"note: {SCRAPED_ONLY}" in lines
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_json_and_csv_parse(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(_cli(prometheus, capsys, "--format", "json"))
    assert len(document["windows"]) == 8
    first = document["windows"][0]["signals"]
    assert first["token_hit_rate"]["value"] == pytest.approx(0.85, abs=0.005)
    assert first["replicas"] == {"value": pytest.approx(10.0), "unit": "pods", "reason": None}
    assert any(sentence.startswith("Divergence:") for sentence in document["verdict"])
    assert (document["kube_state_metrics"], document["caveats"]) == (False, [SCRAPED_ONLY])
    table = list(csv.DictReader(io.StringIO(_cli(prometheus, capsys, "--format", "csv"))))
    assert [row["window"] for row in table][3:5] == ["-12h..+0h", "+0h..+12h"]
    assert float(table[-1]["gpu_seconds_per_1k"]) == pytest.approx(1139, rel=0.01)
    assert float(table[-1]["replicas"]) == pytest.approx(18.0)
    markdown = _cli(prometheus, capsys, "--format", "markdown")
    assert "| +36h..+48h | 0.04 | 0.00 | 0.89s | 18.0 | 31.60 | 1,139 |" in markdown


def test_kube_state_metrics_count_the_pods_loading_weights(
    prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The eight new pods are scheduled at the change and export from 20 minutes later: the
    # engine series see 17.8 pods in the first window after it, kube-state-metrics all 18
    # holding GPUs for the whole window, so its cost is 18 pods' (2 GPUs each).
    document = json.loads(_cli(prometheus, capsys, "--format", "json", "--kube-state-metrics"))
    first_after = document["windows"][4]
    assert first_after["window"] == "+0h..+12h"
    assert first_after["signals"]["replicas"]["value"] == pytest.approx(18.0)
    cost = first_after["signals"]["gpu_seconds_per_1k"]["value"]
    assert cost == pytest.approx(2 * 18 * 1000 / incident.RPS_AFTER, rel=0.01)
    before = document["windows"][0]["signals"]
    assert before["replicas"]["value"] == pytest.approx(10.0)
    assert (document["kube_state_metrics"], document["caveats"]) == (True, [])
    scraped = json.loads(_cli(prometheus, capsys, "--format", "json"))["windows"][4]
    assert scraped["signals"]["replicas"]["value"] == pytest.approx(17.8, abs=0.05)


def test_around_a_policy_centres_on_its_alert_and_reads_where_it_reads(
    prometheus: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The operator raised PrefixCollapse at the incident's change; the policy names the
    # Prometheus and the selector, and the kubeconfig context names its namespace.
    since = AROUND.isoformat().replace("+00:00", "Z")
    policy = stored_policy("rag", {"alerts": [alert(since)]}, prometheus_url=prometheus)
    with fake_cluster() as cluster:
        cluster.put(RESOURCE, policy)
        config = kubeconfig(tmp_path, cluster.url, namespace="rag")
        flags = ["--step", "12h", "--gpus-per-pod", "2", "--kubeconfig", config]
        code = main(["report", "--around", "policy/vllm", *flags])
        out, err = capsys.readouterr()
        assert (code, err) == (0, "")
        assert main(["report", "--around", "policy/vllm", *flags, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["around"] == AROUND.isoformat()
    assert document["centred_on"].startswith("centred on policy rag/vllm's PrefixCollapse")
    assert len(document["windows"]) == 8
    lines = out.splitlines()
    assert lines[0] == (
        f"centred on policy rag/vllm's PrefixCollapse since {AROUND:%Y-%m-%d %H:%M} UTC "
        "(status.alerts)"
    )
    assert lines[1].startswith('report for {model_name="llama-3-8b",namespace="rag"} (vllm)')
    assert lines[4].split() == [
        "-48h..-36h", "0.85", "0.60", "0.47s", "10.0", "31.70", "631", "900", "0.00"
    ]  # fmt: skip
    assert "Divergence:" in out


def test_sglang_windows_read_through_the_same_signals(synthetic_prometheus: str) -> None:
    # gather_dataset's SGLang pod: 60% local hits, 3 req/s, one pod all along.
    spans, _ = windows(AT - timedelta(minutes=10), 300, 300, 600, AT)
    request = SignalRequest(
        engine=Engine.SGLANG,
        selector=Selector.parse('namespace="llm",model_name="sg"'),
        window_seconds=300,
        gpus_per_pod=1,
    )
    with PrometheusClient(PrometheusConfig(url=synthetic_prometheus)) as client:
        read = read_report(client, request, spans)
    assert [r.window.label for r in read] == ["-5m..+0m", "+0m..+5m", "+5m..+10m"]
    assert column(read, "token_hit_rate") == pytest.approx([0.6] * 3)
    assert column(read, "replicas") == pytest.approx([1.0] * 3)
    assert column(read, "gpu_seconds_per_1k") == pytest.approx([1000 / 3] * 3)
    assert read[0].request_hit_share.reason == (
        "SGLang exports no per-request computed-token histogram"
    )
