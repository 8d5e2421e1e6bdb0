"""The emulator standing in for a real Deployment: its replicas scraped as the real pods.

``assign`` and the emulator's endpoints are driven directly (no clock, no cluster); the
Kubernetes side (``commands/emulate_pods.py``) runs against kmock's fake API server over
real HTTP, through a kubeconfig, as ``cachescale emulate --pods-of`` does. The same flag
on a real API server, with pods named by the real controllers and read by the operator,
is e2e/test_emulator_pods_of.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kmock
import pytest

from cachescale.commands.emulate_pods import PodsOf, lister_of, serving_pods
from cachescale.commands.main import main
from cachescale.emulator.pods_of import PodFollower, PodListError, assign
from cachescale.emulator.runtime import Emulator, EmulatorSettings
from cachescale.exit_codes import ExitCode
from cachescale.sim.run import Simulation
from cachescale.sim.scenario import Scenario
from tests.commands.report_policy import kubeconfig
from tests.controller.cluster import DEPLOYMENTS, NAMESPACE, PODS, FakeCluster, fake_cluster
from tests.prometheus_fixture import fixed_fleet_scenario, free_port, free_port_block, http_get

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


# -- assign: which replica is scraped as which pod -------------------------------------------


def test_free_pods_go_oldest_first_to_the_lowest_replicas() -> None:
    assert assign({}, [2, 0, 1], ["a", "b", "c"]) == {0: "a", 1: "b", 2: "c"}


def test_a_replica_keeps_its_pod_while_both_exist() -> None:
    current = {0: "a", 1: "b"}
    assert assign(current, [0, 1], ["c", "b", "a"]) == current
    # Pod a is gone: replica 0 takes the oldest pod no replica holds, replica 1 keeps b.
    assert assign(current, [0, 1], ["b", "c"]) == {0: "c", 1: "b"}
    # Replica 0 is gone: its pod goes to the next replica without one.
    assert assign(current, [1, 2], ["a", "b"]) == {1: "b", 2: "a"}


def test_replicas_beyond_the_pods_get_none_and_pods_beyond_the_replicas_stay_free() -> None:
    assert assign({}, [0, 1, 2], ["a"]) == {0: "a"}
    assert assign({}, [0], ["a", "b"]) == {0: "a"}
    assert assign({0: "a"}, [0], []) == {}


# -- the emulator's endpoints under real pods' names --------------------------------------


class Pods:
    """The real pods' names as a test sets them (what the follower would hold)."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)

    def __call__(self) -> list[str]:
        return list(self.names)


@pytest.fixture
def pods() -> Pods:
    return Pods("vllm-7d9-abc", "vllm-7d9-def")


@pytest.fixture
def emulator(pods: Pods) -> Iterator[Emulator]:
    scenario = Scenario.model_validate(fixed_fleet_scenario(replicas=2, duration_s=60))
    settings = EmulatorSettings(
        model_name="test-model",
        namespace="serving",
        deployment="vllm",
        base_port=free_port_block(8),
    )
    emulator = Emulator(Simulation(scenario, None), settings, pods)
    yield emulator
    emulator.close()


def test_each_served_replica_is_a_real_pod_in_its_namespace(emulator: Emulator) -> None:
    changes = emulator.advance_to(10.0)
    assert [(t.namespace, t.pod) for t in changes.added] == [
        ("serving", "vllm-7d9-abc"),
        ("serving", "vllm-7d9-def"),
    ]
    assert emulator.targets() == sorted(changes.added)
    for target in emulator.targets():
        assert b"vllm:num_requests_running" in http_get(target.url)
    truth = emulator.truth_snapshot()["pods"]
    assert {label: pod["target_pod"] for label, pod in truth.items()} == {
        "vllm-engine-0": "vllm-7d9-abc",
        "vllm-engine-1": "vllm-7d9-def",
    }


def test_a_replaced_pod_renames_the_replica_at_the_same_address(
    emulator: Emulator, pods: Pods
) -> None:
    emulator.advance_to(10.0)
    before = {t.pod: t.address for t in emulator.targets()}
    pods.names = ["vllm-7d9-def", "vllm-7d9-xyz"]  # abc deleted, xyz created
    changes = emulator.advance_to(11.0)
    assert [t.pod for t in changes.removed] == ["vllm-7d9-abc"]
    assert [t.pod for t in changes.added] == ["vllm-7d9-xyz"]
    assert changes.added[0].address == before["vllm-7d9-abc"]
    after = {t.pod: t.address for t in emulator.targets()}
    assert after == {"vllm-7d9-def": before["vllm-7d9-def"], "vllm-7d9-xyz": before["vllm-7d9-abc"]}
    assert not emulator.advance_to(12.0)  # nothing changed: nothing reported


def test_a_replica_without_a_pod_is_not_served_until_one_comes(
    emulator: Emulator, pods: Pods
) -> None:
    pods.names = ["vllm-7d9-abc"]
    emulator.advance_to(10.0)
    assert [t.pod for t in emulator.targets()] == ["vllm-7d9-abc"]
    truth = emulator.truth_snapshot()["pods"]
    assert truth["vllm-engine-1"]["served"] is False
    assert truth["vllm-engine-1"]["target_pod"] is None
    pods.names = ["vllm-7d9-abc", "vllm-7d9-new"]
    changes = emulator.advance_to(11.0)
    assert [t.pod for t in changes.added] == ["vllm-7d9-new"]
    pods.names = []
    assert {t.pod for t in emulator.advance_to(12.0).removed} == {"vllm-7d9-abc", "vllm-7d9-new"}
    assert emulator.targets() == []


