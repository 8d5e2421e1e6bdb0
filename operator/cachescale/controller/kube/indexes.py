"""In-memory indexes of the targets' Deployments, HPAs, pods and ScaledObjects, and the
reads served from them.

Each evaluation reads its target (``workload.read_target``): the HPA (or the KEDA
ScaledObject and the HPA KEDA generated), the Deployment, and the pods its selector picks.
Asked of the API server, that is three or four requests per policy per interval: a read
storm at thousands of policies. Instead the operator's informers
(``controller/kube/informer.py``) list and watch these kinds and keep each object's entries
below (its projection under its key) in a store; :class:`IndexedReads` serves
``read_target``'s paths from those stores, so a steady-state evaluation sends no read.
What they do not cover goes to the API server: any other path, a selector with
``>``/``<``, a kind whose store has not listed the namespace read yet (``--keda`` while
KEDA's CRD is not installed, a list that failed, RBAC for one, or a namespace whose
informers a shard has just started), and an object a store does not hold (a target that
is missing, or one created a moment before its watch event): a missing target costs one
read per evaluation, as before. Which stores serve is decided per kind and namespace
(:class:`TargetIndexes`): a namespace not listed yet never sends another namespace's
reads to the API server.

Only a projection of each object is kept, the fields ``read_target`` and
``keda.read_scaled_object`` use, in the object's own shape (memory at fleet scale
matters: a pod is its name, labels, deletion mark and Ready condition). Objects are keyed
by (namespace, name); pods by namespace and by each of their labels, so a selector's first
equality requirement narrows the candidates before it is matched in memory.
tests/controller/kube/test_indexes.py proves the reads equal the direct ones. Writes
never use a projection: ``controller/target/actions.py`` reads the full object before a patch.

Secrets are not watched: the operator may only ``get`` the Secrets named in
``rbac.prometheusSecrets`` (least privilege), so a Secret read is kept for
:data:`SECRET_TTL_S` instead, and a rotated token or a removed opt-in label is seen within
that time. Only a Secret that carries the opt-in label (``docs/security.md``) is kept; one
that does not, or a failed read, is not: the next evaluation asks again.

The informers change the stores in their threads while evaluations read them in theirs:
a store takes its lock for every change and every read, and a read returns a tuple of its
own of projections that are replaced, never changed, so an evaluation never sees a store
change under it; :class:`IndexedReads` then returns copies, so no evaluation changes one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from threading import Lock
from typing import Any, Final, Literal, Protocol

from cachescale.api.label_selector import LabelSelector, Requirement
from cachescale.api.policy import MAX_NUM_SEQS_CHANGED, ORIGINAL_ENVELOPE, PROMETHEUS_CREDENTIALS
from cachescale.controller.kube.client import KubeApi
from cachescale.controller.target.keda_pauses import READ_ANNOTATIONS
from cachescale.controller.target.workload import GPU_RESOURCES

ObjectKey = tuple[str, str]
"""(namespace, name)."""
PodKey = tuple[str, str, str]
"""(namespace, label key, label value); (namespace, "", "") holds every pod of it."""
Projection = dict[str, Any]
Index = Mapping[Any, Collection[Projection]]
"""Key → the projections under it: an informer's store (``controller/kube/informer.py``), or a
test's dict."""
Entries = dict[Any, Projection]
"""One object's projection under each of its index keys."""
IndexName = Literal["deployments", "hpas", "pods", "scaled_objects"]
"""A kind's index (a field of :class:`Indexes`)."""

SECRET_TTL_S: Final = 30.0
"""How long a Secret read for ``spec.metrics.auth`` is reused: a rotated token or a removed
opt-in label is seen within it (plus one interval)."""

_MATCHED: Final = frozenset({"exists", "!", "=", "==", "!=", "in", "notin"})
"""Selector operators matched in memory (``workload._selector`` writes no others)."""


# -- projections ---------------------------------------------------------------------------


def _pick(source: Mapping[str, Any] | None, *keys: str) -> dict[str, Any]:
    """Copies of ``keys`` of ``source`` that are present (absent stays absent)."""
    source = source or {}
    return {key: _compact(source[key]) for key in keys if key in source}


