"""KEDA's settings that change what cachescale may manage on a ScaledObject, as pure rules:
``advanced.scalingModifiers`` (no threshold is managed), the one-way pause annotations
(``paused-scale-in`` / ``paused-scale-out``), ``fallback.behavior``, and
``initialCooldownPeriod`` / ``cooldownPeriod`` on a ScaledObject that scales to zero."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from cachescale.api.policy import ORIGINAL_ENVELOPE
from cachescale.controller.target.actions import scaled_object_ops, scaled_object_restore_ops
from cachescale.controller.target.keda import (
    fallback_target,
    notes,
    scaled_object_view,
)
from cachescale.controller.target.keda_pauses import (
    PAUSED_SCALE_IN,
    PAUSED_SCALE_OUT,
    one_way_counts,
    one_way_pauses,
    paused_by,
)
from cachescale.controller.target.keda_triggers import queue_trigger
from cachescale.decide.envelope import Envelope
from tests.controller.target.test_keda import scaled_object

MODIFIERS = {"formula": "queue / 2 + running", "target": "8", "metricType": "AverageValue"}


def with_modifiers(**extra: Any) -> dict[str, Any]:
    """production-stack's ScaledObject with a scalingModifiers formula over its triggers."""
    body = scaled_object(**extra)
    body["spec"]["triggers"][0]["name"] = "queue"
    body["spec"]["advanced"]["scalingModifiers"] = dict(MODIFIERS)
    return body


def envelope(low: int, high: int, target: float | None = 3.0) -> Envelope:
    return Envelope(min_replicas=low, max_replicas=high, target_average_value=target)


def joined(body: dict[str, Any], current: int | None = None) -> str:
    view = scaled_object_view(body, "vllm")
    if current is not None:
        view = replace(view, hpa_current_replicas=current)
    return " | ".join(notes(view))


# -- scalingModifiers ----------------------------------------------------------------------


def test_with_scaling_modifiers_no_trigger_threshold_is_the_hpa_target() -> None:
    view = scaled_object_view(with_modifiers(), "vllm")
    assert view.queue_trigger is None
    assert queue_trigger(with_modifiers()["spec"]) is None
    state = view.hpa_state()
    assert (state.target_average_value, state.metric_name) == (None, None)
    assert (state.min_replicas, state.max_replicas) == (2, 40)


def test_without_scaling_modifiers_the_queue_threshold_is_the_hpa_target() -> None:
    view = scaled_object_view(scaled_object(), "vllm")
    assert view.queue_trigger is not None
    assert view.hpa_state().target_average_value == 5.0
    assert "scalingModifiers" not in joined(scaled_object())


def test_with_scaling_modifiers_only_the_counts_are_patched_and_recorded() -> None:
    ops = scaled_object_ops(with_modifiers(), envelope(2, 11, target=3.0), "vllm")
    paths = [op["path"] for op in ops if op["op"] != "test"]
    assert "/spec/maxReplicaCount" in paths
    assert not any(path.startswith("/spec/triggers") for path in paths), paths
    escaped = ORIGINAL_ENVELOPE.replace("/", "~1")
    record = next(op["value"] for op in ops if op["path"].endswith(escaped))
    assert json.loads(record) == {"maxReplicaCount": 40, "minReplicaCount": 2}


def test_the_status_says_the_threshold_is_not_what_scales() -> None:
    text = joined(with_modifiers())
    assert "sets advanced.scalingModifiers" in text
    assert "'queue / 2 + running'" in text
    assert "no trigger threshold is what scales" in text
    assert "manages only minReplicaCount and maxReplicaCount" in text
    assert "has no Prometheus trigger" not in text  # not mistaken for a trigger-less object


# -- one-way pauses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "wanted", "written"),
    [
        ({}, (1, 5), (1, 5)),  # no pause: as wanted
        ({PAUSED_SCALE_IN: "true"}, (1, 5), (2, 40)),  # lowers nothing
        ({PAUSED_SCALE_IN: "true"}, (4, 60), (4, 60)),  # raises still go through
        ({PAUSED_SCALE_IN: "True"}, (2, 3), (2, 40)),  # a hold waits
        ({PAUSED_SCALE_IN: "false"}, (1, 5), (1, 5)),
        ({PAUSED_SCALE_OUT: "true"}, (6, 60), (2, 60)),  # min is not raised
        ({PAUSED_SCALE_OUT: "true"}, (1, 5), (1, 5)),  # lowering still goes through
        ({PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "true"}, (6, 3), (2, 40)),
    ],
)
def test_one_way_pauses_bound_what_is_written(
    annotations: dict[str, str], wanted: tuple[int, int], written: tuple[int, int]
) -> None:
    assert one_way_counts(annotations, (2, 40), wanted) == written
    low, high = written
    assert low <= high


def test_one_way_pauses_are_not_a_full_pause() -> None:
    annotations = {PAUSED_SCALE_IN: "true", PAUSED_SCALE_OUT: "true"}
    assert paused_by(annotations) is None
    assert one_way_pauses(annotations) == (PAUSED_SCALE_IN, PAUSED_SCALE_OUT)


