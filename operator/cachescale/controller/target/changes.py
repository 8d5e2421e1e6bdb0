"""Change correlation: what changed in the hour before a prefix-cache collapse.

A collapse is usually caused upstream of the engines: a RAG API that builds prompts
differently, a template ConfigMap edited, a gateway rolled out. So when a collapse is
first suspected (``CollapseSuspected``) and again when its ``PrefixCollapse`` alert is
raised, and only then (each read is a list call), the operator lists the policy's
declared ``spec.cache.promptSources`` and its own namespace (Deployments, and ConfigMaps
when the cluster owner granted their ``list``: ``--correlate-configmaps``, chart value
``rbac.changeCorrelation.configMaps``) for changes between an hour before the drop and the
drop. Without that flag no ConfigMap is listed anywhere, and a ConfigMap prompt source is
reported as not read, naming the chart value.

Namespaces are walls: a policy reads and reports only what its own namespace holds, plus
the namespaces the cluster owner opened to prompt sources (``--prompt-source-namespace``,
chart values ``rbac.changeCorrelation.namespaces`` and ``secretNamespaces``). A prompt
source anywhere else is not listed at all (no request is made) and is reported as not
read, naming the chart value. And no value is ever quoted: an image is named, but a
changed argument or flag only by its name (or position) with a short keyed hash of each
value, so a credential in ``--db-url=…`` never reaches a status, an Event or a log line.

- Deployment rollouts: a ReplicaSet revision created in that window, with the image,
  command, args and env difference from the previous revision's pod template (flags
  named, values hashed, env only said to have changed);
- ConfigMap and Secret writes: ``metadata.managedFields[].time`` and the manager's name.
  Both are listed as metadata only (``PartialObjectMetadataList``, ``KubeApi.metadata_items``):
  their contents are never asked for, kept or written. Secrets are listed only where a
  prompt source declares them (their ``list`` grant is an opt-in: ``docs/security.md``).

The most likely culprit (prompt sources first, then the closest before the drop) is named
in the alert message, the ``PrefixCollapse`` Event and ``status.suspectedChange``; with no
change, that is said too (it points at the clients or the traffic mix). A failed read is
named in the message and never stops the evaluation, and the look happens after the
decision was acted on, so it never delays it. The decision engine stays pure: the words
are added to its decision here, after it decided (``docs/decisions.md``,
"PrefixCollapse").
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from cachescale.api.reasons import ConditionReason, Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec, PromptSourceKind
from cachescale.api.status import ConditionType, SuspectedChange
from cachescale.controller.kube.client import KubeApi, KubeError
from cachescale.controller.target.template_diff import template_diff
from cachescale.decide import Decision
from cachescale.decide.alerts import AlertChange

log = logging.getLogger("cachescale.operator")

LOOKBACK = timedelta(hours=1)
"""How far before the drop a change counts: a template or rollout older than an hour
would have shown in the hit rate long before."""
REVISION = "deployment.kubernetes.io/revision"
"""The annotation the Deployment controller numbers its ReplicaSets with."""
MAX_NAMED = 3
"""Other changes named after the culprit; the rest are counted."""
NAMESPACES_VALUE = "rbac.changeCorrelation.namespaces"
"""The chart value that opens namespaces other than a policy's own to prompt sources."""
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


def ago(seconds: float) -> str:
    """``4 minutes``, ``90 seconds`` (under two minutes), ``1 minute`` never said."""
    if seconds < 120:
        return f"{max(0, round(seconds))} seconds"
    return f"{round(seconds / 60)} minutes"


