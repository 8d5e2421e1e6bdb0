"""``cachescale groups``: which gather group each policy falls into, and what it sends.

Why: the operator reads the policies that share a Prometheus (URL and credentials), a
window and the label names of their selectors with one request per group
(``gather/grouping.py``), so one policy's selector decides how much load a whole fleet
puts on Prometheus, and a selector on ``pod`` quietly costs a query set of its own.
Nothing in the cluster shows the grouping; this shows it offline, from the policy files.

It cannot drift from the operator: the groups come from the same ``plan``, the queries
from the same ``scope_of``, ``detection_query`` and ``build_queries`` the gatherer calls.
Only the client is a stand-in: one ``Source`` per Prometheus URL and credential
references (namespace included when there are any, as the Secrets are namespaced), the
identity by which the operator's scheduler batches policies (``gather_group`` in
``controller/runtime/handlers.py``; ``tests/commands/test_groups.py`` holds the two
together). Credentials are never shown: the URL loses any user info, and of a Secret
only its name and key are printed, never read.

The engine profile is not known offline (the operator detects it): each engine's batch is
shown for its newest profile, and the output says so. Files are loaded and checked as
``cachescale validate`` does (``commands/validate.py``); any problem ends the command with
validate's lines and exit 1 (invalid input), before anything is printed on stdout. A ``v1``
``List`` (what ``kubectl get csp -o yaml`` writes) is read item by item, as validate reads
it: each policy of its ``items`` is a member, named by its document and item. Needs no
extra.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachescale.api.policy import API_VERSION, KIND, CacheScalingPolicy
from cachescale.api.spec import Engine, PrometheusAuth
from cachescale.api.validation import load_documents
from cachescale.commands.flags import prometheus_url
from cachescale.commands.validate import LIST, read_policy_files
from cachescale.exit_codes import ExitCode
from cachescale.gather.detection import detection_query
from cachescale.gather.egress import redact_url
from cachescale.gather.grouping import (
    DEFAULT_MAX_GROUP_SIZE,
    Group,
    PolicyRead,
    Source,
    bucket_of,
    plan,
    scope_of,
)
from cachescale.gather.promql import SERIES_LABELS, build_queries, duration, label_query
from cachescale.gather.selector import (
    POD_LABEL,
    OutsideNamespace,
    Selector,
    SelectorError,
    policy_selector,
)
from cachescale.gather.signals import SignalRequest
from cachescale.snapshot import MetricsGeneration

NEWEST_PROFILE = {
    Engine.VLLM: MetricsGeneration.VLLM_0_13,
    Engine.SGLANG: MetricsGeneration.SGLANG_0_5_20,
}
"""The profile each engine's batch is shown for (the operator detects the real one)."""

ASSUMED_NAMESPACE = "default"
"""Where a policy without ``metadata.namespace`` lands with ``kubectl apply`` and no -n."""


