"""One policy's evaluation: gather → decide → act, and what it leaves behind.

Everything here is one function of the policy object and the world, so a kopf daemon,
a test and the benchmark run the same code. Any failure ends in a status a human can
read and at most one Event — an invalid spec (``InvalidSpec``), a missing or foreign
target (``TargetNotFound``, ``TargetMismatch``, ``HPAManagedByKEDA``), a target another
policy holds or the operator itself (``TargetClaimed``, ``TargetIsOperator``), a Prometheus that
cannot be read (the decision then freezes: ``MetricsUnavailable``), a Prometheus URL or a
credentials Secret the operator may not use (``MetricsURLNotAllowed``,
``InsecureTLSNotAllowed``, ``CredentialsNotAllowed``: refused before anything is fetched or sent, by
``prometheus_access.py``; see ``docs/security.md``), an API conflict while acting
(``ApiConflict``) — and never in an exception that would stop the loop of this or any
other policy. A suspected or raised collapse also names what changed before it
(``target/changes.py``), after the decision.

An evaluation has three phases: ``prepare`` (the spec, a refusal, the target, which
Prometheus and what to read), the read, and ``finish`` (decide, act, correlate, status,
Events — the decision's, and a Warning or a Normal for each condition that turned bad or
recovered — metrics). This module runs them; what a policy brings from the cluster (its
previous status, memory and annotations) is ``recall.py``, the read ``signal_reads.py``,
and what an evaluation writes (the decision applied, the status, Events)
``cluster_writes.py``. ``evaluate`` runs the phases for one policy with its own queries;
``evaluate_many`` runs them for the policies the scheduler found due together
(``scheduler.py``), with one grouped read for all of them (``gather/grouped.py``), so
the Prometheus queries grow with the groups, not the policies. A policy's outcome is the
same either way (``tests/controller/test_controller_batch.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from cachescale.api.reasons import Action, ConditionReason, Problem
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.status import ConditionType
from cachescale.controller.kube.client import KubeError
from cachescale.controller.reconcile import recall, signal_reads
from cachescale.controller.reconcile.cluster_writes import (
    act,
    announce,
    announce_conditions,
    episode,
    event,
    write_status,
)
from cachescale.controller.reconcile.context import FanOut, Operator, PolicyObject, Prepared
from cachescale.controller.reconcile.prometheus_access import (
    EgressRefused,
    PrometheusCredentialsError,
    prometheus_source,
)
from cachescale.controller.reconcile.status import render, render_problem
from cachescale.controller.target.changes import correlate
from cachescale.controller.target.claims import Refusal
from cachescale.controller.target.keda import notes as keda_notes
from cachescale.controller.target.workload import Target, TargetError, read_target
from cachescale.decide import Decision
from cachescale.decide.engine import read_retried
from cachescale.gather.grouped import Outcome as GroupedOutcome
from cachescale.gather.grouped import PolicyRead
from cachescale.gather.prometheus_errors import PrometheusError
from cachescale.gather.selector import SelectorError
from cachescale.snapshot import EngineSignals, Snapshot

_T = TypeVar("_T")
_U = TypeVar("_U")


@dataclass(frozen=True)
class Outcome:
    """What one evaluation did (for logs, tests and the benchmark)."""

    reason: Action | Problem
    decision: Decision | None = None
    applied: bool = False


def evaluate(operator: Operator, policy: PolicyObject, refusal: Refusal | None = None) -> Outcome:
    """One full evaluation of ``policy`` (blocking; run it in a worker thread). With a
    ``refusal`` (``controller/target/claims.py``) a valid policy only reports it."""
    started = time.monotonic()
    now = operator.clock()
    try:
        step = prepare(operator, policy, now, refusal)
        if isinstance(step, Outcome):
            return step
        return finish(operator, step, signal_reads.read_alone(operator, step))
    finally:
        operator.metrics.evaluated(
            policy.namespace, policy.name, time.monotonic() - started, now.timestamp()
        )


def evaluate_many(
    operator: Operator,
    policies: Sequence[tuple[PolicyObject, Refusal | None]],
    fan_out: FanOut = map,
) -> list[Outcome | Exception]:
    """Evaluate ``policies`` as one batch: each is prepared and finished on its own (through
    ``fan_out``, e.g. a thread pool's ``map``), and their signals are read together, one
    grouped query set per Prometheus, window and label names (``gather/grouped.py``). Each
    outcome is the one ``evaluate`` would return at the same time; a policy whose
    evaluation raised gets its exception, and the others go on."""
    started = time.monotonic()
    now = operator.clock()

    def first(item: tuple[PolicyObject, Refusal | None]) -> Outcome | Prepared | Exception:
        return _guarded(lambda: prepare(operator, item[0], now, item[1]))

    steps = list(fan_out(first, policies))
    reads = [
        PolicyRead(index, *step.read)
        for index, step in enumerate(steps)
        if isinstance(step, Prepared) and step.read is not None
    ]
    read: Mapping[int, GroupedOutcome | Exception]
    try:
        read = operator.gatherer.gather(reads, now)
    except Exception as error:  # a bug in the gatherer fails the batch's reads, not the rest
        read = {r.key: error for r in reads}
    signal_reads.log_read_failures(read)

    def last(index: int) -> Outcome | Exception:
        policy, step = policies[index][0], steps[index]
        if isinstance(step, Prepared):
            done = _guarded(
                lambda: finish(operator, step, signal_reads.signals_of(step, read.get(index)))
            )
        else:
            done = step
        operator.metrics.evaluated(
            policy.namespace, policy.name, time.monotonic() - started, now.timestamp()
        )
        return done

    return list(fan_out(last, range(len(steps))))


def _guarded(step: Callable[[], _T]) -> _T | Exception:
    """``step()``, or the exception it raised (one policy's bug is that policy's only)."""
    try:
        return step()
    except Exception as error:
        return error


def prepare(
    operator: Operator, policy: PolicyObject, now: datetime, refusal: Refusal | None
) -> Outcome | Prepared:
    """Everything before the signals: the spec, a refusal, the target, where and how to
    read Prometheus. An ``Outcome`` when the evaluation ends here (its status written)."""
    previous = recall.previous_status(
        policy, operator.status_writes.latest(policy.uid, policy.status)
    )
    try:
        spec = CacheScalingPolicySpec.model_validate(policy.spec)
    except ValidationError as error:
        message = recall.summary(error)
        return _problem(
            operator, policy, previous, Problem.INVALID_SPEC, f"invalid spec: {message}", now
        )
    if refusal is not None:
        return _problem(operator, policy, previous, refusal.reason, refusal.message, now)
    try:
        target = read_target(operator.reads, policy.namespace, spec.target, now)
    except TargetError as error:
        return _problem(operator, policy, previous, error.reason, error.message, now)
    except KubeError as error:
        return _problem(
            operator, policy, previous, Problem.API_ERROR, f"reading the target: {error}", now
        )
    try:
        read = signal_reads.read(operator, policy, spec, target)
    except EgressRefused as error:
        also = (ConditionType.METRICS_AVAILABLE,)
        return _problem(operator, policy, previous, error.reason, error.message, now, also)
    except (PrometheusError, PrometheusCredentialsError, SelectorError) as error:
        known = signal_reads.unknown(error, now, spec.metrics.window_seconds)
        return Prepared(policy, previous, spec, target, now, None, known)
    return Prepared(policy, previous, spec, target, now, read)


def finish(operator: Operator, step: Prepared, signals: EngineSignals) -> Outcome:
    """Everything after the signals: decide, act, correlate, write the status, announce;
    or, on a first failed read, nothing (``read_retried``)."""
    policy, previous, spec, target, now = (
        step.policy,
        step.previous,
        step.spec,
        step.target,
        step.now,
    )
    memory = recall.memory(operator, policy, previous, target)
    if signals.failure is not None:
        operator.metrics.failed(policy.namespace, policy.name, signals.failure.value)
    if read_retried(signals, operator.read_failures.counted(policy.uid, signals), memory):
        return Outcome(Action.READ_RETRIED)
    snapshot = Snapshot(signals, target.state, recall.human(operator, policy))
    decision = operator.make_decision(spec, snapshot, memory, now)
    applied, act_error = act(operator, policy, spec, target, decision, now)
    if act_error and decision.max_num_seqs != target.state.max_num_seqs:
        # The ceiling change did not happen: its cooldown must not start either.
        kept = {
            "last_max_num_seqs_change_at": memory.last_max_num_seqs_change_at,
            "last_max_num_seqs_step": memory.last_max_num_seqs_step,
        }
        unapplied = decision.memory.model_copy(update=kept)
        decision = replace(decision, memory=unapplied)
    # After acting, so its list calls never delay what was decided; only the words change.
    decision, suspected = correlate(
        operator.api,
        spec,
        policy.namespace,
        previous.suspected_change,
        decision,
        now,
        operator.prompt_source_namespaces,
        operator.correlate_configmaps,
    )
    status = render(
        previous,
        decision,
        snapshot,
        generation=policy.generation,
        now=now,
        applied=applied,
        warmup_seconds=float(spec.cache.pod_warmup_seconds),
        prometheus=prometheus_source(operator, spec),
        suspected_change=suspected,
        **_keda_status(target),
    )
    write_status(operator, policy, status, now)
    announce(operator, policy, decision, applied, now)
    announce_conditions(
        operator,
        policy,
        previous.conditions,
        status.conditions,
        episode(spec, memory, decision),
        now,
    )
    for warning in target.keda.warnings() if target.keda is not None else ():
        event(operator, policy, "Warning", ConditionReason.KEDA_IGNORES_NULL_VALUES, warning, now)
    operator.metrics.observe(policy.namespace, policy.name, spec, snapshot, decision)
    if act_error:
        operator.metrics.failed(policy.namespace, policy.name, Problem.API_CONFLICT)
        event(operator, policy, "Warning", Problem.API_CONFLICT, act_error, now)
    return Outcome(decision.reason, decision, applied)


def _keda_status(target: Target) -> dict[str, Any]:
    """What a ScaledObject target adds to the status: its traps and notes in the ``Ready``
    message, and KEDA's Fallback condition folded into ``MetricsAvailable``."""
    keda = target.keda
    if keda is None:
        return {}
    fallback = keda.fallback_message() if keda.fallback_active else None
    return {
        "autoscaler_notes": (*keda.warnings(), *keda_notes(keda)),
        "autoscaler_fallback": fallback,
    }


def _problem(
    operator: Operator,
    policy: PolicyObject,
    previous: Any,
    reason: Problem,
    message: str,
    now: datetime,
    also: tuple[ConditionType, ...] = (),
) -> Outcome:
    status = render_problem(
        previous, reason, message, generation=policy.generation, now=now, also=also
    )
    write_status(operator, policy, status, now)
    event(operator, policy, "Warning", reason, message, now)
    operator.metrics.failed(policy.namespace, policy.name, reason)
    return Outcome(reason)
