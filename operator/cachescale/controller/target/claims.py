"""Which policy may act on a target: one per autoscaler, and never the operator itself.

Two policies reshaping one HPA would undo each other's patches every round, and on delete
whichever restored last would win. So among the policies of a namespace that name the
same HPA (``spec.target.hpaName``) or the same KEDA ScaledObject
(``spec.target.scaledObjectName``), exactly one **holds** it: the one created first
(``metadata.creationTimestamp``), ties broken by name. The rule depends only on what the
API server stores, so every operator replica, restart and evaluation order agrees on it.
The others are refused with ``TargetClaimed``: they read nothing, patch nothing, and
restore nothing when deleted. A holder being deleted keeps its claim until it is gone, so
its restore has the last word; the next in line takes over at its next evaluation.

A policy whose target is the operator's own Deployment is refused with
``TargetIsOperator``: scaling or restarting the operator from its own decisions would
let a policy author disable it. The chart tells the operator who it is
(``CACHESCALE_OPERATOR_NAMESPACE``, ``CACHESCALE_OPERATOR_DEPLOYMENT``).

The claimants come from a kopf index (``controller/runtime/handlers.py``): kopf fills it from the
watch before any daemon starts, so no policy acts before it has seen its rivals. Reads
happen on the event loop; the worker threads get the verdict, not the index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from cachescale.api.reasons import Problem

NAMESPACE_ENV: Final = "CACHESCALE_OPERATOR_NAMESPACE"
"""The operator's namespace (the chart sets it from the downward API)."""
DEPLOYMENT_ENV: Final = "CACHESCALE_OPERATOR_DEPLOYMENT"
"""The name of the operator's Deployment (the chart sets it)."""

ClaimKey: TypeAlias = tuple[str, str]
"""(namespace, HPA name) or (namespace, ``ScaledObject/<name>``): a name holds no ``/``,
so the two kinds never share a key."""
SCALED_OBJECT_PREFIX: Final = "ScaledObject/"


@dataclass(frozen=True, order=True)
class Claimant:
    """One policy naming an HPA, ordered by the claim rule (oldest first, then name)."""

    created: str
    """``metadata.creationTimestamp`` as the API server writes it (RFC 3339, UTC, whole
    seconds), so text order is time order."""
    name: str
    uid: str = field(compare=False)


@dataclass(frozen=True)
class Refusal:
    """Why a policy must not act: the ``Ready=False`` reason and its one-line message."""

    reason: Problem
    message: str


@dataclass(frozen=True)
class OperatorIdentity:
    """Where the operator itself runs."""

    namespace: str
    deployment: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorIdentity | None:
        """From the chart's environment variables; None when either is unset (run out of
        cluster: there is no Deployment of the operator to protect)."""
        namespace, deployment = environ.get(NAMESPACE_ENV), environ.get(DEPLOYMENT_ENV)
        return cls(namespace, deployment) if namespace and deployment else None


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _target(body: Mapping[str, Any]) -> Mapping[str, Any]:
    target = (body.get("spec") or {}).get("target")
    return target if isinstance(target, Mapping) else {}


def claim_key(body: Mapping[str, Any]) -> ClaimKey | None:
    """The autoscaler a policy names, read from the raw spec (None when it names none): a
    policy claims its HPA or ScaledObject whether or not the rest of its spec is valid (one
    naming both claims its HPA)."""
    target = _target(body)
    namespace = str(_meta(body).get("namespace", ""))
    hpa, scaled = target.get("hpaName"), target.get("scaledObjectName")
    if isinstance(hpa, str) and hpa:
        return namespace, hpa
    if isinstance(scaled, str) and scaled:
        return namespace, SCALED_OBJECT_PREFIX + scaled
    return None


def claimant(body: Mapping[str, Any]) -> Claimant:
    """The policy as a claimant."""
    meta = _meta(body)
    return Claimant(
        str(meta.get("creationTimestamp", "")), str(meta.get("name", "")), str(meta.get("uid"))
    )


def index_entry(body: Mapping[str, Any]) -> dict[ClaimKey, Claimant]:
    """What the kopf index stores for one policy."""
    key = claim_key(body)
    return {key: claimant(body)} if key is not None else {}


def refusal(
    body: Mapping[str, Any],
    claims: Mapping[ClaimKey, Iterable[Claimant]],
    itself: OperatorIdentity | None,
) -> Refusal | None:
    """Why this policy must not act, or None when it may."""
    meta = _meta(body)
    namespace = meta.get("namespace")
    deployment = _target(body).get("deploymentName")
    if itself is not None and (namespace, deployment) == (itself.namespace, itself.deployment):
        return Refusal(
            Problem.TARGET_IS_OPERATOR,
            f"Deployment {namespace}/{deployment} is the cachescale operator itself, which "
            "never scales or restarts itself: nothing was read or changed; point "
            "spec.target at a serving Deployment and its HPA",
        )
    key = claim_key(body)
    if key is None:
        return None
    me = claimant(body)
    holder = min([*claims.get(key, ()), me])
    if holder.uid == me.uid:
        return None
    if key[1].startswith(SCALED_OBJECT_PREFIX):
        what, kind, field = key[1].replace("/", " ", 1), "a ScaledObject", "scaledObjectName"
    else:
        what, kind, field = f"HPA {key[1]}", "an HPA", "hpaName"
    return Refusal(
        Problem.TARGET_CLAIMED,
        f"{what} is managed by policy {namespace}/{holder.name} (of the policies naming "
        f"{kind}, the one created first manages it): this one changes nothing; delete one "
        f"of them or point spec.target.{field} at another {kind.split()[-1]}",
    )