def _compact(value: Any) -> Any:
    """A copy of a JSON value with its strings interned: field names, label keys and
    values, namespaces and timestamps repeat across thousands of objects (each parsed
    into strings of its own), and are then held once."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, Mapping):
        return {sys.intern(str(k)): _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def _copied(projection: Projection) -> Projection:
    """A copy of a projection, whose values are dicts, lists and immutable JSON scalars
    only (``_compact`` made them): what ``copy.deepcopy`` returns, at a third of its cost
    (no memo, no dispatch per type), for every target read of every evaluation."""
    return {key: _copy(item) for key, item in projection.items()}


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def _metadata(meta: Mapping[str, Any], annotations: tuple[str, ...], *keys: str) -> Projection:
    projected = _pick(meta, "name", "namespace", "resourceVersion", *keys)
    projected["annotations"] = _pick(meta.get("annotations"), *annotations)
    return projected


def _container(container: Mapping[str, Any]) -> Projection:
    resources = container.get("resources") or {}
    return {
        **_pick(container, "name", "command", "args"),
        "resources": {
            section: _pick(resources[section], *GPU_RESOURCES)
            for section in ("requests", "limits")
            if section in resources
        },
    }


def deployment_projection(body: Mapping[str, Any]) -> Projection:
    """Replicas, selector, each container's name, command, args and GPUs, the rollout
    state and the last ``--max-num-seqs`` change."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    return {
        "metadata": _metadata(meta, (MAX_NUM_SEQS_CHANGED,), "generation"),
        "spec": {
            **_pick(spec, "replicas", "selector"),
            "template": {
                "spec": {"containers": [_container(c) for c in template.get("containers") or []]}
            },
        },
        "status": _pick(
            body.get("status"), "replicas", "readyReplicas", "updatedReplicas", "observedGeneration"
        ),
    }


def hpa_projection(body: Mapping[str, Any]) -> Projection:
    """Owners, the original-envelope record, the envelope, target and metrics, and the
    replicas it runs and wants (read for KEDA's generated HPA)."""
    return {
        "metadata": _metadata(body.get("metadata") or {}, (ORIGINAL_ENVELOPE,), "ownerReferences"),
        "spec": _pick(body.get("spec"), "scaleTargetRef", "minReplicas", "maxReplicas", "metrics"),
        "status": _pick(body.get("status"), "currentReplicas", "desiredReplicas"),
    }


def scaled_object_projection(body: Mapping[str, Any]) -> Projection:
    """The whole spec (envelope, triggers, fallback, behavior), the record and paused
    annotations, KEDA's conditions and the name of the HPA it generated."""
    status = body.get("status") or {}
    projected_status = _pick(status, "hpaName")
    if "conditions" in status:
        projected_status["conditions"] = [
            _pick(condition, "type", "status") for condition in status["conditions"] or []
        ]
    return {
        "metadata": _metadata(body.get("metadata") or {}, (ORIGINAL_ENVELOPE, *READ_ANNOTATIONS)),
        "spec": _compact(body.get("spec") or {}),
        "status": projected_status,
    }


