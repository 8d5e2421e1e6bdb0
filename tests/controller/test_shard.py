"""Shards (``cachescale run --policy-selector``): which watch carries the selector, and
the daemon filter that stops a policy's loop once it leaves the shard.

The API server's side (the filtered list and watch, the deletion sent when a policy is
relabelled out) needs a real API server: e2e/test_operator_shards.py.
"""

from __future__ import annotations

import argparse

import kopf
import pytest

from cachescale.api.label_selector import LabelSelector
from cachescale.api.policy import GROUP, PLURAL, VERSION
from cachescale.controller import command
from cachescale.controller.evaluation import Operator
from cachescale.controller.handlers import Runtime, in_shard, policy_loop
from cachescale.controller.serve import shard_settings
from tests.controller.cluster import FakeCluster

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


@pytest.fixture
def runtime(cluster: FakeCluster) -> Runtime:
    return Runtime(Operator(cluster.api), shard=LabelSelector.parse("team=search"))


def test_the_loop_runs_only_while_the_policy_matches(runtime: Runtime) -> None:
    memo = kopf.Memo(runtime=runtime)
    assert in_shard(labels={"team": "search", "x": "y"}, memo=memo)
    assert not in_shard(labels={"team": "ads"}, memo=memo)  # relabelled away
    assert not in_shard(labels={}, memo=memo)
    runtime.shard = None
    assert in_shard(labels={}, memo=memo)


def test_the_policy_loop_is_filtered_by_the_shard() -> None:
    registry = kopf.get_default_registry()
    loops = [h for h in registry._spawning.get_all_handlers() if h.fn is policy_loop]
    assert [handler.when for handler in loops] == [in_shard]