# -- the follower: listings on a thread, failures reported once ---------------------------


def test_a_failing_listing_keeps_the_last_pods_and_is_reported_once_each_way() -> None:
    answers: list[list[str] | PodListError] = [
        PodListError("the API server said no"),
        PodListError("the API server said no"),
        ["b"],
    ]
    reports: list[str] = []

    def listing() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, PodListError):
            raise answer
        return answer

    follower = PodFollower(listing, ["a"], reports.append)
    follower.refresh()
    follower.refresh()
    assert follower.names() == ("a",)
    assert reports == ["the API server said no; serving the last pods listed until it works again"]
    follower.refresh()
    assert follower.names() == ("b",)
    assert reports[1:] == ["listing the pods works again"]


def test_the_follower_lists_again_on_its_own_until_stopped() -> None:
    listed = threading.Event()

    def listing() -> list[str]:
        listed.set()
        return ["new"]

    follower = PodFollower(listing, ["old"], lambda line: None, every_s=0.01)
    follower.start()
    assert listed.wait(5)
    follower.stop()
    assert follower.names() == ("new",)


# -- the Kubernetes side: the Deployment's selector, its pods ------------------------------


def pod(name: str, age_s: float, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": {"app": "vllm"},
        "creationTimestamp": (START - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if status.pop("deleting", False):
        meta["deletionTimestamp"] = START.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def test_pods_that_may_serve_are_named_oldest_first() -> None:
    listed = [
        pod("vllm-c", 10, phase="Running"),
        pod("vllm-a", 30, phase="Pending"),
        pod("vllm-b", 30),
        pod("vllm-done", 50, phase="Succeeded"),
        pod("vllm-failed", 50, phase="Failed"),
        pod("vllm-leaving", 60, phase="Running", deleting=True),
    ]
    assert serving_pods(listed) == ["vllm-a", "vllm-b", "vllm-c"]


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    """kmock's API server with the Deployment's scale (its selector) and two pods."""
    with fake_cluster() as running:
        view = running.emulator["get", kmock.resource(DEPLOYMENTS), kmock.subresource("scale")]
        scale = {"kind": "Scale", "spec": {"replicas": 2}, "status": {"selector": "app=vllm"}}
        running.react(view, scale)
        running.put(PODS, pod("vllm-new", 10, phase="Running"))
        running.put(PODS, pod("vllm-old", 100, phase="Running"))
        yield running


def test_the_pods_are_listed_with_the_selector_the_api_server_gives(cluster: FakeCluster) -> None:
    names, first = lister_of(cluster.api, PodsOf(NAMESPACE, "vllm"))
    assert first == ["vllm-old", "vllm-new"]
    lists = [r for r in cluster.requests("get") if str(r.url.path).endswith("/pods")]
    assert [r.params.get("labelSelector") for r in lists] == ["app=vllm"]
    cluster.put(PODS, pod("vllm-newer", 1, phase="Pending"))
    assert names() == ["vllm-old", "vllm-new", "vllm-newer"]


def emulate(folder: Path, server: str, *flags: str) -> int:
    """``cachescale emulate`` on two fixed pods for 20 simulated seconds at 40x."""
    scenario = folder / "scenario.yaml"
    scenario.write_text(json.dumps(fixed_fleet_scenario(replicas=2, duration_s=20)))
    config = kubeconfig(folder, server)
    truth = str(folder / "truth.json")
    return main(
        ["emulate", "--scenario-file", str(scenario), "--kubeconfig", config,
         "--ground-truth", truth, "--speed", "40", *flags]
    )  # fmt: skip


def test_emulate_pods_of_serves_the_replicas_as_the_deployments_pods(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = emulate(tmp_path, cluster.url, "--pods-of", "llm/vllm")
    out = capsys.readouterr()
    assert code == ExitCode.OK, out.err
    assert "serving as the pods of Deployment llm/vllm (2 now: vllm-old, vllm-new)" in out.out
    added = [line.split()[3] for line in out.out.splitlines() if "] + " in line]
    assert added == ["llm/vllm-old", "llm/vllm-new"]
    assert out.err == ""


def test_pods_of_failures_are_one_line_with_their_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_cluster() as empty:  # no Deployment: the scale subresource is not found
        code = emulate(tmp_path, empty.url, "--pods-of", "llm/vllm")
    err = capsys.readouterr().err
    assert code == ExitCode.INVALID
    assert (
        err
        == "cachescale emulate: --pods-of llm/vllm: Deployment vllm not found in namespace llm\n"
    )

    closed = f"http://127.0.0.1:{free_port()}"
    assert emulate(tmp_path, closed, "--pods-of", "vllm") == ExitCode.UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith(
        "cachescale emulate: --pods-of llm/vllm: the API server cannot be reached"
    )
    assert err.count("\n") == 1

    assert emulate(tmp_path, closed, "--pods-of", "a/vllm", "--namespace", "b") == ExitCode.USAGE
    assert capsys.readouterr().err == (
        "cachescale emulate: --pods-of a/vllm and --namespace b name two namespaces; give one\n"
    )


@pytest.mark.parametrize("flags", [["--pods-of", "Not_A_Name"], ["--pods-of", "a/b/c"],
                                   ["--pods-of", "vllm", "--deployment", "x"]])  # fmt: skip
def test_pods_of_usage_errors_exit_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["emulate", *flags])
    assert stopped.value.code == ExitCode.USAGE
    assert "--pods-of" in capsys.readouterr().err