def pod_projection(body: Mapping[str, Any]) -> Projection:
    """Name, labels, deletion mark and the Ready condition."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return {
        "metadata": _pick(body.get("metadata"), "name", "labels", "deletionTimestamp"),
        "status": {
            "conditions": [
                _pick(c, "type", "status", "lastTransitionTime")
                for c in conditions
                if c.get("type") == "Ready"
            ]
        },
    }


def object_key(body: Mapping[str, Any]) -> ObjectKey:
    """(namespace, name), interned."""
    meta = body.get("metadata") or {}
    return sys.intern(str(meta.get("namespace", ""))), sys.intern(str(meta.get("name", "")))


def pod_entries(body: Mapping[str, Any]) -> dict[PodKey, Projection]:
    """One pod under its namespace and under each of its labels (one shared value)."""
    namespace, _ = object_key(body)
    projected = pod_projection(body)
    labels = projected["metadata"].get("labels") or {}
    return {
        (namespace, "", ""): projected,
        **{(namespace, str(k), str(v)): projected for k, v in labels.items()},
    }


# -- index entries: what a store keeps of one object ------------------------------------


def deployment_entries(body: Mapping[str, Any]) -> Entries:
    """A Deployment, projected, under (namespace, name)."""
    return {object_key(body): deployment_projection(body)}


def hpa_entries(body: Mapping[str, Any]) -> Entries:
    """An HPA (KEDA's generated ones included), projected, under (namespace, name)."""
    return {object_key(body): hpa_projection(body)}


def scaled_object_entries(body: Mapping[str, Any]) -> Entries:
    """A KEDA ScaledObject, projected, under (namespace, name)."""
    return {object_key(body): scaled_object_projection(body)}


# -- reads served from them ----------------------------------------------------------------


class TargetIndexes(Protocol):
    """Where :class:`IndexedReads` finds each kind of a namespace."""

    def index(self, kind: IndexName, namespace: str) -> Index | None:
        """The index of ``kind`` (deployments and HPAs by (namespace, name), pods by
        (namespace, "", "") and by (namespace, label key, label value), KEDA
        ScaledObjects by (namespace, name)) that holds every object of ``namespace``;
        None while there is none (not indexed, or that namespace not listed yet), and
        that kind is read there from the API server."""
        ...


@dataclass(frozen=True)
class Indexes:
    """Fixed indexes of every namespace (a test's, or a tool's): ``scaled_objects`` None,
    read from the API."""

    deployments: Index
    hpas: Index
    pods: Index
    scaled_objects: Index | None = None

    def index(self, kind: IndexName, namespace: str) -> Index | None:
        """The field ``kind``, whatever the namespace."""
        found: Index | None = getattr(self, kind)
        return found


_OBJECTS: Final[dict[tuple[str, str, str], IndexName]] = {
    ("apps", "v1", "deployments"): "deployments",
    ("autoscaling", "v2", "horizontalpodautoscalers"): "hpas",
    ("keda.sh", "v1alpha1", "scaledobjects"): "scaled_objects",
}
"""(group, version, plural) of the objects served from an index → its kind's index."""


class IndexedReads:
    """``read_target``'s reads (``client.Reads``) from the indexes, opted-in Secrets for a
    while from memory, anything else from the API server."""

    def __init__(
        self, api: KubeApi, indexes: TargetIndexes, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._api = api
        self._indexes = indexes
        self._clock = clock
        self._secrets: dict[str, tuple[float, Projection]] = {}
        self._lock = Lock()

    def get(self, path: str) -> dict[str, Any]:
        """The object at ``path``: from its index, else (not indexed, its namespace not
        listed yet, or not there) from the API server, whose 404 is then authoritative."""
        parts = path.strip("/").split("/")
        if len(parts) == 7 and parts[0] == "apis" and parts[3] == "namespaces":
            kind = _OBJECTS.get((parts[1], parts[2], parts[5]))
            index = self._indexes.index(kind, parts[4]) if kind is not None else None
            found = list(index.get((parts[4], parts[6])) or ()) if index is not None else []
            if found:
                return _copied(found[0])
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            return self._secret(path)
        return self._api.get(path)

    def items(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The items at ``path``; pods matched in memory, sorted by name as the API
        server lists them (from the API server while the namespace's pods are not
        indexed)."""
        parts = path.strip("/").split("/")
        if len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            pods = self._indexes.index("pods", parts[3])
            found = select(pods, parts[3], label_selector) if pods is not None else None
            if found is not None:
                return found
        return self._api.items(path, label_selector)

    def _secret(self, path: str) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            kept = self._secrets.get(path)
            if kept is not None and now - kept[0] < SECRET_TTL_S:
                return _copied(kept[1])
        secret = self._api.get(path)
        projected = {"metadata": _pick(secret.get("metadata"), "labels"), **_pick(secret, "data")}
        if (projected["metadata"].get("labels") or {}).get(PROMETHEUS_CREDENTIALS) != "true":
            return projected  # not opted in: refused by the caller, and not kept
        with self._lock:
            fresh = {p: e for p, e in self._secrets.items() if now - e[0] < SECRET_TTL_S}
            fresh[path] = (now, projected)
            self._secrets = fresh
        return _copied(projected)


def select(index: Index, namespace: str, selector: str | None) -> list[dict[str, Any]] | None:
    """The pods of ``namespace`` that ``selector`` matches, by name; None when the
    selector is not one matched in memory (``>``, ``<``, or not parseable)."""
    requirements: tuple[Requirement, ...] = ()
    if selector:
        try:
            requirements = LabelSelector.parse(selector).requirements
        except ValueError:
            return None
    if any(r.operator not in _MATCHED for r in requirements):
        return None
    narrow = next((r for r in requirements if r.operator in ("=", "==")), None)
    key = (namespace, narrow.key, narrow.values[0]) if narrow else (namespace, "", "")
    candidates = list(index.get(key) or ())
    chosen = [
        pod
        for pod in candidates
        if all(matches(r, pod["metadata"].get("labels") or {}) for r in requirements)
    ]
    chosen.sort(key=lambda pod: str(pod["metadata"].get("name", "")))
    return [_copied(pod) for pod in chosen]


def matches(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` meet one requirement (``exists ! = == != in notin``), as the API
    server decides (``k8s.io/apimachinery/pkg/labels``)."""
    present = requirement.key in labels
    if requirement.operator == "exists":
        return present
    if requirement.operator == "!":
        return not present
    inside = present and labels[requirement.key] in requirement.values
    return not inside if requirement.operator in ("!=", "notin") else inside
