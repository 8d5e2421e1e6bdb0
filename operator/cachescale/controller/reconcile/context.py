"""What every evaluation shares and what passes between its phases: the ``Operator``
(the API, Prometheus clients, Events, metrics and the cluster owner's settings), the
``PolicyObject`` as the watch delivered it, and a ``Prepared`` policy waiting for its
signals.

The phases (``evaluation``, ``recall``, ``signal_reads``, ``cluster_writes``,
``prometheus_access``) all take these as arguments; none of them imports another phase
to learn their shape, so the reconcile loop has no import circle.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from threading import Lock
from typing import Any, Protocol, TypeVar

from cachescale.api.policy import GROUP, PLURAL, VERSION
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.status import CacheScalingPolicyStatus
from cachescale.controller.kube.client import KubeApi, Reads
from cachescale.controller.reconcile.events import EventRecorder, PolicyRef
from cachescale.controller.reconcile.metrics import OperatorMetrics
from cachescale.controller.reconcile.read_failures import ReadFailures
from cachescale.controller.reconcile.status_writes import StatusWrites
from cachescale.controller.target.workload import Target
from cachescale.decide import Decision, LearnedState, decide
from cachescale.gather.egress import AllowedUrls
from cachescale.gather.grouped import GroupedGatherer
from cachescale.gather.prometheus import MAX_RESPONSE_BYTES, PrometheusClient, PrometheusConfig
from cachescale.gather.reading import gather_signals
from cachescale.gather.signals import SignalRequest
from cachescale.snapshot import EngineSignals, Snapshot

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
    """``--allowed-prometheus-url``: where policies may make it connect (empty: nowhere
    but the default; None: anywhere, for tests only: ``cachescale run`` always sets it)."""
    allow_insecure_tls: bool = False
    """``--allow-insecure-tls``: whether a policy may ask for unverified TLS
    (``auth.insecureSkipVerify``); without it such a policy is refused."""
    allow_demand_query: bool = False
    """``--allow-demand-query``: whether a policy's ``metrics.demandQuery`` is sent (each
    selector forced to the policy's namespace, ``gather/demand_scope.py``); without it
    such a policy is refused."""
    prompt_source_namespaces: frozenset[str] = frozenset()
    """``--prompt-source-namespace``: where, besides its own namespace, a policy's
    ``promptSources`` are read (``target/changes.py``); elsewhere they are reported, not
    read."""
    correlate_configmaps: bool = False
    """``--correlate-configmaps``: whether change correlation lists ConfigMaps (metadata
    only); without it none is listed and a ConfigMap prompt source is reported, not read."""
    default_prometheus_url: str | None = None
    """``--default-prometheus-url``: read when a policy gives no ``prometheusUrl``. The
    cluster owner chose it, so the allow list does not apply to it."""
    max_response_bytes: int = MAX_RESPONSE_BYTES
    """``--prometheus-max-response-bytes``: the cap on every Prometheus answer, set on
    every client it makes (``prometheus``)."""
    # The parts of an evaluation that may be replaced from outside (the tests count
    # queries and slow decisions down through them); the defaults are the real ones.
    new_client: Callable[[PrometheusConfig], PrometheusClient] = PrometheusClient
    """Makes the client for one Prometheus endpoint."""
    status_writes: StatusWrites = field(default_factory=StatusWrites)
    """The last status written per policy: a status PATCH only when something changed
    (``controller/reconcile/status_writes.py``)."""
    read_failures: ReadFailures = field(default_factory=ReadFailures)
    """Failed reads in a row per policy: the first is retried, not frozen on
    (``controller/reconcile/read_failures.py``)."""
    read_signals: Callable[[PrometheusClient, SignalRequest, datetime], EngineSignals] = field(
        default=gather_signals
    )
    """Reads one policy's signals (``gather.reading.gather_signals``)."""
    gatherer: GroupedGatherer = field(default_factory=GroupedGatherer)
    """Reads a batch's signals, one query set per group (``gather/grouped.py``); it keeps
    the detected profiles, so it lives as long as the operator."""
    make_decision: Callable[
        [CacheScalingPolicySpec, Snapshot, LearnedState, datetime], Decision
    ] = field(default=decide)
    """Decides (``decide.decide``); pure, so wrapping it cannot change what it returns."""
    indexed_reads: Reads | None = None
    """Where targets and credential Secrets are read: the running operator's watch-fed
    indexes (``controller/kube/indexes.py``); None: ``api``, directly. Writes go to ``api``."""
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
        policies that read it (connections are pooled per client), each capped at
        ``max_response_bytes``."""
        config = replace(config, max_response_bytes=self.max_response_bytes)
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
