"""Patching the HPA and the engine flags: content, preserved fields, conflicts, restore
(and no restore from a tampered record)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import kmock
import pytest

from cachescale.api.policy import MANAGED_BY, MAX_NUM_SEQS_CHANGED, ORIGINAL_ENVELOPE
from cachescale.api.reasons import Problem
from cachescale.api.spec import Engine, TargetSpec
from cachescale.controller.target.actions import (
    apply_envelope,
    apply_max_num_seqs,
    restore_envelope,
)
from cachescale.controller.target.engine_flags import FlagError, find_flag
from cachescale.controller.target.workload import TargetError
from cachescale.decide.envelope import Envelope
from tests.controller.cluster import NAMESPACE, FakeCluster, deployment, hpa

HPAS = "autoscaling/v2/horizontalpodautoscalers"
DEPLOYMENTS = "apps/v1/deployments"
TARGET = TargetSpec(deployment_name="vllm", hpa_name="vllm")
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("command", "args", "field", "expected"),
    [
        (
            None,
            ["--model", "m", "--max-num-seqs", "64"],
            "args",
            ["--model", "m", "--max-num-seqs", "48"],
        ),
        (
            None,
            ["--max-num-seqs=64", "--model", "m"],
            "args",
            ["--max-num-seqs=48", "--model", "m"],
        ),
        (
            ["vllm", "serve", "m", "--max-num-seqs", "64"],
            [],
            "command",
            ["vllm", "serve", "m", "--max-num-seqs", "48"],
        ),
        (
            ["vllm", "serve", "m", "--max-num-seqs=64"],
            None,
            "command",
            ["vllm", "serve", "m", "--max-num-seqs=48"],
        ),
    ],
)
def test_ceiling_patch_keeps_the_users_form(
    cluster: FakeCluster,
    command: list[str] | None,
    args: list[str] | None,
    field: str,
    expected: list[str],
) -> None:
    cluster.put(DEPLOYMENTS, deployment(command=command, args=args))
    before = cluster.get(DEPLOYMENTS, "vllm")
    assert apply_max_num_seqs(cluster.api, NAMESPACE, TARGET, 48, NOW)
    after = cluster.get(DEPLOYMENTS, "vllm")
    engine = after["spec"]["template"]["spec"]["containers"][1]
    assert engine[field] == expected
    assert (
        after["spec"]["template"]["spec"]["containers"][0]
        == before["spec"]["template"]["spec"]["containers"][0]
    )
    assert after["metadata"]["annotations"][MAX_NUM_SEQS_CHANGED] == NOW.isoformat()
    assert not apply_max_num_seqs(cluster.api, NAMESPACE, TARGET, 48, NOW)  # already there


def test_sglang_uses_its_own_flag() -> None:
    location = find_flag(
        Engine.SGLANG, None, ["--max-running-requests", "128", "--max-num-seqs", "4"]
    )
    assert location is not None
    assert (location.field, location.index, location.value) == ("args", 1, 128)


@pytest.mark.parametrize(
    "args",
    [
        ["--max-num-seqs"],
        ["--max-num-seqs", "lots"],
        ["--max-num-seqs=0"],
        ["--max-num-seqs=8", "--max-num-seqs", "9"],
    ],
)
def test_unusable_flags_are_errors_not_guesses(args: list[str]) -> None:
    with pytest.raises(FlagError):
        find_flag(Engine.VLLM, None, args)


def test_envelope_patch_touches_only_min_max_and_the_queue_target(cluster: FakeCluster) -> None:
    cluster.put(HPAS, hpa())
    before = cluster.get(HPAS, "vllm")
    assert apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(3, 12, 19.2), "llm/vllm")
    after = cluster.get(HPAS, "vllm")
    assert (after["spec"]["minReplicas"], after["spec"]["maxReplicas"]) == (3, 12)
    assert after["spec"]["metrics"][1]["pods"]["target"]["averageValue"] == "19200m"
    assert after["spec"]["metrics"][0] == before["spec"]["metrics"][0]
    assert after["spec"]["behavior"] == before["spec"]["behavior"]
    assert after["spec"]["scaleTargetRef"] == before["spec"]["scaleTargetRef"]
    original = json.loads(after["metadata"]["annotations"][ORIGINAL_ENVELOPE])
    assert original == {"minReplicas": 2, "maxReplicas": 40, "metricIndex": 1, "averageValue": "24"}
    assert after["metadata"]["annotations"][MANAGED_BY] == "llm/vllm"
    # A second change does not overwrite the recorded original.
    assert apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(3, 10, 19.2), "llm/vllm")
    assert (
        json.loads(cluster.get(HPAS, "vllm")["metadata"]["annotations"][ORIGINAL_ENVELOPE])
        == original
    )


def test_unchanged_envelope_sends_no_patch(cluster: FakeCluster) -> None:
    cluster.put(HPAS, hpa())
    assert not apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(2, 40, 24.0), "llm/vllm")
    assert cluster.requests("patch") == []


def test_a_conflict_is_retried_with_a_fresh_read(cluster: FakeCluster) -> None:
    cluster.put(HPAS, hpa())
    cluster.react(cluster.emulator["patch", kmock.resource(HPAS)][:1], 409)
    apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(2, 12, 24.0), "llm/vllm")
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 12
    assert len(cluster.requests("patch")) >= 1
    gets = [r for r in cluster.requests("get") if "horizontalpodautoscalers" in str(r.url)]
    assert len(gets) == 2  # read, conflict, read again


def test_restore_puts_the_original_back_and_forgets_it(cluster: FakeCluster) -> None:
    cluster.put(HPAS, hpa())
    before = cluster.get(HPAS, "vllm")
    apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(4, 12, 19.2), "llm/vllm")
    assert restore_envelope(cluster.api, NAMESPACE, TARGET)
    after = cluster.get(HPAS, "vllm")
    assert after["spec"] == before["spec"]
    assert ORIGINAL_ENVELOPE not in after["metadata"].get("annotations", {})
    assert not restore_envelope(cluster.api, NAMESPACE, TARGET)  # nothing recorded any more


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ('{"minReplicas": 2, "maxRepl', "not JSON"),
        ('["minReplicas", 2]', "not a JSON object"),
        ('{"minReplicas": 2}', "has keys"),
        ('{"minReplicas": 2, "maxReplicas": 40, "replicas": 7}', "has keys"),
        ('{"minReplicas": 0, "maxReplicas": 40}', "whole numbers from 1"),
        ('{"minReplicas": 2.5, "maxReplicas": 40}', "whole numbers from 1"),
        ('{"minReplicas": 9, "maxReplicas": 3}', "minReplicas 9 is above maxReplicas 3"),
        ('{"minReplicas": 2, "maxReplicas": 40, "metricIndex": 1}', "go together"),
        (
            '{"minReplicas": 2, "maxReplicas": 40, "metricIndex": 0, "averageValue": "24"}',
            "not the HPA's queue metric",
        ),
        (
            '{"minReplicas": 2, "maxReplicas": 40, "metricIndex": 1, "averageValue": "lots"}',
            "not a quantity",
        ),
    ],
)
def test_a_tampered_record_is_refused_and_nothing_restored(
    cluster: FakeCluster, record: str, problem: str
) -> None:
    cluster.put(HPAS, hpa())
    apply_envelope(cluster.api, NAMESPACE, TARGET, Envelope(4, 12, 19.2), "llm/vllm")
    tampered = cluster.get(HPAS, "vllm")
    tampered["metadata"]["annotations"][ORIGINAL_ENVELOPE] = record
    cluster.put(HPAS, tampered)
    patches = len(cluster.requests("patch"))
    with pytest.raises(TargetError) as refused:
        restore_envelope(cluster.api, NAMESPACE, TARGET)
    assert refused.value.reason is Problem.TARGET_MISMATCH
    assert ORIGINAL_ENVELOPE in refused.value.message
    assert problem in refused.value.message
    assert len(cluster.requests("patch")) == patches  # the HPA is left alone
    assert cluster.get(HPAS, "vllm")["spec"]["maxReplicas"] == 12
