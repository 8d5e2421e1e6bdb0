"""Shards (``cachescale run --policy-selector``): the flag, which watch carries the
selector, and the event handler that unregisters a policy once it leaves the watch.

The API server's side (the filtered list and watch, the deletion sent when a policy is
relabelled out) needs a real API server: e2e/test_operator_shards.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any, cast

import kopf
import pytest
from prometheus_client import generate_latest

from cachescale.api.label_selector import LabelSelector
from cachescale.api.policy import GROUP, PLURAL, VERSION
from cachescale.api.reasons import Problem
from cachescale.commands import run as command
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.reconcile.schedule import Due
from cachescale.controller.runtime.handlers import membership
from cachescale.controller.runtime.members import Runtime
from cachescale.controller.runtime.serve import shard_settings
from tests.controller.cluster import FakeCluster, policy

# kopf types its decorated handlers as its own protocols; these tests call them with the
# few keyword arguments they read.
on_event: Any = membership

POLICIES = kopf.Resource(GROUP, VERSION, PLURAL, kind="CacheScalingPolicy", namespaced=True)
OTHERS = [
    kopf.Resource("", "v1", "namespaces", kind="Namespace", namespaced=False),
    kopf.Resource(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", kind="CustomResourceDefinition"
    ),
    kopf.Resource("kopf.dev", "v1", "clusterkopfpeerings", kind="ClusterKopfPeering"),
    kopf.Resource("kopf.dev", "v1", "kopfpeerings", kind="KopfPeering", namespaced=True),
    kopf.Resource("apps", "v1", "deployments", kind="Deployment", namespaced=True),
    kopf.Resource("", "v1", "pods", kind="Pod", namespaced=True),
]


def parse_run(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *flags])


def exports_policy(runtime: Runtime, name: str) -> bool:
    """Whether the operator's ``/metrics`` still has a series of the policy."""
    return f'policy="{name}"' in generate_latest(runtime.operator.metrics.registry).decode()


def test_the_flag_is_parsed_once_and_absent_means_every_policy() -> None:
    args = parse_run("--policy-selector", "team = search, tier in (a,b)")
    assert args.policy_selector == LabelSelector.parse("team=search,tier in (a,b)")
    assert parse_run().policy_selector is None


def test_a_malformed_selector_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_run("--policy-selector", "team in search")
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--policy-selector: 'team in search' is not a label selector" in error
    assert "in parentheses" in error


def test_only_the_policy_watch_carries_the_selector() -> None:
    settings = shard_settings(LabelSelector.parse("team = search,!canary"))
    assert settings.watching.label_selectors.collect(POLICIES) == ["team=search,!canary"]
    for resource in OTHERS:
        assert settings.watching.label_selectors.collect(resource) == [], resource


def test_without_a_selector_nothing_is_filtered() -> None:
    settings = shard_settings(None)
    for resource in [POLICIES, *OTHERS]:
        assert settings.watching.label_selectors.collect(resource) == []


def body_of(raw: dict[str, Any]) -> kopf.Body:
    return kopf.Body(cast(kopf.RawBody, raw))


def event_of(event_type: str | None, raw: dict[str, Any]) -> kopf.RawEvent:
    return cast(kopf.RawEvent, {"type": event_type, "object": raw})


def listed(runtime: Runtime, raw: dict[str, Any]) -> None:
    """The watch lists ``raw``: its membership event, run to its end."""
    memo = kopf.Memo(runtime=runtime)
    asyncio.run(on_event(event=event_of(None, raw), body=body_of(raw), memo=memo, claims={}))


