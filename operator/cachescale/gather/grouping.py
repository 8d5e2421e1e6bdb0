"""Which policies share one request to Prometheus: the pure plan of grouped gathering.

Why a module of its own: ``gather/grouped.py`` runs the plan against Prometheus, which
needs the HTTP client (the ``operator`` extra), while ``cachescale groups`` shows the same
plan offline from policy files with a plain install. Both call ``plan`` and ``scope_of``
from here, so what the command explains cannot drift from what the operator sends.

A read's client is opaque to the plan: only its identity counts (the controller keeps one
``PrometheusClient`` per URL and credentials; ``cachescale groups`` one key object per URL
and credential references), so the types are generic in it.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cachescale.gather.selector import MODEL_LABEL, NAMESPACE_LABEL, POD_LABEL, QueryScope, Selector
from cachescale.gather.signals import SignalRequest

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")

DEFAULT_MAX_GROUP_SIZE = 200
"""Distinct selectors per shared query: bounds the regex (and the GET URL) it carries."""


@dataclass(frozen=True)
class Source:
    """One Prometheus as the operator tells them apart: URL and credential references
    (and their namespace, since Secrets are namespaced). The scheduler batches the
    policies of one source and window (``controller/handlers.gather_group``);
    ``cachescale groups`` uses it as the stand-in for the client."""

    url: str | None
    auth: str | None
    """``spec.metrics.auth`` as sorted JSON, or None."""
    namespace: str | None

    @classmethod
    def of(cls, metrics: Mapping[str, Any], namespace: str, default_url: str | None) -> Source:
        """The source of a policy's ``spec.metrics`` as written (the operator's default
        URL when it names none)."""
        auth = metrics.get("auth")
        return cls(
            metrics.get("prometheusUrl") or default_url,
            json.dumps(auth, sort_keys=True) if auth else None,
            namespace if auth else None,
        )


@dataclass(frozen=True)
class PolicyRead(Generic[K, C]):
    """One due policy: its key (unique among the reads; its outcome comes back under it),
    the client of its Prometheus (one per URL and credentials) and what to read."""

    key: K
    client: C
    request: SignalRequest


@dataclass(frozen=True)
class Group(Generic[K, C]):
    """Policies served by one detection query per engine and one batch per profile."""

    client: C
    members: tuple[PolicyRead[K, C], ...]

    @property
    def selectors(self) -> tuple[Selector, ...]:
        """The distinct selectors, in first-seen order."""
        return tuple(dict.fromkeys(member.request.selector for member in self.members))

    @property
    def shared(self) -> bool:
        """Whether its queries match several selectors (and results must be split)."""
        return len(self.selectors) > 1

    @property
    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        """The distinct label-name sets of its selectors, in first-seen order: several when
        selectors on different names share (each member's share is then checked)."""
        return tuple(dict.fromkeys(selector.names for selector in self.selectors))


def groupable(selector: Selector) -> bool:
    """Whether ``selector``'s series can be split back out of a shared result: every
    label it matches on must survive the fleet-level aggregation (``pod`` does not)."""
    return POD_LABEL not in selector.names


SHARING_LABELS = (MODEL_LABEL, NAMESPACE_LABEL)
"""The labels every query groups by: selectors that match on the same ones of these share
a group whatever else they match on (the shared regexes are on these)."""


def sharing_key(selector: Selector, *, across_label_sets: bool = True) -> tuple[str, ...]:
    """What a groupable selector must have in common with the others of its group: its
    ``SHARING_LABELS`` names (``across_label_sets``) when it matches on any, else (or
    without ``across_label_sets``) every label name it matches on."""
    core = tuple(name for name in selector.names if name in SHARING_LABELS)
    return core if across_label_sets and core else ("names:", *selector.names)


def bucket_of(
    read: PolicyRead[K, C], *, across_label_sets: bool = True
) -> tuple[object, ...] | None:
    """What ``plan`` puts ``read`` together with others on (before the size limit splits
    a bucket into groups), or None when it reads alone (a selector on ``pod``)."""
    request = read.request
    if not groupable(request.selector):
        return None
    return (
        id(read.client),
        request.window_seconds,
        request.kube_state_metrics,
        request.ksm_step_seconds,
        sharing_key(request.selector, across_label_sets=across_label_sets),
    )


def plan(
    reads: Sequence[PolicyRead[K, C]],
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
    *,
    across_label_sets: bool = True,
) -> list[Group[K, C]]:
    """The groups ``reads`` are served by, in first-seen order (pure). Without
    ``across_label_sets``, only selectors on the same label names share (what a member
    whose share of a mixed group could not be used falls back to)."""
    buckets: dict[tuple[object, ...], list[PolicyRead[K, C]]] = {}
    for index, read in enumerate(reads):
        key = bucket_of(read, across_label_sets=across_label_sets) or ("alone", index)
        buckets.setdefault(key, []).append(read)
    groups: list[Group[K, C]] = []
    for members in buckets.values():
        chunks: list[list[PolicyRead[K, C]]] = []
        chunk_of: dict[Selector, int] = {}  # the same selector twice: the same chunk
        for member in members:
            selector = member.request.selector
            if selector not in chunk_of:
                chunk_of[selector] = len(chunk_of) // max_group_size
                if chunk_of[selector] == len(chunks):
                    chunks.append([])
            chunks[chunk_of[selector]].append(member)
        groups.extend(Group(members[0].client, tuple(chunk)) for chunk in chunks)
    return groups


def scope_of(selectors: Sequence[Selector]) -> QueryScope:
    """Exact matchers for one selector, the shared regex scope for several."""
    if len(selectors) == 1:
        return QueryScope.for_selector(selectors[0])
    return QueryScope.shared(selectors)