def test_the_status_says_what_a_one_way_pause_holds_back() -> None:
    text = joined(scaled_object(annotations={PAUSED_SCALE_IN: "true"}))
    assert f"{PAUSED_SCALE_IN}=true" in text
    assert "lowers neither minReplicaCount nor maxReplicaCount" in text
    text = joined(scaled_object(annotations={PAUSED_SCALE_OUT: "true"}))
    assert "does not raise minReplicaCount" in text
    assert "paused-scale" not in joined(scaled_object())


# -- fallback.behavior -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("behavior", "current", "asked"),
    [
        ("static", None, 6),
        ("static", 9, 6),
        ("currentReplicas", 9, 9),
        ("currentReplicasIfHigher", 9, 9),
        ("currentReplicasIfHigher", 3, 6),
        ("currentReplicasIfLower", 9, 6),
        ("currentReplicasIfLower", 3, 3),
        ("currentReplicas", None, None),  # the current count is not known
        ("cached", 9, None),  # a behavior not modelled here
    ],
)
def test_fallback_behavior_chooses_the_replicas_keda_asks_for(
    behavior: str, current: int | None, asked: int | None
) -> None:
    assert fallback_target(behavior, 6, current) == asked


def test_the_fallback_asked_for_is_clamped_to_the_envelope() -> None:
    body = scaled_object(max_count=8)
    body["spec"]["fallback"] = {"failureThreshold": 3, "replicas": 20, "behavior": "static"}
    view = scaled_object_view(body, "vllm")
    assert view.fallback_behavior == "static"
    assert view.fallback_replicas == 8  # the HPA never goes past maxReplicaCount
    assert "falls back to 20 replicas after 3 failed reads" in joined(body)
    assert "behavior static" in joined(body)


def test_the_status_says_which_fallback_behavior_applies() -> None:
    body = scaled_object()
    body["spec"]["fallback"] = {
        "failureThreshold": 3,
        "replicas": 6,
        "behavior": "currentReplicasIfHigher",
    }
    text = joined(body, current=11)
    assert "falls back to the replicas it runs, or 6 if more" in text
    assert "behavior currentReplicasIfHigher" in text
    assert text.endswith("cachescale sets: 11 now")
    unset = scaled_object()
    unset["spec"]["fallback"] = {"failureThreshold": 3, "replicas": 6}
    assert scaled_object_view(unset, "vllm").fallback_behavior == "static"


def test_the_fallback_message_names_the_replicas_its_behavior_asks_for() -> None:
    body = scaled_object(max_count=8)
    body["spec"]["fallback"] = {"failureThreshold": 3, "replicas": 20, "behavior": "static"}
    message = scaled_object_view(body, "vllm").fallback_message()
    assert "KEDA runs 8 replicas (fallback.behavior static)" in message
    body["spec"]["fallback"]["behavior"] = "currentReplicas"
    unknown = scaled_object_view(body, "vllm").fallback_message()
    assert "KEDA runs its fallback (fallback.behavior currentReplicas)" in unknown


# -- scale to zero: cooldownPeriod and initialCooldownPeriod -------------------------------


def test_scale_to_zero_names_the_cooldowns_keda_waits() -> None:
    body = scaled_object(min_count=0)
    body["spec"]["initialCooldownPeriod"] = 120
    text = joined(body)
    assert "only after cooldownPeriod 360s without activity" in text
    assert "nor within initialCooldownPeriod 120s of its creation" in text
    del body["spec"]["cooldownPeriod"], body["spec"]["initialCooldownPeriod"]
    text = joined(body)
    assert "cooldownPeriod 300s" in text  # KEDA's default
    assert "initialCooldownPeriod" not in text  # 0: none


def test_the_cooldowns_are_not_said_without_scale_to_zero() -> None:
    body = scaled_object(min_count=2)
    body["spec"]["initialCooldownPeriod"] = 120
    assert "cooldownPeriod" not in joined(body)


def test_a_record_made_before_scaling_modifiers_still_restores_the_threshold() -> None:
    body = with_modifiers()
    record = {"minReplicaCount": 2, "maxReplicaCount": 40, "triggerIndex": 0, "threshold": "5"}
    body["metadata"]["annotations"] = {ORIGINAL_ENVELOPE: json.dumps(record)}
    body["spec"]["triggers"][0]["metadata"]["threshold"] = "3"
    ops = scaled_object_restore_ops(body)
    assert {"op": "add", "path": "/spec/triggers/0/metadata/threshold", "value": "5"} in ops


def test_a_scale_in_pause_lowers_nothing_and_still_raises() -> None:
    body = scaled_object(annotations={PAUSED_SCALE_IN: "true"})
    assert scaled_object_ops(body, envelope(1, 3, target=5.0), "vllm") == []  # a hold waits
    ops = scaled_object_ops(body, envelope(4, 60, target=5.0), "vllm")
    assert {"op": "add", "path": "/spec/minReplicaCount", "value": 4} in ops
    assert {"op": "add", "path": "/spec/maxReplicaCount", "value": 60} in ops


def test_a_scale_out_pause_does_not_raise_the_floor() -> None:
    body = scaled_object(annotations={PAUSED_SCALE_OUT: "true"})
    ops = scaled_object_ops(body, envelope(6, 3, target=5.0), "vllm")
    assert not any(op["path"] == "/spec/minReplicaCount" for op in ops), ops
    assert {"op": "add", "path": "/spec/maxReplicaCount", "value": 3} in ops
