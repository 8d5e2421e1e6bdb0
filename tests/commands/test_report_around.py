"""``cachescale report --around policy/NAME``: which moment a policy's status gives, and
the command's answers when the policy cannot give one.

The status reading is pure (``commands/report_around.py``) and checked on status objects in
the shape the operator writes (``api/status.py``). The command is run against kmock's
fake API server over real HTTP, through a kubeconfig, as an on-call engineer would run it;
the report itself, read from a real Prometheus, is in ``test_report.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cachescale.api.spec import Engine
from cachescale.commands.main import main
from cachescale.commands.report_around import (
    PolicyRef,
    collapse_centre,
    namespace_name,
    policy_ref,
    sources,
)
from cachescale.exit_codes import ExitCode
from tests.commands.report_policy import RESOURCE, alert, kubeconfig, stored_policy
from tests.controller.cluster import FakeCluster, fake_cluster

ONSET = "2026-11-30T14:02:00Z"


def condition(status: str, reason: str, at: str) -> dict[str, Any]:
    return {"type": "CacheHealthy", "status": status, "reason": reason, "lastTransitionTime": at}


def decision(at: str, diagnosis: str) -> dict[str, Any]:
    return {"time": at, "diagnosis": diagnosis, "reason": "Held", "message": "...", "applied": True}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


# --- which moment -----------------------------------------------------------------------


def test_an_active_alert_gives_its_since_even_when_acknowledged() -> None:
    status = {
        "alerts": [alert("2026-11-30T15:00:00Z", "SLOAtRisk"), alert(ONSET, acknowledged=True)],
        "conditions": [condition("False", "PrefixCollapse", "2026-11-30T14:05:00Z")],
    }
    centre = collapse_centre("rag/vllm", status)
    assert centre is not None
    assert (centre.at, centre.source) == (at(ONSET), "alert")
    assert centre.sentence.startswith(
        "centred on policy rag/vllm's PrefixCollapse since 2026-11-30 14:02 UTC"
    )
    assert "acknowledged" in centre.sentence


def test_without_the_alert_a_false_cache_condition_gives_its_transition() -> None:
    status = {"conditions": [condition("False", "PrefixCollapse", ONSET)]}
    centre = collapse_centre("rag/vllm", status)
    assert centre is not None
    assert (centre.at, centre.source) == (at(ONSET), "condition")


def test_a_cleared_collapse_is_not_guessed_from_the_last_decision() -> None:
    """Healed at 18:00: the condition's transition is the healing, never the collapse,
    and a last decision diagnosed PrefixCollapse without the alert or the condition is
    no onset either: the time is the user's to give."""
    status = {
        "conditions": [condition("True", "HitRateAtBaseline", "2026-11-30T18:00:00Z")],
        "lastDecision": decision("2026-11-30T18:30:00Z", "PrefixCollapse"),
    }
    assert collapse_centre("rag/vllm", status) is None


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"alerts": [alert(ONSET, "SLOAtRisk")], "conditions": [condition("True", "x", ONSET)]},
        {"alerts": [alert("not a time")]},
        {"conditions": [condition("False", "EvictionPressure", ONSET)]},
        {"lastDecision": decision(ONSET, "CacheDegraded")},
    ],
    ids=["empty", "other-alert", "bad-time", "eviction", "degraded"],
)
def test_no_collapse_recorded_gives_none(status: dict[str, Any]) -> None:
    assert collapse_centre("rag/vllm", status) is None


def test_the_sources_fall_back_as_the_spec_does() -> None:
    bare = sources({"target": {"deploymentName": "vllm"}, "metrics": {}}, "rag")
    assert (bare.prometheus_url, bare.selector, bare.engine) == (
        None,
        {"namespace": "rag"},
        Engine.VLLM,
    )
    spec = {
        "target": {"engine": "sglang"},
        "metrics": {"prometheusUrl": "http://prom:9090", "selector": {"app": "sg"}},
    }
    full = sources(spec, "rag")
    assert (full.prometheus_url, full.selector, full.engine) == (
        "http://prom:9090",
        {"app": "sg"},
        Engine.SGLANG,
    )


def test_policy_and_namespace_names_are_checked_before_anything_is_read() -> None:
    assert policy_ref("policy/vllm.a-1") == PolicyRef("vllm.a-1")
    for bad in ("policy/", "policy/Bad_Name", "policy/" + "a" * 254):
        with pytest.raises(argparse.ArgumentTypeError, match="policy/NAME"):
            policy_ref(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="namespace"):
        namespace_name("Rag")


# --- the command against a fake API server ----------------------------------------------


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with fake_cluster() as running:
        yield running


def report(config: str, *flags: str) -> int:
    around = ["--around", "policy/vllm", "--step", "12h"]
    return main(["report", *around, "--kubeconfig", config, *flags])


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    return err.strip()


def test_a_policy_not_found_is_exit_1_naming_it_and_its_namespace(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.put(RESOURCE, stored_policy("rag", {"alerts": [alert(ONSET)]}))
    config = kubeconfig(tmp_path, cluster.url)  # no context namespace: "default"
    assert report(config) == ExitCode.INVALID
    assert one_line(capsys) == (
        "cachescale report: CacheScalingPolicy vllm not found in namespace default"
    )


def test_a_policy_without_a_collapse_is_exit_1_in_one_line(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy = {"conditions": [condition("True", "HitRateAtBaseline", ONSET)]}
    cluster.put(RESOURCE, stored_policy("rag", healthy))
    assert report(kubeconfig(tmp_path, cluster.url), "--namespace", "rag") == ExitCode.INVALID
    line = one_line(capsys)
    assert line.startswith("cachescale report: policy rag/vllm records no PrefixCollapse")
    assert "give --around a time" in line
    assert "cachescale_alert_active" in line


def test_the_operators_default_prometheus_needs_the_flag(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.put(RESOURCE, stored_policy("rag", {"alerts": [alert(ONSET)]}, prometheus_url=None))
    config = kubeconfig(tmp_path, cluster.url, namespace="rag")
    assert report(config) == ExitCode.INVALID
    assert one_line(capsys) == (
        "cachescale report: policy rag/vllm reads the operator's default Prometheus (no "
        "spec.metrics.prometheusUrl); give --prometheus URL"
    )


def test_the_policys_prometheus_is_read_and_its_failure_is_exit_3(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the policy's prometheusUrl refuses at once: the read got that far, with its URL
    cluster.put(RESOURCE, stored_policy("rag", {"alerts": [alert(ONSET)]}))
    config = kubeconfig(tmp_path, cluster.url, namespace="rag")
    assert report(config, "--timeout", "2", "--before", "12h", "--after", "12h") == 3
    assert "http://127.0.0.1:1" in one_line(capsys)


def test_namespace_and_kubeconfig_belong_to_policy_around(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--around", ONSET, "--step", "12h", "--prometheus", "http://127.0.0.1:1"]
    flags += ["--engine", "vllm", "--selector", 'namespace="rag"', "--namespace", "rag"]
    assert main(["report", *flags]) == ExitCode.USAGE
    assert one_line(capsys) == (
        "cachescale report: --namespace applies only to --around policy/NAME"
    )


def test_without_the_kubernetes_client_it_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # importing it raises ImportError
    monkeypatch.delitem(sys.modules, "cachescale.controller.kube.client", raising=False)
    assert report(str(tmp_path / "kubeconfig")) == ExitCode.INVALID
    assert one_line(capsys) == (
        "cachescale report: --around policy/NAME needs kubernetes: "
        "pip install '.[operator]' in a clone of the cachescale repository"
    )
