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

What counts as a change (Deployment rollouts, ConfigMap and Secret writes) and how each
place is read is ``change_scan.py``; this module decides when to look and puts the
findings into words.

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
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from cachescale.api.reasons import ConditionReason, Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.status import ConditionType, SuspectedChange
from cachescale.controller.kube.client import KubeApi
from cachescale.controller.target.change_scan import Place, Scan, places, scan
from cachescale.decide import Decision
from cachescale.decide.alerts import AlertChange

log = logging.getLogger("cachescale.operator")

LOOKBACK = timedelta(hours=1)
"""How far before the drop a change counts: a template or rollout older than an hour
would have shown in the hit rate long before."""
MAX_NAMED = 3
"""Other changes named after the culprit; the rest are counted."""
NAMESPACES_VALUE = "rbac.changeCorrelation.namespaces"
"""The chart value that opens namespaces other than a policy's own to prompt sources."""


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
