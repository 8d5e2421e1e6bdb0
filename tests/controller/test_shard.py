"""Shards (``cachescale run --policy-selector``): the flag, which watch carries the
selector, and the event handler that stops a policy's loop once it leaves the watch.

The API server's side (the filtered list and watch, the deletion sent when a policy is
relabelled out) needs a real API server: e2e/test_operator_shards.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any, cast

import kopf
import pytest

from cachescale.api.label_selector import LabelSelector
from cachescale.api.policy import GROUP, PLURAL, VERSION
from cachescale.api.reasons import Problem
from cachescale.controller import command
from cachescale.controller.evaluation import Operator
from cachescale.controller.handlers import Runtime, departures, policy_loop
from cachescale.controller.serve import shard_settings
from tests.controller.cluster import FakeCluster, policy

# kopf types its decorated handlers as its own protocols; these tests call them with the
# few keyword arguments they read.
on_event: Any = departures
daemon: Any = policy_loop

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


class Stopped:
    """What the loop uses of kopf's ``DaemonStopped``: never stopped, short waits."""

    def __bool__(self) -> bool:
        return False

    async def wait(self, timeout: float | None = None) -> None:
        await asyncio.sleep(0.02)


def body_of(raw: dict[str, Any]) -> kopf.Body:
    return kopf.Body(cast(kopf.RawBody, raw))


def deleted(raw: dict[str, Any]) -> kopf.RawEvent:
    return cast(kopf.RawEvent, {"type": "DELETED", "object": raw})


def test_a_policy_that_leaves_the_watch_stops_its_loop(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Relabelled out of the shard, the policy arrives as a deletion with no deletion under
    way: its loop stops before another evaluation, and its metrics go."""
    runtime = Runtime(Operator(cluster.api))
    raw = policy(prometheus_url="http://127.0.0.1:1")
    memo = kopf.Memo(runtime=runtime)

    async def scenario() -> int:
        runtime.scheduler.start()
        loop = asyncio.create_task(
            daemon(body=body_of(raw), memo=memo, stopped=Stopped(), claims={})
        )
        while "/vllm: " not in caplog.text:  # a first evaluation (within the 10 s interval)
            await asyncio.sleep(0.02)
        assert list(runtime.departed) == ["uid-vllm"]
        on_event(event=deleted(raw), body=body_of(raw), memo=memo)
        await asyncio.wait_for(loop, 5.0)
        runtime.scheduler.stop()
        return caplog.text.count("vllm: ")

    caplog.set_level(logging.INFO, "cachescale.operator")
    with caplog.at_level(logging.INFO):
        runtime.operator.metrics.failed("llm", "vllm", Problem.INTERNAL)
        evaluated = asyncio.run(scenario())
    assert runtime.departed == {}
    assert runtime.members == {}
    assert "left this operator's watch" in caplog.text
    assert evaluated >= 1
    assert runtime.operator.metrics._series == {}


@pytest.mark.parametrize(
    ("event_type", "deletion_under_way"), [("MODIFIED", False), ("ADDED", False), ("DELETED", True)]
)
def test_other_events_leave_the_loop_alone(
    cluster: FakeCluster, event_type: str, deletion_under_way: bool
) -> None:
    """Only a disappearance without a deletion stops the loop here; a deletion stops it
    through kopf (the restore must have the last word)."""
    runtime = Runtime(Operator(cluster.api))
    raw = policy(prometheus_url="http://127.0.0.1:1")
    if deletion_under_way:
        raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    gone = runtime.departed["uid-vllm"] = asyncio.Event()
    event = cast(kopf.RawEvent, {"type": event_type, "object": raw})
    on_event(event=event, body=body_of(raw), memo=kopf.Memo(runtime=runtime))
    assert not gone.is_set()
    assert runtime.departed == {"uid-vllm": gone}


def test_departures_watch_every_policy_event() -> None:
    registry = kopf.get_default_registry()
    watching = [h for h in registry._watching.get_all_handlers() if h.fn is departures]
    assert len(watching) == 1
    handler = watching[0]
    assert handler.selector is not None
    assert handler.selector.check(POLICIES)
    assert not any(handler.selector.check(resource) for resource in OTHERS)
    assert (handler.labels, handler.annotations, handler.when) == (None, None, None)
