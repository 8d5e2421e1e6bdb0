"""The reads of change correlation: what changed, and where, in a window before a drop.

Each place is one list call: a kind in a namespace, all of it (the policy's own namespace)
or the objects a declared prompt source's selector picks. What counts as a change:

- Deployment rollouts: a ReplicaSet revision created in the window, with the image,
  command, args and env difference from the previous revision's pod template
  (``template_diff.py``: flags named, values hashed, env only said to have changed);
- ConfigMap and Secret writes: ``metadata.managedFields[].time`` and the manager's name.
  Both are listed as metadata only (``PartialObjectMetadataList``, ``KubeApi.metadata_items``):
  their contents are never asked for, kept or written. Secrets are listed only where a
  prompt source declares them (their ``list`` grant is an opt-in: ``docs/security.md``).

Namespaces are walls: a declared place outside the policy's namespace and the namespaces
the cluster owner opened to prompt sources is not listed at all (no request is made) and
is noted as walled; without ``--correlate-configmaps`` no ConfigMap is listed anywhere,
and each ConfigMap place is a failure naming the chart value. A failed read, or an answer
not shaped as expected, is a failure of that place, never raised.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from cachescale.api.spec import CacheScalingPolicySpec, PromptSourceKind
from cachescale.controller.kube.client import KubeApi, KubeError
from cachescale.controller.target.template_diff import template_diff

REVISION = "deployment.kubernetes.io/revision"
"""The annotation the Deployment controller numbers its ReplicaSets with."""
CONFIG_MAPS_VALUE = "rbac.changeCorrelation.configMaps"
"""The chart value that grants ``list`` on ConfigMaps (and sets ``--correlate-configmaps``)."""
CONFIG_MAPS_OFF = f"ConfigMaps are not listed (chart value {CONFIG_MAPS_VALUE})"
"""Why a ConfigMap prompt source was not read without ``--correlate-configmaps``."""


@dataclass(frozen=True, slots=True)
class Place:
    """One list call: a kind in a namespace, all of it or the objects a selector picks."""

    namespace: str
    kind: PromptSourceKind
    selector: str | None
    """None: every object of the kind in the namespace (the policy's own namespace)."""

    def words(self) -> str:
        """``Deployments app=rag-api in namespace rag``."""
        plural = f"{self.kind}s"
        picked = f" {self.selector}" if self.selector else ""
        return f"{plural}{picked} in namespace {self.namespace}"


@dataclass(frozen=True, slots=True)
class Change:
    """One change found before the drop."""

    kind: PromptSourceKind
    namespace: str
    name: str
    at: datetime
    what: str
    """``rolled out revision 42 (image rag-api:1.8.2 → 1.8.3)``, ``updated by kubectl-edit``."""
    declared: bool
    """It is in a declared prompt source (ranked first)."""


@dataclass
class Scan:
    """What one look found: the changes, and the reads that failed or were not made."""

    changes: list[Change] = field(default_factory=list)
    failures: dict[Place, str] = field(default_factory=dict)
    """The places that could not be read, and why."""
    walled: list[str] = field(default_factory=list)
    """Namespaces of declared prompt sources outside the policy's namespace and the
    allowed ones: nothing was asked of the API there."""


def places(
    spec: CacheScalingPolicySpec, namespace: str, configmaps: bool
) -> tuple[list[Place], list[Place]]:
    """(declared prompt sources, the policy's own namespace): what is listed, in order.
    The own namespace is read for Deployments, for ConfigMaps only with ``configmaps``
    (``--correlate-configmaps``: their ``list`` is an opt-in), never for Secrets (a Secret
    is read only where a prompt source declares it, and needs its own grant)."""
    declared = [
        Place(source.namespace, source.kind, source.label_selector)
        for source in spec.cache.prompt_sources
    ]
    own = [Place(namespace, PromptSourceKind.DEPLOYMENT, None)]
    if configmaps:
        own.append(Place(namespace, PromptSourceKind.CONFIG_MAP, None))
    return declared, own


def scan(
    api: KubeApi,
    declared: Sequence[Place],
    own: Sequence[Place],
    since: datetime,
    until: datetime,
    allowed: Collection[str] | None = None,
    configmaps: bool = True,
) -> Scan:
    """The changes in ``[since, until]`` at every place (deduplicated: an object both
    declared and in the own namespace counts as declared). With ``allowed``, a declared
    place outside the own namespace and ``allowed`` is not read (invariant: no request
    names a namespace other than the policy's and the allowed ones) but noted in
    ``walled``. Without ``configmaps``, no ConfigMap place is read (invariant: no request
    lists ConfigMaps) and each is a failure saying so (``CONFIG_MAPS_OFF``)."""
    result = Scan()
    seen: dict[tuple[str, str, str, str], Change] = {}
    replica_sets: dict[str, list[dict[str, Any]]] = {}
    open_to = {p.namespace for p in own} | set(allowed or ())
    for place in dict.fromkeys([*declared, *own]):  # a source declared twice is read once
        if allowed is not None and place.namespace not in open_to:
            if place.namespace not in result.walled:
                result.walled.append(place.namespace)
            continue
        if not configmaps and place.kind is PromptSourceKind.CONFIG_MAP:
            result.failures[place] = CONFIG_MAPS_OFF
            continue
        is_declared = place in declared
        try:
            found = _read(api, place, since, until, replica_sets)
        except KubeError as error:
            result.failures[place] = str(error)
            continue
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            # An answer not shaped as expected: said, like a failed read, never raised.
            result.failures[place] = f"an unexpected answer ({type(error).__name__})"
            continue
        for change in found:
            key = (change.kind, change.namespace, change.name, change.what)
            if key not in seen:
                seen[key] = replace(change, declared=is_declared)
    result.changes = list(seen.values())
    return result


def _read(
    api: KubeApi,
    place: Place,
    since: datetime,
    until: datetime,
    replica_sets: dict[str, list[dict[str, Any]]],
) -> list[Change]:
    ns = place.namespace
    if place.kind is PromptSourceKind.DEPLOYMENT:
        deployments = api.items(f"/apis/apps/v1/namespaces/{ns}/deployments", place.selector)
        if ns not in replica_sets:
            replica_sets[ns] = api.items(f"/apis/apps/v1/namespaces/{ns}/replicasets")
        changes: list[Change] = []
        for deployment in deployments:
            changes.extend(_rollouts(ns, deployment, replica_sets[ns], since, until))
        return changes
    plural = "configmaps" if place.kind is PromptSourceKind.CONFIG_MAP else "secrets"
    items = api.metadata_items(f"/api/v1/namespaces/{ns}/{plural}", place.selector)
    # Even metadata can carry the contents (kubectl apply's last-applied-configuration
    # annotation holds the whole object, a Secret's data included): keep names and times.
    stamps = [_stamps(item["metadata"]) for item in items]
    return [c for meta in stamps if (c := _write(place.kind, ns, meta, since, until))]


def _stamps(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Of an object's metadata, only its name, creation time and who wrote it when."""
    return {
        "name": meta.get("name"),
        "creationTimestamp": meta.get("creationTimestamp"),
        "managedFields": [
            {key: entry.get(key) for key in ("manager", "operation", "time")}
            for entry in meta.get("managedFields") or []
        ],
    }


def _rollouts(
    ns: str,
    deployment: Mapping[str, Any],
    replica_sets: Sequence[Mapping[str, Any]],
    since: datetime,
    until: datetime,
) -> list[Change]:
    """Each ReplicaSet revision of ``deployment`` created in the window, with its diff."""
    meta = deployment.get("metadata") or {}
    owned = sorted(
        (
            (revision, rs)
            for rs in replica_sets
            if _owned_by(rs, str(meta.get("uid", ""))) and (revision := _revision(rs)) is not None
        ),
        key=lambda pair: pair[0],
    )
    changes = []
    for index, (revision, rs) in enumerate(owned):
        created = _time((rs.get("metadata") or {}).get("creationTimestamp"))
        if created is None or not since <= created <= until:
            continue
        previous = owned[index - 1][1] if index else None
        diff = template_diff(previous, rs) if previous is not None else "first revision"
        what = f"rolled out revision {revision}" + (f" ({diff})" if diff else "")
        changes.append(
            Change(PromptSourceKind.DEPLOYMENT, ns, str(meta["name"]), created, what, False)
        )
    return changes


def _owned_by(rs: Mapping[str, Any], uid: str) -> bool:
    owners = (rs.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(o.get("kind") == "Deployment" and o.get("uid") == uid for o in owners)


def _revision(rs: Mapping[str, Any]) -> int | None:
    text = ((rs.get("metadata") or {}).get("annotations") or {}).get(REVISION)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _write(
    kind: PromptSourceKind,
    namespace: str,
    meta: Mapping[str, Any],
    since: datetime,
    until: datetime,
) -> Change | None:
    """The latest write to the object in the window (managedFields: time and manager),
    else its creation in the window; None when it was not touched then."""
    latest: tuple[datetime, str, str] | None = None
    for entry in meta.get("managedFields") or []:
        at = _time(entry.get("time"))
        if at is None or not since <= at <= until:
            continue
        if latest is None or at > latest[0]:
            latest = (at, str(entry.get("manager", "an unnamed manager")), entry.get("operation"))
    created = _time(meta.get("creationTimestamp"))
    if latest is not None:
        at, manager, operation = latest
        verb = "created" if created == at else "applied" if operation == "Apply" else "updated"
        return Change(kind, namespace, str(meta.get("name")), at, f"{verb} by {manager}", False)
    if created is not None and since <= created <= until:
        return Change(kind, namespace, str(meta.get("name")), created, "created", False)
    return None


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