def describe(found: Scan, declared: Sequence[Place], own: Sequence[Place], onset: datetime) -> str:
    """The culprit in words (prompt sources first, then the closest before the drop), the
    other changes after it, and the reads that failed; or that nothing changed."""
    ranked = sorted(found.changes, key=lambda c: (not c.declared, onset - c.at, c.name))
    failures = [
        f"namespace {namespace} is not allowed for prompt sources (chart value {NAMESPACES_VALUE})"
        for namespace in found.walled
    ]
    failures += [f"{place.words()}: {why}" for place, why in found.failures.items()]
    failed = f"; not read: {'; '.join(failures)}" if failures else ""
    if not ranked:
        unread = set(found.walled)
        read = [
            p
            for p in dict.fromkeys([*declared, *own])
            if p not in found.failures and p.namespace not in unread
        ]
        if not read:
            return f"could not look for changes before the drop{failed}"
        where = ", ".join(p.words() for p in read)
        return (
            f"no change found in {where} within the hour before the hit rate fell (which "
            f"points at the clients or the traffic mix){failed}"
        )
    culprit, *others = ranked
    text = (
        f"{culprit.name} ({culprit.kind}, namespace {culprit.namespace}) {culprit.what} "
        f"{ago((onset - culprit.at).total_seconds())} before the hit rate fell"
    )
    if others:
        named = ", ".join(
            f"{c.name} ({c.kind}, namespace {c.namespace}) {ago((onset - c.at).total_seconds())} "
            "before"
            for c in others[:MAX_NAMED]
        )
        more = f" and {len(others) - MAX_NAMED} more" if len(others) > MAX_NAMED else ""
        text += f"; also changed: {named}{more}"
    return text + failed


def correlate(
    api: KubeApi,
    spec: CacheScalingPolicySpec,
    namespace: str,
    stored: SuspectedChange | None,
    decision: Decision,
    now: datetime,
    allowed: Collection[str] = frozenset(),
    configmaps: bool = False,
) -> tuple[Decision, SuspectedChange | None]:
    """The decision with the suspected change in its collapse words, and the change to
    keep in status. Reads only on the evaluation that first suspects a collapse and on the
    one that raises its alert; every other evaluation reuses ``stored`` (same onset), and
    one with no collapse building or alerted drops it. Prompt sources are read in
    ``namespace`` and ``allowed`` only (``--prompt-source-namespace``); ConfigMaps are
    listed only with ``configmaps`` (``--correlate-configmaps``)."""
    onset = _onset(decision)
    if onset is None:
        return decision, None
    kept = stored if stored is not None and stored.onset == onset else None
    raised = any(c.reason is Diagnosis.PREFIX_COLLAPSE for c in decision.raised)
    suspected = _suspected(decision)
    if raised or (suspected and kept is None):
        declared, own = places(spec, namespace, configmaps)
        found = scan(api, declared, own, onset - LOOKBACK, onset, allowed, configmaps)
        kept = SuspectedChange(
            onset=onset, checked_at=now, message=describe(found, declared, own, onset)[:2048]
        )
        log.info("%s: changes before the collapse: %s", namespace, kept.message)
    if kept is None:
        return decision, None
    return _with_change(decision, kept.message), kept


def _onset(decision: Decision) -> datetime | None:
    """The drop: the building collapse's first evaluation, else the alert's raise."""
    evidence = decision.memory.collapse_evidence
    if evidence is not None:
        return evidence.started_at
    for alert in decision.alerts:
        if alert.reason is Diagnosis.PREFIX_COLLAPSE:
            return alert.since
    return None


def _suspected(decision: Decision) -> bool:
    return any(
        v.type is ConditionType.CACHE_HEALTHY and v.reason is ConditionReason.COLLAPSE_SUSPECTED
        for v in decision.conditions
    )


def _with_change(decision: Decision, words: str) -> Decision:
    """``; what changed: …`` after the collapse alert's message, its Event's, and the
    CollapseSuspected condition's."""
    suffix = f"; what changed: {words}"
    alerts = tuple(
        a.model_copy(update={"message": a.message + suffix})
        if a.reason is Diagnosis.PREFIX_COLLAPSE
        else a
        for a in decision.alerts
    )
    raised = tuple(
        AlertChange(c.reason, c.message + suffix) if c.reason is Diagnosis.PREFIX_COLLAPSE else c
        for c in decision.raised
    )
    conditions = tuple(
        replace(v, message=v.message + suffix)
        if v.reason is ConditionReason.COLLAPSE_SUSPECTED
        else v
        for v in decision.conditions
    )
    return replace(decision, alerts=alerts, raised=raised, conditions=conditions)
