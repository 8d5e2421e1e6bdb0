"""`cachescale groups` shows the operator's grouping and queries, offline and exactly.

Each case writes policy files the way a user would and reads what the command prints:
which policies share a group (the operator's ``plan``), why one reads alone, and the
PromQL the group sends, compared with what the gatherer's own functions build. One case
holds the command's notion of "one Prometheus" to the scheduler's (``gather_group``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cachescale.api.spec import Engine
from cachescale.commands.groups import Policy, policies_in, source_of
from cachescale.commands.main import main
from cachescale.exit_codes import ExitCode
from cachescale.gather.detection import detection_query
from cachescale.gather.promql import build_queries
from cachescale.gather.selector import QueryScope, Selector
from cachescale.snapshot import MetricsGeneration
from tests.import_probe import OPERATOR_EXTRA, heavy_modules_imported

PROM = "http://prometheus.monitoring:9090"


def policy(
    name: str,
    namespace: str | None = "llm",
    *,
    selector: dict[str, str] | None = None,
    url: str | None = PROM,
    window: str = "5m",
    engine: str | None = None,
    auth: dict[str, Any] | None = None,
    demand: str | None = None,
) -> dict[str, Any]:
    metrics: dict[str, Any] = {"window": window}
    if url is not None:
        metrics["prometheusUrl"] = url
    if selector is not None:
        metrics["selector"] = selector
    if auth is not None:
        metrics["auth"] = auth
    if demand is not None:
        metrics["demandQuery"] = demand
    target: dict[str, Any] = {"deploymentName": name, "containerName": "vllm", "hpaName": name}
    if engine is not None:
        target["engine"] = engine
    metadata = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": metadata,
        "spec": {
            "target": target,
            "metrics": metrics,
            "slo": {"ttftP95Seconds": 1.0},
            "budget": {"gpuSecondsPer1kRequests": 900, "minReplicas": 1, "maxReplicas": 8},
        },
    }


def write(tmp_path: Path, *documents: dict[str, Any], name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
    return path


def groups_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict[str, Any]:
    status = main(["groups", "--json", *(str(arg) for arg in args)])
    captured = capsys.readouterr()
    assert status == ExitCode.OK, captured.err
    found: dict[str, Any] = json.loads(captured.out)
    return found


def members(group: dict[str, Any]) -> list[str]:
    return [member["policy"] for member in group["members"]]


def model(name: str) -> dict[str, str]:
    return {"namespace": "llm", "model_name": name}


def test_groupable_policies_share_one_query_per_signal_carrying_all_their_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        policy("chat", selector=model("llama-3-8b")),
        policy("code", selector=model("qwen.coder")),
        policy("docs", selector=model("mistral-7b")),
    )
    (group,) = groups_json(capsys, path)["groups"]
    assert group["shared"] is True
    assert group["reason"].startswith("shared: 3 selectors")
    assert members(group) == ["llm/chat", "llm/code", "llm/docs"]
    assert group["prometheus_url"] == PROM
    assert group["window_seconds"] == 300
    assert group["label_sets"] == [["model_name", "namespace"]]
    (batch,) = group["batches"]
    assert (batch["engine"], batch["profile"]) == ("vllm", MetricsGeneration.VLLM_0_13.value)
    selectors = [Selector.of(model(m)) for m in ("llama-3-8b", "qwen.coder", "mistral-7b")]
    scope = QueryScope.shared(selectors)
    expected = build_queries(MetricsGeneration.VLLM_0_13, scope, 300)
    assert batch["queries"] == {key.value: query.promql for key, query in expected.items()}
    assert batch["detection"] == detection_query(Engine.VLLM, scope)
    for promql in [batch["detection"], *batch["queries"].values()]:
        assert 'model_name=~"llama-3-8b|mistral-7b|qwen\\\\.coder"' in promql


def test_a_pod_selector_and_a_unique_label_set_read_alone_and_say_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        policy("chat", selector=model("chat")),
        policy("code", selector=model("code")),
        policy("canary", selector={"namespace": "llm", "pod": "canary-0"}),
        policy("canary-1", selector={"namespace": "llm", "pod": "canary-1"}),
        policy("pinned", selector={"namespace": "llm", "app": "pinned"}),
        policy("lora", selector={**model("lora"), "adapter": "sql"}),
    )
    shared, canary, canary_1, pinned = groups_json(capsys, path)["groups"]
    # Another label set on the same model labels shares, and is checked member by member.
    assert members(shared) == ["llm/chat", "llm/code", "llm/lora"]
    assert shared["label_sets"] == [
        ["model_name", "namespace"],
        ["adapter", "model_name", "namespace"],
    ]
    assert shared["reason"].startswith("shared: 3 selectors on 2 label sets")
    (batch,) = shared["batches"]
    assert batch["queries"]["series_labels"].startswith("count by (adapter, model_name, namespace)")
    assert members(canary_1) == ["llm/canary-1"]  # same label names, still alone
    assert canary_1["reason"] == canary["reason"]
    assert shared["shared"]
    assert members(canary) == ["llm/canary"]
    assert not canary["shared"]
    assert canary["reason"].startswith("reads alone: its selector is on pod")
    assert members(pinned) == ["llm/pinned"]
    assert not pinned["shared"]
    assert pinned["reason"].startswith("reads alone: no other policy")
    (batch,) = canary["batches"]  # its own exact matchers, as gather_signals sends
    exact = QueryScope.for_selector(Selector.of({"namespace": "llm", "pod": "canary-0"}))
    expected = build_queries(MetricsGeneration.VLLM_0_13, exact, 300)
    assert batch["queries"] == {key.value: query.promql for key, query in expected.items()}


@pytest.mark.parametrize(
    ("second", "differs"),
    [
        ({"window": "10m"}, "window_seconds"),
        ({"url": "http://other-prometheus:9090"}, "prometheus_url"),
        ({"auth": {"bearerTokenSecretRef": {"name": "reader", "key": "token"}}}, "auth"),
    ],
)
def test_another_window_url_or_credentials_is_another_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], second: dict[str, Any], differs: str
) -> None:
    path = write(
        tmp_path,
        policy("chat", selector=model("chat")),
        policy("code", selector=model("code"), **second),
    )
    one, two = groups_json(capsys, path)["groups"]
    assert (members(one), members(two)) == (["llm/chat"], ["llm/code"])
    assert one[differs] != two[differs]
    assert not one["shared"]
    assert not two["shared"]


def test_engines_of_one_group_get_one_batch_each_and_the_default_selector_is_the_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        policy("a", "team-a"),
        policy("b", "team-b", engine="sglang"),
        policy("c", "team-c", engine="vllm"),
    )
    (group,) = groups_json(capsys, path)["groups"]
    assert [m["selector"] for m in group["members"]] == [
        '{namespace="team-a"}',
        '{namespace="team-b"}',
        '{namespace="team-c"}',
    ]
    vllm, sglang = group["batches"]
    assert (vllm["profile"], sglang["profile"]) == ("vllm>=0.13", "sglang>=0.5.20")
    assert 'namespace=~"team-a|team-c"' in vllm["queries"]["hits_local"]
    assert 'namespace="team-b"' in sglang["queries"]["hits_local"]


def test_credentials_are_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    auth = {"bearerTokenSecretRef": {"name": "reader", "key": "token"}}
    refused = write(
        tmp_path,
        policy("chat", url="https://user:s3cret@prom.example:9090/api?k=v", auth=auth),
    )
    assert main(["groups", str(refused)]) == ExitCode.INVALID  # user info is not a URL here
    said = capsys.readouterr()
    assert "prometheusUrl" in said.out + said.err
    assert "s3cret" not in said.out + said.err
    path = write(tmp_path, policy("chat", url="https://prom.example:9090/api", auth=auth))
    assert main(["groups", str(path)]) == ExitCode.OK
    text = capsys.readouterr().out
    (group,) = groups_json(capsys, path)["groups"]
    assert group["prometheus_url"] == "https://prom.example:9090/api"
    assert "bearer token from Secret reader key token" in text
    assert "reader" in json.dumps(group)


def test_a_selector_the_operator_cannot_read_is_reported_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        policy("chat", selector=model("chat")),
        policy("odd", selector={"le": "1"}),  # valid for the API, refused by Selector.of
    )
    explained = groups_json(capsys, path)
    assert [members(group) for group in explained["groups"]] == [["llm/chat"]]
    (odd,) = explained["not_read"]
    assert odd["policy"] == "llm/odd"
    assert odd["reason"].startswith("its selector cannot be read: label 'le' is reserved")
    assert main(["groups", str(path)]) == ExitCode.OK
    assert "not read: llm/odd: its selector cannot be read" in capsys.readouterr().out


def test_demand_queries_are_listed_as_sent_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demand = 'sum(rate(nginx_ingress_controller_requests{ingress="chat"}[5m]))'
    path = write(
        tmp_path,
        policy("chat", selector=model("chat"), demand=demand),
        policy("code", selector=model("code")),
    )
    (group,) = groups_json(capsys, path)["groups"]
    assert group["demand_queries"] == [{"policy": "llm/chat", "promql": demand}]


def test_invalid_files_exit_1_with_validates_lines_and_print_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = policy("chat", selector=model("chat"))
    broken["spec"]["metrics"]["window"] = "10s"
    path = write(tmp_path, broken)
    assert main(["validate", str(path)]) == ExitCode.INVALID
    validated = capsys.readouterr().err
    assert "spec.metrics.window" in validated
    for args in (["groups", str(path)], ["groups", "--json", str(path)]):
        assert main(args) == ExitCode.INVALID
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", validated)
    assert main(["groups", str(tmp_path / "missing.yaml")]) == ExitCode.INVALID
    assert "missing.yaml: cannot read" in capsys.readouterr().err


def test_a_bad_default_url_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, policy("chat"))
    with pytest.raises(SystemExit) as exit_:
        main(["groups", "--default-prometheus-url", "prometheus:9090", str(path)])
    assert exit_.value.code == ExitCode.USAGE
    assert "--default-prometheus-url" in capsys.readouterr().err


def test_the_json_is_stable_and_follows_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = write(tmp_path, policy("chat", selector=model("chat")), name="a.yaml")
    second = write(
        tmp_path,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
        # No namespace: "default" is assumed, and the policy reads only that namespace.
        policy("code", None, selector={"model_name": "code"}, url=None),
        name="b.yaml",
    )
    once = groups_json(capsys, first, second, "--default-prometheus-url", PROM)
    again = groups_json(capsys, first, second, "--default-prometheus-url", PROM)
    assert once == again
    assert list(once) == ["groups", "not_read", "max_group_size"]
    (group,) = once["groups"]
    assert list(group) == [
        "group",
        "shared",
        "reason",
        "prometheus_url",
        "auth",
        "window_seconds",
        "label_sets",
        "members",
        "batches",
        "demand_queries",
    ]
    assert group["members"] == [
        {
            "policy": "llm/chat",
            "file": str(first),
            "document": 1,
            "selector": '{model_name="chat",namespace="llm"}',
            "engine": "vllm",
        },
        {
            "policy": "default/code",
            "file": str(second),
            "document": 2,
            "namespace_assumed": True,
            "selector": '{model_name="code",namespace="default"}',
            "engine": "vllm",
        },
    ]
    assert once["not_read"] == []
    # Without the default, the policy without a URL reads another Prometheus.
    split = groups_json(capsys, first, second)["groups"]
    assert [g["prometheus_url"] for g in split] == [PROM, None]


def test_one_prometheus_is_what_the_scheduler_batches_together(tmp_path: Path) -> None:
    """The command's Source (with the window) partitions policies as ``gather_group`` does."""
    handlers = pytest.importorskip("cachescale.controller.runtime.members")
    token = {"bearerTokenSecretRef": {"name": "reader", "key": "token"}}
    other = {"bearerTokenSecretRef": {"name": "reader", "key": "other"}}
    documents = [
        policy("a"),
        policy("b", window="300s"),
        policy("c", window="10m"),
        policy("d", url=None),
        policy("e", url="http://other:9090"),
        policy("f", auth=token),
        policy("g", auth=token),
        policy("h", "elsewhere", auth=token),
        policy("i", auth=other),
        policy("j", auth={**token, "insecureSkipVerify": False}),
    ]
    found: list[Policy] = policies_in(tmp_path / "fleet.yaml", write_text(documents))

    def partition(key: Any) -> set[frozenset[str]]:
        classes: dict[Any, set[str]] = {}
        for one in found:
            classes.setdefault(key(one), set()).add(one.name)
        return {frozenset(names) for names in classes.values()}

    expected = {
        None: [{"a", "b"}, {"c"}, {"d"}, {"e"}, {"f", "g"}, {"h"}, {"i"}, {"j"}],
        PROM: [{"a", "b", "d"}, {"c"}, {"e"}, {"f", "g"}, {"h"}, {"i"}, {"j"}],
    }
    for default, classes in expected.items():
        ours = partition(
            lambda p, d=default: (source_of(p, d), p.policy.spec.metrics.window_seconds)
        )
        theirs = partition(lambda p, d=default: handlers.gather_group(p.body, d))
        assert ours == theirs
        assert ours == {frozenset(names) for names in classes}


