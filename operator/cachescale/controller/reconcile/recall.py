"""What a policy brings to its evaluation from the cluster: its previous status, its
decision memory, and the requests a human left in its annotations.

Each is read as stored, and none can stop an evaluation: a stored status or memory that
fails validation (edited by hand, written by another version) starts over with a
warning that says what is lost, and an annotation that is not a time is ignored, not
guessed. ``evaluation.py`` reads them here before it decides.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from cachescale.api.policy import ACKNOWLEDGE, REBASELINE
from cachescale.api.status import CacheScalingPolicyStatus
from cachescale.controller.target.workload import Target
from cachescale.decide import LearnedState
from cachescale.snapshot import HumanRequests

if TYPE_CHECKING:
    from cachescale.controller.reconcile.context import Operator, PolicyObject

log = logging.getLogger("cachescale.operator")


def summary(error: ValidationError) -> str:
    """Each validation problem as ``field.path: message``."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())


def previous_status(
    policy: PolicyObject, unwritten: Mapping[str, Any] | None
) -> CacheScalingPolicyStatus:
    """The last status rendered when this process kept it (``unwritten``: a write was
    skipped since the stored one, ``status_writes.StatusWrites.latest``), else the stored
    status, or an empty one if absent or unreadable (written by an older version, edited
    by hand): the next write replaces it, and the warning says that the memory inside it
    (baseline, alerts, cooldowns) is lost with it."""
    try:
        return CacheScalingPolicyStatus.model_validate(unwritten or policy.status or {})
    except ValidationError as error:
        log.warning(
            "%s/%s: the stored status is invalid, so it is replaced and the baseline is "
            "relearned (streaks, alerts and cooldowns start over too): %s",
            policy.namespace,
            policy.name,
            summary(error),
        )
        return CacheScalingPolicyStatus()


def memory(
    operator: Operator, policy: PolicyObject, previous: CacheScalingPolicyStatus, target: Target
) -> LearnedState:
    """The memory from the previous status (``learnedState``, or the structured ``memory``
    an older version wrote), with the Deployment's own record of the last ceiling change
    folded in (survives a status write that never happened). A stored memory that cannot
    be unpacked or fails validation (edited by hand, or written by an incompatible
    version) is reset, and the warning says so: the learned baseline is gone and
    relearning starts. A status with a decision and no memory at all lost it to the API
    server (a CRD older than the operator prunes ``learnedState``): warned once."""
    absent = previous.learned_state is None and previous.memory is None
    if absent and previous.last_decision is not None:
        _memory_dropped(operator, policy)
    try:
        memory = LearnedState.model_validate(previous.learned() or {})
    except ValueError as error:  # pydantic's ValidationError is one too
        log.warning(
            "%s/%s: status.%s is invalid, so it is reset and the baseline is relearned "
            "(streaks, alerts and cooldowns start over too): %s",
            policy.namespace,
            policy.name,
            "memory" if previous.learned_state is None else "learnedState",
            summary(error) if isinstance(error, ValidationError) else error,
        )
        memory = LearnedState()
    changed = target.max_num_seqs_changed_at
    last = memory.last_max_num_seqs_change_at
    if changed is not None and (last is None or changed > last):
        memory = memory.model_copy(update={"last_max_num_seqs_change_at": changed})
    return memory


def _memory_dropped(operator: Operator, policy: PolicyObject) -> None:
    """Warn, once per policy, that the stored status holds a decision but no memory."""
    if operator.first_report(policy.uid, "learnedState"):
        log.warning(
            "%s/%s: the stored status has a decision but no status.learnedState: the API "
            "server dropped it, so its CacheScalingPolicy CRD is older than this operator; "
            "apply crds/ (helm upgrade does), or the baseline is relearned at every evaluation",
            policy.namespace,
            policy.name,
        )


def human(operator: Operator, policy: PolicyObject) -> HumanRequests:
    """The acknowledge and rebaseline requests in the policy's annotations, with their times."""
    return HumanRequests(
        acknowledge_at=_annotation_time(operator, policy, ACKNOWLEDGE),
        rebaseline_at=_annotation_time(operator, policy, REBASELINE),
    )


def _annotation_time(operator: Operator, policy: PolicyObject, key: str) -> datetime | None:
    """The RFC 3339 time in annotation ``key``; None when absent or unparsable (a warning
    is logged once per policy and value: the request is ignored, not guessed)."""
    text = policy.annotations.get(key)
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        if operator.first_report(policy.uid, key, text):
            log.warning(
                "%s/%s: annotation %s=%r is not an RFC 3339 time; the request is ignored",
                policy.namespace,
                policy.name,
                key,
                text,
            )
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # no zone: UTC
