"""One policy's evaluation: gather → decide → act, and what it leaves behind.

Everything here is one function of the policy object and the world, so a kopf daemon,
a test and the benchmark run the same code. Any failure ends in a status a human can
read and at most one Event — an invalid spec (``InvalidSpec``), a missing or foreign
target (``TargetNotFound``, ``TargetMismatch``, ``HPAManagedByKEDA``), a target another
policy holds or the operator itself (``TargetClaimed``, ``TargetIsOperator``), a Prometheus that
cannot be read (the decision then freezes: ``MetricsUnavailable``), a Prometheus URL or a
credentials Secret the operator may not use (``MetricsURLNotAllowed``,
``CredentialsNotAllowed``: refused before anything is fetched or sent, by
``prometheus_access.py``; see ``docs/security.md``), an API conflict while acting
(``ApiConflict``) — and never in an exception that would stop the loop of this or any
other policy. A suspected or raised collapse also names what changed before it
(``changes.py``), after the decision.

An evaluation has three phases: ``prepare`` (the spec, a refusal, the target, which
Prometheus and what to read), the read, and ``finish`` (decide, act, correlate, status,
Events, metrics). ``evaluate`` runs them for one policy with its own queries;
``evaluate_many`` runs them for the policies the scheduler found due together
(``scheduler.py``), with one grouped read for all of them (``gather/grouped.py``), so
the Prometheus queries grow with the groups, not the policies. A policy's outcome is the
same either way (``tests/controller/test_controller_batch.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from threading import Lock
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from cachescale.api.policy import (
    ACKNOWLEDGE,
    GROUP,
    PLURAL,
    REBASELINE,
    VERSION,
)
from cachescale.api.reasons import Action, ConditionReason, Problem, cleared
from cachescale.api.spec import CacheScalingPolicySpec, Mode
from cachescale.api.status import CacheScalingPolicyStatus, ConditionType
from cachescale.controller.actions import apply_envelope, apply_max_num_seqs
from cachescale.controller.changes import correlate
from cachescale.controller.claims import Refusal
from cachescale.controller.events import EventRecorder, PolicyRef
from cachescale.controller.keda import notes as keda_notes
from cachescale.controller.kube import ConflictError, KubeApi, KubeError, Reads
from cachescale.controller.metrics import OperatorMetrics
from cachescale.controller.prometheus_access import (
    EgressRefused,
    PrometheusCredentialsError,
    prometheus_config,
    prometheus_source,
)
from cachescale.controller.read_failures import ReadFailures
from cachescale.controller.status import render, render_problem
from cachescale.controller.status_writes import StatusWrites
from cachescale.controller.workload import Target, TargetError, read_target
from cachescale.decide import Decision, Memory, decide
from cachescale.decide.engine import read_retried
from cachescale.gather.egress import AllowedUrls
from cachescale.gather.grouped import GroupedGatherer, PolicyRead
from cachescale.gather.grouped import Outcome as GroupedOutcome
from cachescale.gather.prometheus import (
    PrometheusClient,
    PrometheusConfig,
    PrometheusError,
)
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import Selector, SelectorError
from cachescale.gather.signals import AmbiguousSeriesError, SignalRequest
from cachescale.snapshot import EngineSignals, FetchFailure, HumanRequests, Snapshot

log = logging.getLogger("cachescale.operator")

_T = TypeVar("_T")
_U = TypeVar("_U")


class FanOut(Protocol):
    """How ``evaluate_many`` runs one step over every policy: ``map``, or a pool's ``map``."""

    def __call__(self, fn: Callable[[_T], _U], items: Iterable[_T], /) -> Iterator[_U]:
        """``fn`` of every item, in order."""
        ...


@dataclass(frozen=True)
class PolicyObject:
    """The policy as the watch delivered it."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    annotations: Mapping[str, str]
    status: Mapping[str, Any] | None
    """The body's own status object, not a copy: ``status_writes`` keeps it as the last
    written status once it is equal to that (one copy per policy, not two), and knows it
    unchanged by identity."""

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> PolicyObject:
        """From a raw object (kopf's body or an API read)."""
        meta = body.get("metadata", {})
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0) or 0),
            spec=dict(body.get("spec", {})),
            annotations=dict(meta.get("annotations", {}) or {}),
            status=body["status"] if body.get("status") else None,
        )

    @property
    def ref(self) -> PolicyRef:
        """For events."""
        return PolicyRef(self.namespace, self.name, self.uid)

    @property
    def status_path(self) -> str:
        """Its status subresource."""
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}/status"


