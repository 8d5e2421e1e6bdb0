"""The decision memory in ``status.learnedState``: one packed line that unpacks to exactly
what was packed, and the structured ``status.memory`` older versions wrote still read."""

from __future__ import annotations

import base64
import json
import zlib
from datetime import timedelta

import pytest
from pydantic import ValidationError

from cachescale.api.reasons import Diagnosis
from cachescale.api.status import (
    LEARNED_STATE_PACKED_LIMIT,
    LEARNED_STATE_VERSION,
    CacheScalingPolicyStatus,
    pack_learned_state,
    unpack_learned_state,
)
from cachescale.decide import LearnedState, decide
from cachescale.decide.learned import LearnedAlert, RateSample
from tests.decide.decide_builders import T0, learned, signals, snapshot, spec


def busy_memory() -> LearnedState:
    """A memory with something in every kind of field: a baseline, streaks, an alert with
    a non-ASCII message, marks over a window, a collapse's evidence."""
    state = snapshot(signals(hit=0.04))
    memory = decide(spec(), state, learned(), T0).memory
    alert = LearnedAlert(reason=Diagnosis.PREFIX_COLLAPSE, since=T0, message="0.85 → 0.04 ± 1")
    samples = [RateSample(at=T0 + timedelta(seconds=10 * i), value=0.04) for i in range(30)]
    evidence = {"started_at": T0, "recent_hit_rates": samples}
    return memory.model_copy(
        update={"alerts": [alert], "collapse_evidence": memory.collapse_evidence or evidence}
    )


def test_a_memory_round_trips_through_learned_state() -> None:
    memory = busy_memory()
    wire = memory.model_dump(mode="json", by_alias=True)
    packed = pack_learned_state(wire)
    assert packed.startswith(f"{LEARNED_STATE_VERSION}:")
    assert unpack_learned_state(packed) == wire
    assert LearnedState.model_validate(unpack_learned_state(packed)) == memory


def test_learned_state_is_one_short_line() -> None:
    """What ``kubectl describe`` shows of the memory: one line, shorter than its JSON."""
    wire = busy_memory().model_dump(mode="json", by_alias=True)
    packed = pack_learned_state(wire)
    assert "\n" not in packed
    assert " " not in packed
    assert len(packed) < len(json.dumps(wire, separators=(",", ":")))


def test_the_status_reads_learned_state_first_and_the_older_memory_otherwise() -> None:
    older = {"dataSince": "2026-11-30T09:00:00Z", "streaks": {"collapse": 2}}
    newer = {"dataSince": "2026-11-30T11:00:00Z"}
    assert CacheScalingPolicyStatus.model_validate({"memory": older}).learned() == older
    both = {"memory": older, "learnedState": pack_learned_state(newer)}
    assert CacheScalingPolicyStatus.model_validate(both).learned() == newer
    assert CacheScalingPolicyStatus().learned() is None
    stored = CacheScalingPolicyStatus.model_validate({"learnedState": pack_learned_state(newer)})
    assert "memory" not in stored.to_wire()


@pytest.mark.parametrize(
    ("packed", "says"),
    [
        ("v2:eJyrrgUAAXUA+Q==", "packed as 'v2'"),
        ("no version", "packed as 'no version'"),
        ("v1:not base64!", "cannot be unpacked"),
        ("v1:" + "aGVsbG8=", "cannot be unpacked"),  # base64, not zlib
        (pack_learned_state({"x": 1}).replace("v1:", "v1:AA"), "cannot be unpacked"),
    ],
)
def test_a_learned_state_that_cannot_be_unpacked_says_why(packed: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        unpack_learned_state(packed)
    with pytest.raises(ValueError, match=says):
        CacheScalingPolicyStatus.model_validate({"learnedState": packed}).learned()


def test_learned_state_holds_an_object() -> None:
    packed = "v1:" + base64.b64encode(zlib.compress(b"[1, 2]")).decode()
    with pytest.raises(ValueError, match="does not hold an object"):
        unpack_learned_state(packed)


def test_a_packing_that_inflates_past_the_limit_is_refused() -> None:
    # Under the packed limit, yet it would inflate to 32 MiB: refused at the limit, not inflated.
    bomb = zlib.compress(b'{"a":"' + b"x" * (32 << 20) + b'"}', 9)
    packed = f"{LEARNED_STATE_VERSION}:{base64.b64encode(bomb).decode()}"
    assert len(packed) < LEARNED_STATE_PACKED_LIMIT
    with pytest.raises(ValueError, match="unpacks past"):
        unpack_learned_state(packed)


def test_learned_state_is_bounded_in_the_status() -> None:
    with pytest.raises(ValidationError):
        CacheScalingPolicyStatus(learnedState="v1:" + "A" * LEARNED_STATE_PACKED_LIMIT)