@dataclass(frozen=True)
class Policy:
    """One policy document of the files."""

    file: Path
    document: int
    namespace: str
    namespace_given: bool
    name: str
    policy: CacheScalingPolicy
    body: dict[str, Any]
    """The document as written (the scheduler's identity reads it, not the model)."""
    item: int | None = None
    """Its index in the ``items`` of the ``v1`` ``List`` that is ``document``, if it is one."""

    @property
    def label(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cachescale groups``."""
    parser = subparsers.add_parser(
        "groups",
        help="show which policies share one Prometheus request, and its queries",
        description=(
            "Group policies as the operator does when it reads their signals (same "
            "Prometheus URL and credentials, same window, selectors on the same label "
            "names: one request with every signal's query for the whole group), offline. "
            "Prints each group's Prometheus, window, label names, members, whether they share or "
            "a policy reads alone and why, and the PromQL the group sends. Files are "
            "checked as by cachescale validate. Exit codes: 0 shown, 1 invalid input, "
            "2 usage error."
        ),
    )
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="policy YAML file, or a folder of them"
    )
    parser.add_argument(
        "--default-prometheus-url",
        type=prometheus_url,
        metavar="URL",
        help="the operator's --default-prometheus-url, for policies without prometheusUrl",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handle ``cachescale groups``; return the exit code."""
    files = read_policy_files(args.files)
    if files is None:
        return ExitCode.INVALID
    policies = [policy for path, text in files for policy in policies_in(path, text)]
    explained = explain(policies, args.default_prometheus_url)
    if args.json:
        print(json.dumps(explained, indent=2))
    else:
        print(render_text(explained))
    return ExitCode.OK


def _documents(text: str) -> Iterator[tuple[int, int | None, Any]]:
    """Each document of ``text`` with its index, and each item of a ``v1`` ``List`` with
    the List's index and its own."""
    for index, document in enumerate(load_documents(text), start=1):
        is_list = (
            isinstance(document, dict)
            and (document.get("apiVersion"), document.get("kind")) == LIST
        )
        if is_list and isinstance(document.get("items"), list):
            yield from ((index, item, body) for item, body in enumerate(document["items"]))
        else:
            yield index, None, document


def policies_in(path: Path, text: str) -> list[Policy]:
    """The policies of a file that ``cachescale validate`` found valid (a ``v1`` ``List``'s
    items included)."""
    found = []
    for index, item, document in _documents(text):
        if not isinstance(document, dict):
            continue
        if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
            continue  # skipped by validate, with a note
        policy = CacheScalingPolicy.model_validate(document)
        namespace = policy.metadata.namespace
        found.append(
            Policy(
                path,
                index,
                namespace or ASSUMED_NAMESPACE,
                namespace is not None,
                policy.metadata.name,
                policy,
                document,
                item,
            )
        )
    return found


def source_of(policy: Policy, default_url: str | None) -> Source:
    """The Prometheus ``policy`` reads, as the operator's scheduler tells them apart (from
    the document as written, as ``gather_group`` reads the object)."""
    return Source.of(policy.body["spec"]["metrics"], policy.namespace, default_url)


def request_of(policy: Policy) -> SignalRequest:
    """What the operator reads for ``policy`` (as ``controller/reconcile/signal_reads.py``
    builds it; the target's replicas and pod ages change no query, so they are left out)."""
    spec = policy.policy.spec
    return SignalRequest(
        engine=spec.target.engine,
        selector=policy_selector(spec.metrics.selector, policy.namespace),
        window_seconds=spec.metrics.window_seconds,
        demand_query=spec.metrics.demand_query,
    )


def explain(policies: Sequence[Policy], default_url: str | None) -> dict[str, Any]:
    """The groups of ``policies`` and what each sends, as JSON-ready data."""
    sources: dict[Source, Source] = {}  # one object per identity: ``plan`` keys on it
    reads: list[PolicyRead[int, Source]] = []
    not_read: list[dict[str, Any]] = []
    for index, policy in enumerate(policies):
        source = source_of(policy, default_url)
        try:
            request = request_of(policy)
        except (SelectorError, OutsideNamespace) as error:
            reason = f"its selector cannot be read: {error}"
            not_read.append({**_member_json(policy, None), "reason": reason})
            continue
        reads.append(PolicyRead(index, sources.setdefault(source, source), request))
    groups = plan(reads)
    keys = [bucket_of(group.members[0]) for group in groups]
    return {
        "groups": [
            _group_json(number, group, policies, key is not None and keys.count(key) > 1)
            for number, (group, key) in enumerate(zip(groups, keys, strict=True), start=1)
        ],
        "not_read": not_read,
        "max_group_size": DEFAULT_MAX_GROUP_SIZE,
    }


def _reason(group: Group[int, Source], split: bool) -> str:
    selectors = group.selectors
    if group.shared and len(group.label_sets) > 1:
        return (
            f"shared: {len(selectors)} selectors on {len(group.label_sets)} label sets, read "
            f"with one regex per label they all match on; a policy whose series carry a label "
            "only the others match on is read again with its own label set"
        )
    if group.shared:
        return f"shared: {len(selectors)} selectors read with one regex per label"
    if POD_LABEL in selectors[0].names:
        return (
            "reads alone: its selector is on pod, which the fleet-level queries aggregate "
            "away, so a shared answer could not be split back per policy"
        )
    if split:
        return (
            f"reads alone: split off by the limit of {DEFAULT_MAX_GROUP_SIZE} selectors per group"
        )
    if len(group.members) > 1:
        return "one selector: its policies all have the same selector (exact matchers)"
    return (
        "reads alone: no other policy reads this Prometheus, with these credentials, over "
        "this window, with a selector on the same of model_name and namespace (or, on "
        "neither, on the same label names)"
    )


def _auth_json(auth: PrometheusAuth | None) -> dict[str, Any] | None:
    """Where the credentials come from (Secret names and keys, never their contents)."""
    if auth is None:
        return None
    token, ca = auth.bearer_token_secret_ref, auth.ca_secret_ref
    return {
        "bearer_token_secret": None if token is None else {"name": token.name, "key": token.key},
        "ca_secret": None if ca is None else {"name": ca.name, "key": ca.key},
        "insecure_skip_verify": auth.insecure_skip_verify,
    }


def _member_json(policy: Policy, request: SignalRequest | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "policy": policy.label,
        "file": str(policy.file),
        "document": policy.document,
    }
    if policy.item is not None:
        out["item"] = policy.item
    if not policy.namespace_given:
        out["namespace_assumed"] = True
    if request is not None:
        out["selector"] = str(request.selector)
        out["engine"] = request.engine.value
    return out


def _group_json(
    number: int, group: Group[int, Source], policies: Sequence[Policy], split: bool
) -> dict[str, Any]:
    first = group.members[0]
    policy = policies[first.key]
    url = group.client.url
    by_engine: dict[Engine, list[Selector]] = {}
    for member in group.members:
        by_engine.setdefault(member.request.engine, []).append(member.request.selector)
    batches = []
    for engine, selectors in by_engine.items():
        distinct = tuple(dict.fromkeys(selectors))
        scope, profile = scope_of(distinct), NEWEST_PROFILE[engine]
        window, ksm = first.request.window_seconds, first.request.kube_state_metrics
        step = first.request.ksm_step_seconds
        queries = build_queries(
            profile, scope, window, kube_state_metrics=ksm, ksm_step_seconds=step
        )
        shown = {key.value: query.promql for key, query in queries.items()}
        if len({selector.names for selector in distinct}) > 1:
            shown[SERIES_LABELS] = label_query(
                profile, scope, window, kube_state_metrics=ksm, ksm_step_seconds=step
            )
        batches.append(
            {
                "engine": engine.value,
                "profile": profile.value,
                "detection": detection_query(engine, scope),
                "queries": shown,
            }
        )
    return {
        "group": number,
        "shared": group.shared,
        "reason": _reason(group, split),
        "prometheus_url": None if url is None else redact_url(url),
        "auth": _auth_json(policy.policy.spec.metrics.auth),
        "window_seconds": first.request.window_seconds,
        "label_sets": [list(names) for names in group.label_sets],
        "members": [_member_json(policies[m.key], m.request) for m in group.members],
        "batches": batches,
        "demand_queries": [
            {"policy": policies[m.key].label, "promql": m.request.demand_query}
            for m in group.members
            if m.request.demand_query is not None
        ],
    }


def _auth_text(auth: dict[str, Any] | None) -> str:
    if auth is None:
        return "none"
    parts = []
    if auth["bearer_token_secret"] is not None:
        ref = auth["bearer_token_secret"]
        parts.append(f"bearer token from Secret {ref['name']} key {ref['key']}")
    if auth["ca_secret"] is not None:
        parts.append(f"CA from Secret {auth['ca_secret']['name']} key {auth['ca_secret']['key']}")
    if auth["insecure_skip_verify"]:
        parts.append("TLS not verified")
    return ", ".join(parts) or "none"


def render_text(explained: dict[str, Any]) -> str:
    """The human-readable report: one block per group, then the policies not read."""
    groups = explained["groups"]
    members = sum(len(group["members"]) for group in groups)
    lines = [
        f"{len(groups)} group{'s' if len(groups) != 1 else ''} for {members} "
        f"polic{'ies' if members != 1 else 'y'}; each batch is shown for its engine's newest "
        "profile (the operator detects the real one: another profile gets its own batch)"
    ]
    for group in groups:
        url = group["prometheus_url"] or "the operator's --default-prometheus-url (not given)"
        lines += [
            "",
            f"group {group['group']}: {group['reason']}",
            f"  prometheus  {url}",
            f"  auth        {_auth_text(group['auth'])}",
            f"  window      {duration(group['window_seconds'])}",
            f"  labels      {' | '.join(', '.join(names) for names in group['label_sets'])}",
            "  members",
        ]
        width = max(len(member["policy"]) for member in group["members"])
        for member in group["members"]:
            assumed = "  (no namespace: default assumed)" if "namespace_assumed" in member else ""
            lines.append(
                f"    {member['policy'].ljust(width)}  {member['selector']}  "
                f"{member['engine']}{assumed}"
            )
        for batch in group["batches"]:
            lines += ["", f"  {batch['engine']}, profile {batch['profile']}:"]
            named = {"detection": batch["detection"], **batch["queries"]}
            key_width = max(len(key) for key in named)
            lines += [f"    {key.ljust(key_width)}  {promql}" for key, promql in named.items()]
        for demand in group["demand_queries"]:
            lines.append(f"  demandQuery of {demand['policy']}, sent alone: {demand['promql']}")
    for policy in explained["not_read"]:
        lines += ["", f"not read: {policy['policy']}: {policy['reason']}"]
    return "\n".join(lines)