@dataclass
class Operator:
    """What every evaluation shares: the API, Prometheus clients, events, metrics."""

    api: KubeApi
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    events: EventRecorder | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now().astimezone())
    allowed_urls: AllowedUrls | None = None
    """``--allowed-prometheus-url``: where policies may make it connect (None: anywhere)."""
    default_prometheus_url: str | None = None
    """``--default-prometheus-url``: read when a policy gives no ``prometheusUrl``. The
    cluster owner chose it, so the allow list does not apply to it."""
    # The parts of an evaluation that may be replaced from outside (the tests count
    # queries and slow decisions down through them); the defaults are the real ones.
    new_client: Callable[[PrometheusConfig], PrometheusClient] = PrometheusClient
    """Makes the client for one Prometheus endpoint."""
    status_writes: StatusWrites = field(default_factory=StatusWrites)
    """The last status written per policy: a status PATCH only when something changed
    (``controller/status_writes.py``)."""
    read_failures: ReadFailures = field(default_factory=ReadFailures)
    """Failed reads in a row per policy: the first is retried, not frozen on
    (``controller/read_failures.py``)."""
    read_signals: Callable[[PrometheusClient, SignalRequest, datetime], EngineSignals] = field(
        default=gather_signals
    )
    """Reads one policy's signals (``gather.reading.gather_signals``)."""
    gatherer: GroupedGatherer = field(default_factory=GroupedGatherer)
    """Reads a batch's signals, one query set per group (``gather/grouped.py``); it keeps
    the detected profiles, so it lives as long as the operator."""
    make_decision: Callable[[CacheScalingPolicySpec, Snapshot, Memory, datetime], Decision] = field(
        default=decide
    )
    """Decides (``decide.decide``); pure, so wrapping it cannot change what it returns."""
    indexed_reads: Reads | None = None
    """Where targets and credential Secrets are read: the running operator's watch-fed
    indexes (``controller/indexes.py``); None: ``api``, directly. Writes go to ``api``."""
    _clients: dict[str, PrometheusClient] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)
    _reported: set[tuple[str, ...]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.events is None:
            self.events = EventRecorder(self.api)

    @property
    def reads(self) -> Reads:
        """``indexed_reads``, else the API server."""
        return self.api if self.indexed_reads is None else self.indexed_reads

    def prometheus(self, config: PrometheusConfig) -> PrometheusClient:
        """One client per distinct Prometheus endpoint and credentials, shared by the
        policies that read it (connections are pooled per client)."""
        key = hashlib.sha256(
            json.dumps(
                [config.url, config.bearer_token, config.ca_file, config.verify_tls]
            ).encode()
        ).hexdigest()
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self.new_client(config)
            return self._clients[key]

    def first_report(self, *key: str) -> bool:
        """True the first time ``key`` is reported (a warning worth one log line, not one
        per evaluation)."""
        with self._lock:
            if key in self._reported:
                return False
            self._reported.add(key)
            return True


@dataclass(frozen=True)
class Outcome:
    """What one evaluation did (for logs, tests and the benchmark)."""

    reason: Action | Problem
    decision: Decision | None = None
    applied: bool = False


def evaluate(operator: Operator, policy: PolicyObject, refusal: Refusal | None = None) -> Outcome:
    """One full evaluation of ``policy`` (blocking; run it in a worker thread). With a
    ``refusal`` (``controller/claims.py``) a valid policy only reports it."""
    started = time.monotonic()
    now = operator.clock()
    try:
        step = prepare(operator, policy, now, refusal)
        if isinstance(step, Outcome):
            return step
        return finish(operator, step, _read_alone(operator, step))
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
    _log_read_failures(read)

    def last(index: int) -> Outcome | Exception:
        policy, step = policies[index][0], steps[index]
        if isinstance(step, Prepared):
            done = _guarded(lambda: finish(operator, step, _signals_of(step, read.get(index))))
        else:
            done = step
        operator.metrics.evaluated(
            policy.namespace, policy.name, time.monotonic() - started, now.timestamp()
        )
        return done

    return list(fan_out(last, range(len(steps))))


def _log_read_failures(read: Mapping[int, GroupedOutcome | Exception]) -> None:
    """One warning per distinct failure of a batch's reads, with how many policies it
    failed: each policy's status says it too, but a group failing at once (a Prometheus
    down, a batch past its deadline) is one event to whoever reads the operator's log."""
    failures = Counter(str(outcome) for outcome in read.values() if isinstance(outcome, Exception))
    for message, count in failures.items():
        log.warning("signals of %d policies could not be read: %s", count, message)


def _guarded(step: Callable[[], _T]) -> _T | Exception:
    """``step()``, or the exception it raised (one policy's bug is that policy's only)."""
    try:
        return step()
    except Exception as error:
        return error


@dataclass(frozen=True)
class Prepared:
    """A policy past its checks, waiting for its signals: either a read to make (its
    Prometheus client and request) or signals already known to be unknown (credentials
    unreadable, a malformed selector)."""

    policy: PolicyObject
    previous: CacheScalingPolicyStatus
    spec: CacheScalingPolicySpec
    target: Target
    now: datetime
    read: tuple[PrometheusClient, SignalRequest] | None
    known: EngineSignals | None = None


def prepare(
    operator: Operator, policy: PolicyObject, now: datetime, refusal: Refusal | None
) -> Outcome | Prepared:
    """Everything before the signals: the spec, a refusal, the target, where and how to
    read Prometheus. An ``Outcome`` when the evaluation ends here (its status written)."""
    previous = _previous_status(policy, operator.status_writes.latest(policy.uid, policy.status))
    try:
        spec = CacheScalingPolicySpec.model_validate(policy.spec)
    except ValidationError as error:
        message = _summary(error)
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
        read = _read(operator, policy, spec, target)
    except EgressRefused as error:
        also = (ConditionType.METRICS_AVAILABLE,)
        return _problem(operator, policy, previous, error.reason, error.message, now, also)
    except (PrometheusError, PrometheusCredentialsError, SelectorError) as error:
        known = _unknown(error, now, spec.metrics.window_seconds)
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
    memory = _memory(policy, previous.memory, target)
    if signals.failure is not None:
        operator.metrics.failed(policy.namespace, policy.name, signals.failure.value)
    if read_retried(signals, operator.read_failures.counted(policy.uid, signals), memory):
        return Outcome(Action.READ_RETRIED)
    snapshot = Snapshot(signals, target.state, _human(operator, policy))
    decision = operator.make_decision(spec, snapshot, memory, now)
    applied, act_error = _act(operator, policy, spec, target, decision, now)
    if act_error and decision.max_num_seqs != target.state.max_num_seqs:
        # The ceiling change did not happen: its cooldown must not start either.
        kept = memory.last_max_num_seqs_change_at
        unapplied = decision.memory.model_copy(update={"last_max_num_seqs_change_at": kept})
        decision = replace(decision, memory=unapplied)
    # After acting, so its list calls never delay what was decided; only the words change.
    decision, suspected = correlate(
        operator.api, spec, policy.namespace, previous.suspected_change, decision, now
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
    _write_status(operator, policy, status, now)
    _announce(operator, policy, decision, applied, now)
    for warning in target.keda.warnings() if target.keda is not None else ():
        _event(operator, policy, "Warning", ConditionReason.KEDA_IGNORES_NULL_VALUES, warning, now)
    operator.metrics.observe(policy.namespace, policy.name, spec, snapshot, decision)
    if act_error:
        operator.metrics.failed(policy.namespace, policy.name, Problem.API_CONFLICT)
        _event(operator, policy, "Warning", Problem.API_CONFLICT, act_error, now)
    return Outcome(decision.reason, decision, applied)


def _keda_status(target: Target) -> dict[str, Any]:
    """What a ScaledObject target adds to the status: its traps and notes in the ``Ready``
    message, and KEDA's Fallback condition folded into ``MetricsAvailable``."""
    keda = target.keda
    if keda is None:
        return {}
    fallback = None
    if keda.fallback_active:
        fallback = (
            f"KEDA's Fallback condition is True on ScaledObject {keda.name}: its scaler cannot "
            "read its metrics, so KEDA runs spec.fallback's replicas instead of scaling on them"
        )
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
    _write_status(operator, policy, status, now)
    _event(operator, policy, "Warning", reason, message, now)
    operator.metrics.failed(policy.namespace, policy.name, reason)
    return Outcome(reason)


def _read(
    operator: Operator, policy: PolicyObject, spec: CacheScalingPolicySpec, target: Target
) -> tuple[PrometheusClient, SignalRequest]:
    """Which Prometheus to read, and what: ``EgressRefused`` when the operator may not
    use it; a ``PrometheusError``, ``PrometheusCredentialsError`` or ``SelectorError``
    when it cannot."""
    config = prometheus_config(operator, policy.namespace, spec)
    request = SignalRequest(
        engine=spec.target.engine,
        selector=Selector.of(spec.metrics.selector_in(policy.namespace)),
        window_seconds=spec.metrics.window_seconds,
        gpus_per_pod=target.state.gpus_per_pod or None,
        ready_replicas=target.state.ready_replicas,
        pod_ages_seconds=target.pod_ages,
        demand_query=spec.metrics.demand_query,
    )
    return operator.prometheus(config), request


def _read_alone(operator: Operator, step: Prepared) -> EngineSignals:
    """One policy's signals through ``Operator.read_signals`` (its own queries)."""
    if step.read is None:
        assert step.known is not None
        return step.known
    try:
        return operator.read_signals(*step.read, step.now)
    except (PrometheusError, AmbiguousSeriesError, SelectorError) as error:
        return _unknown(error, step.now, step.spec.metrics.window_seconds)


def _signals_of(step: Prepared, read: GroupedOutcome | Exception | None) -> EngineSignals:
    """One policy's signals out of a batch's grouped ``read`` (an exception that is not a
    read failure is a bug: raised, as ``_read_alone`` would raise it)."""
    if step.read is None:
        assert step.known is not None
        return step.known
    assert read is not None
    if isinstance(read, EngineSignals):
        return read
    if isinstance(read, PrometheusError | AmbiguousSeriesError | SelectorError):
        return _unknown(read, step.now, step.spec.metrics.window_seconds)
    raise read


def _unknown(error: Exception, now: datetime, window: float) -> EngineSignals:
    """Every signal unknown, for the reason ``error`` gives."""
    if isinstance(error, PrometheusError):
        failure = error.failure
    elif isinstance(error, PrometheusCredentialsError):
        failure = FetchFailure.CREDENTIALS_UNREADABLE
    else:
        failure = FetchFailure.QUERY_ERROR
    return EngineSignals.all_unknown(
        str(error), observed_at=now, window_seconds=window, failure=failure
    )


def _summary(error: ValidationError) -> str:
    """Each validation problem as ``field.path: message``."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())


def _previous_status(
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
            _summary(error),
        )
        return CacheScalingPolicyStatus()


def _memory(policy: PolicyObject, stored: Mapping[str, Any] | None, target: Target) -> Memory:
    """The memory from status, with the Deployment's own record of the last ceiling
    change folded in (survives a status write that never happened). A stored memory that
    fails validation (edited by hand, or written by an incompatible version) is reset,
    and the warning says so: the learned baseline is gone and relearning starts."""
    try:
        memory = Memory.model_validate(stored or {})
    except ValidationError as error:
        log.warning(
            "%s/%s: status.memory is invalid, so it is reset and the baseline is relearned "
            "(streaks, alerts and cooldowns start over too): %s",
            policy.namespace,
            policy.name,
            _summary(error),
        )
        memory = Memory()
    changed = target.max_num_seqs_changed_at
    last = memory.last_max_num_seqs_change_at
    if changed is not None and (last is None or changed > last):
        memory = memory.model_copy(update={"last_max_num_seqs_change_at": changed})
    return memory


def _human(operator: Operator, policy: PolicyObject) -> HumanRequests:
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


def _act(
    operator: Operator,
    policy: PolicyObject,
    spec: CacheScalingPolicySpec,
    target: Target,
    decision: Decision,
    now: datetime,
) -> tuple[bool, str]:
    """Apply the decision in Enforce mode; (anything changed, problem text)."""
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
    except (ConflictError, KubeError, TargetError) as error:
        return applied, f"could not apply {decision.reason}: {error}"
    return applied, ""


def _write_status(
    operator: Operator, policy: PolicyObject, status: Mapping[str, Any], now: datetime
) -> None:
    """PATCH the status when it changed or is due for a refresh (``status_writes``). A
    failed write forgets the last one: what the API server holds is then unknown, so the
    next evaluation writes whatever it finds (after an API outage, at once)."""
    writes = operator.status_writes
    why = writes.due(policy.uid, status, policy.status, now)
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
    writes.wrote(policy.uid, status, now)


def _announce(
    operator: Operator, policy: PolicyObject, decision: Decision, applied: bool, now: datetime
) -> None:
    for change in decision.raised:
        _event(operator, policy, "Warning", change.reason, change.message, now)
    for change in decision.cleared:
        _event(operator, policy, "Normal", cleared(change.reason), change.message, now)
    if applied:
        _event(operator, policy, "Normal", decision.reason, decision.message, now)


def _event(
    operator: Operator, policy: PolicyObject, kind: str, reason: str, message: str, now: datetime
) -> None:
    assert operator.events is not None
    try:
        operator.events.record(policy.ref, kind, reason, message, now)
    except KubeError as error:
        log.warning(
            "event %s for %s/%s not posted: %s", reason, policy.namespace, policy.name, error
        )
