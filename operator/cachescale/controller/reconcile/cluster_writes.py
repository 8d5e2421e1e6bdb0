"""What an evaluation writes to the cluster: the decision applied to the target, the
policy's status, and its Events.

Each write tolerates the API failing, so no write stops the evaluation or the loop: a
failure while acting comes back as text (the evaluation reports it as ``ApiConflict``),
a status PATCH that fails is logged and written again at the next evaluation, and an
Event that cannot be posted is logged. What is applied is ``target/actions.py``'s, when a
status is worth writing is ``status_writes.py``'s, which condition transitions post an
Event is ``condition_events.py``'s, and how Events are kept from flooding is
``events.py``'s; ``evaluation.py`` calls these once it has decided, or stopped at a
problem.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from cachescale.api.reasons import cleared
from cachescale.api.spec import CacheScalingPolicySpec, Mode
from cachescale.api.status import Condition
from cachescale.controller.kube.client import ConflictError, KubeError
from cachescale.controller.reconcile.condition_events import Episode, condition_events
from cachescale.controller.reconcile.status import Rendered
from cachescale.controller.target.actions import (
    PatchForbiddenError,
    apply_envelope,
    apply_max_num_seqs,
)
from cachescale.controller.target.workload import Target, TargetError
from cachescale.decide import Decision, LearnedState

if TYPE_CHECKING:
    from cachescale.controller.reconcile.context import Operator, PolicyObject

log = logging.getLogger("cachescale.operator")


def act(
    operator: Operator,
    policy: PolicyObject,
    spec: CacheScalingPolicySpec,
    target: Target,
    decision: Decision,
    now: datetime,
) -> tuple[bool, str]:
    """Apply the decision in Enforce mode; (anything changed, problem text). A patch the
    operator may not make says how it is granted, and what to do meanwhile."""
    if spec.mode is not Mode.ENFORCE:
        return False, ""
    owner = f"{policy.namespace}/{policy.name}"
    applied = False
    try:
        applied = apply_envelope(
            operator.api, policy.namespace, spec.target, decision.envelope, owner, target.autoscaler
        )
        wanted = decision.max_num_seqs
        if wanted is not None and wanted != target.state.max_num_seqs:
            applied = (
                apply_max_num_seqs(operator.api, policy.namespace, spec.target, wanted, now)
                or applied
            )
    except PatchForbiddenError as error:
        return applied, f"could not apply {decision.reason}: {error}; until then use mode: Advise"
    except (ConflictError, KubeError, TargetError) as error:
        return applied, f"could not apply {decision.reason}: {error}"
    return applied, ""


def write_status(
    operator: Operator, policy: PolicyObject, rendered: Rendered, now: datetime
) -> None:
    """PATCH the status when it changed or is due for a refresh (``status_writes``). A
    failed write forgets the last one: what the API server holds is then unknown, so the
    next evaluation writes whatever it finds (after an API outage, at once)."""
    writes = operator.status_writes
    status, learned = rendered.wire, rendered.learned
    why = writes.due(policy.uid, status, policy.status, now, learned)
    if why is None:
        writes.skipped(policy.uid, status)
        return
    log.debug("status of %s/%s written: %s", policy.namespace, policy.name, why)
    try:
        # Replace the whole status: a merge patch would keep a signal that became unknown.
        operator.api.patch(policy.status_path, [{"op": "add", "path": "/status", "value": status}])
    except KubeError as error:
        log.warning("status of %s/%s not written: %s", policy.namespace, policy.name, error)
        writes.failed(policy.uid)
        return
    writes.wrote(policy.uid, status, now, learned)


def announce(
    operator: Operator, policy: PolicyObject, decision: Decision, applied: bool, now: datetime
) -> None:
    """The decision's Events: each alert raised (Warning) or cleared, and the change applied."""
    for change in decision.raised:
        event(operator, policy, "Warning", change.reason, change.message, now)
    for change in decision.cleared:
        event(operator, policy, "Normal", cleared(change.reason), change.message, now)
    if applied:
        event(operator, policy, "Normal", decision.reason, decision.message, now)


def announce_conditions(
    operator: Operator,
    policy: PolicyObject,
    before: Sequence[Condition],
    after: Sequence[Condition],
    episode: Episode,
    now: datetime,
) -> None:
    """The Events of the conditions that turned bad or recovered between ``before`` (the
    previous status's) and ``after`` (the status's just rendered)."""
    for posted in condition_events(before, after, episode, now):
        event(operator, policy, posted.kind, posted.reason, posted.message, now)


def episode(spec: CacheScalingPolicySpec, memory: LearnedState, decision: Decision) -> Episode:
    """What the condition rules need from an evaluation that started from ``memory``."""
    return Episode(
        windows=spec.cache.collapse_windows,
        streaks_before=memory.streaks,
        streaks_after=decision.memory.streaks,
        alerts=frozenset(a.reason for a in memory.alerts)
        | frozenset(c.reason for c in decision.raised),
    )


def event(
    operator: Operator, policy: PolicyObject, kind: str, reason: str, message: str, now: datetime
) -> None:
    """Post one Event about the policy (``events.py`` drops a repeat); a failure is logged."""
    assert operator.events is not None
    try:
        operator.events.record(policy.ref, kind, reason, message, now)
    except KubeError as error:
        log.warning(
            "event %s for %s/%s not posted: %s", reason, policy.namespace, policy.name, error
        )