def write_text(documents: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False)


def test_groups_runs_without_the_operator_extra() -> None:
    call = ["groups", "--json", "examples/policy-vllm.yaml", "examples/policy-prompt-sources.yaml"]
    assert heavy_modules_imported([call], OPERATOR_EXTRA) == []


def test_a_selector_naming_another_namespace_is_shown_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the operator refuses it (SelectorOutsideNamespace): in no group, and said why."""
    foreign = {"namespace": "tenant-b", "model_name": "chat"}
    path = write(tmp_path, policy("chat", selector=foreign))
    found = groups_json(capsys, path)
    assert found["groups"] == []
    (refused,) = found["not_read"]
    assert "names namespace 'tenant-b'" in refused["reason"]


def as_kubectl_gets_it(body: dict[str, Any], uid: str) -> dict[str, Any]:
    """``body`` as ``kubectl get csp -o yaml`` writes it: server fields and a status."""
    metadata = body["metadata"] | {
        "uid": uid,
        "resourceVersion": "4711",
        "generation": 1,
        "creationTimestamp": "2026-12-01T12:00:00Z",
    }
    return body | {"metadata": metadata, "status": {"observedGeneration": 1}}


def test_a_kubectl_list_is_read_item_by_item(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [
            as_kubectl_gets_it(policy("chat", selector=model("chat")), "u-1"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
            as_kubectl_gets_it(policy("code", "tools", selector={"model_name": "code"}), "u-2"),
        ],
    }
    path = write(tmp_path, policy("rag", selector=model("rag")), listed)
    (group,) = groups_json(capsys, path)["groups"]
    where = [(m["policy"], m["document"], m.get("item")) for m in group["members"]]
    assert where == [("llm/rag", 1, None), ("llm/chat", 2, 0), ("tools/code", 2, 2)]
    assert main(["groups", str(path)]) == ExitCode.OK
    captured = capsys.readouterr()
    assert captured.out.startswith("1 group for 3 policies")
    assert "v1/ConfigMap (items[1])" in captured.err  # validate's note, on stderr