def test_a_member_keeps_its_body_but_the_api_servers_field_ownership(cluster: FakeCluster) -> None:
    """``managedFields`` was half of every policy the operator held; nothing reads it."""
    runtime = Runtime(Operator(cluster.api))
    raw = policy(prometheus_url="http://127.0.0.1:1")
    raw["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    raw["status"] = {"memory": {"healthyHitRate": 0.8}}
    listed(runtime, raw)
    kept = runtime.members[raw["metadata"]["uid"]].body
    assert "managedFields" not in kept["metadata"]
    assert "managedFields" in raw["metadata"], "kopf's object is left as it is"
    trimmed = {key: value for key, value in raw["metadata"].items() if key != "managedFields"}
    assert kept == {**raw, "metadata": trimmed}


def test_every_member_body_shares_its_keys_and_words_with_the_others(
    cluster: FakeCluster,
) -> None:
    """Each body as the watch delivers it is its own parse, keys included; the operator
    holds thousands, so it keeps one string per key and per short word, not one each."""
    runtime = Runtime(Operator(cluster.api))
    raws = [
        json.loads(json.dumps(policy(f"p{n}", prometheus_url="http://127.0.0.1:1")))
        for n in range(2)
    ]
    for raw in raws:
        condition = {"type": "Ready", "status": "True", "message": "x" * 40}
        raw["status"] = json.loads(json.dumps({"conditions": [condition]}))  # its own parse
        listed(runtime, raw)
    first, second = (runtime.members[raw["metadata"]["uid"]].body for raw in raws)
    parsed = [raw["status"]["conditions"][0] for raw in raws]
    assert parsed[0]["status"] is not parsed[1]["status"]
    assert next(iter(parsed[0])) is not next(iter(parsed[1]))
    ready = [body["status"]["conditions"][0] for body in (first, second)]
    assert ready[0]["status"] is ready[1]["status"], "a short word is one string"
    key = [next(k for k in condition if k == "type") for condition in ready]
    assert key[0] is key[1], "a key is one string"
    assert ready[0]["message"] is not ready[1]["message"], "a long text is each body's own"
    assert first == raws[0], "the same body"


def test_a_policy_that_leaves_the_watch_is_no_longer_evaluated(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Relabelled out of the shard, the policy arrives as a deletion with no deletion under
    way: it is unregistered before another evaluation, and its metrics go."""
    runtime = Runtime(Operator(cluster.api))
    raw = policy(prometheus_url="http://127.0.0.1:1")
    memo = kopf.Memo(runtime=runtime)

    async def scenario() -> int:
        runtime.scheduler.start()
        await on_event(event=event_of(None, raw), body=body_of(raw), memo=memo, claims={})
        while "/vllm: " not in caplog.text:  # a first evaluation (within the 10 s interval)
            await asyncio.sleep(0.02)
        assert list(runtime.members) == ["uid-vllm"]
        await on_event(event=event_of("DELETED", raw), body=body_of(raw), memo=memo, claims={})
        runtime.scheduler.stop()
        return caplog.text.count("vllm: ")

    caplog.set_level(logging.INFO, "cachescale.operator")
    with caplog.at_level(logging.INFO):
        runtime.operator.metrics.failed("llm", "vllm", Problem.INTERNAL)
        evaluated = asyncio.run(scenario())
    assert runtime.members == {}
    assert runtime.scheduler.schedule.next_wake(0.0) is None, "still scheduled"
    assert "left this operator's watch" in caplog.text
    assert evaluated >= 1
    assert not exports_policy(runtime, "vllm")


@pytest.mark.parametrize("event_type", [None, "ADDED", "MODIFIED"])
def test_a_listed_added_or_changed_policy_is_registered_once_with_its_newest_body(
    cluster: FakeCluster, event_type: str | None
) -> None:
    runtime = Runtime(Operator(cluster.api))
    memo = kopf.Memo(runtime=runtime)
    first = policy(prometheus_url="http://127.0.0.1:1")
    edited = policy(prometheus_url="http://127.0.0.1:1", extra={"metrics": {"interval": "60s"}})

    async def scenario() -> float:
        for kind, raw in ((event_type, first), ("MODIFIED", edited)):
            await on_event(event=event_of(kind, raw), body=body_of(raw), memo=memo, claims={})
        entry = runtime.scheduler.schedule._entries["uid-vllm"]
        return entry.interval()

    assert asyncio.run(scenario()) == 60.0, "the interval is read from the newest body"
    assert list(runtime.members) == ["uid-vllm"]
    assert runtime.members["uid-vllm"].body["spec"]["metrics"]["interval"] == "60s"


@pytest.mark.parametrize("event_type", ["MODIFIED", "DELETED"])
def test_a_deletion_under_way_unregisters_without_forgetting_the_metrics(
    cluster: FakeCluster, event_type: str
) -> None:
    """Being deleted, the policy is no longer evaluated (the restore has the last word,
    and the delete handler forgets its metrics then)."""
    runtime = Runtime(Operator(cluster.api))
    memo = kopf.Memo(runtime=runtime)
    raw = policy(prometheus_url="http://127.0.0.1:1")
    runtime.operator.metrics.failed("llm", "vllm", Problem.INTERNAL)

    async def scenario() -> None:
        await on_event(event=event_of(None, raw), body=body_of(raw), memo=memo, claims={})
        raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        await on_event(event=event_of(event_type, raw), body=body_of(raw), memo=memo, claims={})

    asyncio.run(scenario())
    assert runtime.members == {}
    assert exports_policy(runtime, "vllm")


def test_a_peering_pause_forgets_every_policy_and_submits_nothing(cluster: FakeCluster) -> None:
    """Paused, the replica evaluates nothing, even a policy that joins from an event that
    came in as the pause began; kopf's relisting on resume registers them again."""
    runtime = Runtime(Operator(cluster.api))
    memo = kopf.Memo(runtime=runtime)
    raw = policy(prometheus_url="http://127.0.0.1:1")

    async def scenario() -> None:
        await on_event(event=event_of(None, raw), body=body_of(raw), memo=memo, claims={})
        runtime.turn(False)
        assert runtime.members == {}
        await on_event(event=event_of("MODIFIED", raw), body=body_of(raw), memo=memo, claims={})
        job = runtime._job([Due("uid-vllm", 0.0, 10.0)])
        job()
        runtime.turn(True)
        assert list(runtime.members) == ["uid-vllm"]

    asyncio.run(scenario())
    assert list(cluster.emulator) == [], "a paused replica sent a request"


def test_membership_watches_every_policy_event() -> None:
    registry = kopf.get_default_registry()
    watching = [h for h in registry._watching.get_all_handlers() if h.fn is membership]
    assert len(watching) == 1
    handler = watching[0]
    assert handler.selector is not None
    assert handler.selector.check(POLICIES)
    assert not any(handler.selector.check(resource) for resource in OTHERS)
    assert (handler.labels, handler.annotations, handler.when) == (None, None, None)
