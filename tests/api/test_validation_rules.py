"""Every validation rule, on both sides of its boundary, in pydantic and in the CRD.

Each case edits one valid policy. The same verdict is expected from the pydantic models
(what `cachescale validate` and the operator use) and from the generated CRD as the API
server would apply it (schema + CEL rules, see crd_emulation.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cachescale.api.crd import build_crd
from cachescale.api.policy import CacheScalingPolicy
from cachescale.api.validation import problems_in_document
from tests.api.crd_emulation import crd_errors

SHAPE = {"layers": 32, "kvHeads": 8, "headDim": 128, "weightsGiB": 16}
GPU = {"memoryGiB": 80}
RAG = {"namespace": "rag", "kind": "Deployment", "labelSelector": "app=rag-api"}


def base_policy() -> dict[str, Any]:
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": "p", "namespace": "llm"},
        "spec": {
            "target": {"deploymentName": "llama", "hpaName": "llama"},
            "metrics": {"prometheusUrl": "http://prometheus:9090"},
            "slo": {"ttftP95Seconds": 1.0},
            "budget": {"gpuSecondsPer1kRequests": 900, "minReplicas": 2, "maxReplicas": 4},
        },
    }


def edited(edits: dict[str, Any]) -> dict[str, Any]:
    policy = base_policy()
    for dotted, value in edits.items():
        node = policy["spec"]
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return policy


# (id, edits, valid, field named in the error)
CASES: list[tuple[str, dict[str, Any], bool, str]] = [
    ("replicas-min-equals-max", {"budget.minReplicas": 4}, True, ""),
    ("replicas-min-above-max", {"budget.minReplicas": 5}, False, "minReplicas"),
    ("replicas-min-one", {"budget.minReplicas": 1}, True, ""),
    ("replicas-min-zero", {"budget.minReplicas": 0}, False, "minReplicas"),
    ("budget-tiny-positive", {"budget.gpuSecondsPer1kRequests": 0.001}, True, ""),
    ("budget-zero", {"budget.gpuSecondsPer1kRequests": 0}, False, "gpuSecondsPer1kRequests"),
    ("budget-negative", {"budget.gpuSecondsPer1kRequests": -5}, False, "gpuSecondsPer1kRequests"),
    ("seqs-min-equals-max", {"batching.minNumSeqs": 32, "batching.maxNumSeqs": 32}, True, ""),
    (
        "seqs-min-above-max",
        {"batching.minNumSeqs": 33, "batching.maxNumSeqs": 32},
        False,
        "minNumSeqs",
    ),
    (
        "managed-with-shape",
        {"batching.manageMaxNumSeqs": True, "batching.model": SHAPE, "batching.gpu": GPU},
        True,
        "",
    ),
    (
        "managed-without-gpu",
        {"batching.manageMaxNumSeqs": True, "batching.model": SHAPE},
        False,
        "manageMaxNumSeqs",
    ),
    ("gpu-util-one", {"batching.gpu": {"memoryGiB": 80, "gpuMemoryUtilization": 1}}, True, ""),
    (
        "gpu-util-above-one",
        {"batching.gpu": {"memoryGiB": 80, "gpuMemoryUtilization": 1.01}},
        False,
        "gpuMemoryUtilization",
    ),
    (
        "gpu-util-zero",
        {"batching.gpu": {"memoryGiB": 80, "gpuMemoryUtilization": 0}},
        False,
        "gpuMemoryUtilization",
    ),
    ("window-one-minute", {"metrics.window": "1m"}, True, ""),
    ("window-compound", {"metrics.window": "1h30m"}, True, ""),
    ("window-59s", {"metrics.window": "59s"}, False, "window"),
    ("window-zero", {"metrics.window": "0s"}, False, "window"),
    ("window-words", {"metrics.window": "5 minutes"}, False, "window"),
    ("window-empty", {"metrics.window": ""}, False, "window"),
    ("interval-10s", {"metrics.interval": "10s"}, True, ""),
    ("interval-9s", {"metrics.interval": "9s"}, False, "interval"),
    ("interval-equals-window", {"metrics.interval": "5m", "metrics.window": "5m"}, True, ""),
    (
        "interval-above-window",
        {"metrics.interval": "6m", "metrics.window": "5m"},
        False,
        "interval",
    ),
    # A rule that reads a field the policy left out reads its default (the CRD stores none).
    ("interval-above-default-window", {"metrics.interval": "6m"}, False, "interval"),
    ("window-below-default-interval", {"metrics.window": "1m"}, True, ""),
    ("window-too-many-default-intervals", {"metrics.window": "3h1m"}, False, "window"),
    ("window-360-default-intervals", {"metrics.window": "3h"}, True, ""),
    ("interval-alone-10s", {"metrics.interval": "10s"}, True, ""),
    ("seqs-min-above-default-max", {"batching.minNumSeqs": 257}, False, "minNumSeqs"),
    ("seqs-min-at-default-max", {"batching.minNumSeqs": 256}, True, ""),
    ("seqs-max-below-default-min", {"batching.maxNumSeqs": 7}, False, "minNumSeqs"),
    (
        "replicas-max-above-default-min",
        {"budget.maxReplicas": 1, "budget.minReplicas": None},
        True,
        "",
    ),
    (
        "weights-over-default-utilization",
        {"batching.model": {**SHAPE, "weightsGiB": 72.5}, "batching.gpu": GPU},
        False,
        "weightsGiB",
    ),
    (
        "weights-under-default-utilization",
        {"batching.model": {**SHAPE, "weightsGiB": 71.5}, "batching.gpu": GPU},
        True,
        "",
    ),
    ("url-without-scheme", {"metrics.prometheusUrl": "prometheus:9090"}, False, "prometheusUrl"),
    ("url-https", {"metrics.prometheusUrl": "https://prom.example:9090/"}, True, ""),
    ("url-path", {"metrics.prometheusUrl": "http://vm:8481/select/0/prometheus"}, True, ""),
    ("url-ipv6", {"metrics.prometheusUrl": "http://[fd00::1]:9090"}, True, ""),
    *(
        (f"url-{what}", {"metrics.prometheusUrl": url}, False, "prometheusUrl")
        for what, url in [
            ("backslash-userinfo", "http://127.0.0.1:18080\\@prom.monitoring:9090"),
            ("userinfo", "http://user:pw@prom:9090"),
            ("at-in-path", "http://prom:9090/@evil"),
            ("backslash", "http://prom\\evil:9090"),
            ("space", "http://prom :9090"),
            ("tab", "http://prom:9090/\tx"),
            ("newline", "http://prom:9090\n"),
            ("control", "http://prom\x00:9090"),
            ("query", "http://prom:9090/?x=1"),
            ("fragment", "http://prom:9090#x"),
            ("percent-host", "http://127.0.0.1%2f:9090"),
            ("unicode-host", "http://prom\uff0eevil:9090"),
            ("ftp", "ftp://prom:9090"),
            ("upper-scheme", "HTTP://prom:9090"),
            ("2049", "http://" + "a" * 2042),
        ]
    ),
    ("url-2048", {"metrics.prometheusUrl": "http://" + "a" * 2041}, True, ""),
    ("selector-16", {"metrics.selector": {f"l{i}": "v" for i in range(16)}}, True, ""),
    ("selector-17", {"metrics.selector": {f"l{i}": "v" for i in range(17)}}, False, "selector"),
    ("selector-key-63", {"metrics.selector": {"k" * 63: "v"}}, True, ""),
    ("selector-key-64", {"metrics.selector": {"k" * 64: "v"}}, False, "selector"),
    ("selector-value-253", {"metrics.selector": {"pod": "v" * 253}}, True, ""),
    ("selector-value-254", {"metrics.selector": {"pod": "v" * 254}}, False, "selector"),
    ("selector-value-60k", {"metrics.selector": {"pod": "v" * 60_000}}, False, "selector"),
    ("demand-query-2048", {"metrics.demandQuery": "x" * 2048}, True, ""),
    ("demand-query-2049", {"metrics.demandQuery": "x" * 2049}, False, "demandQuery"),
    ("selector-label", {"metrics.selector": {"model_name": "x", "namespace": "llm"}}, True, ""),
    ("selector-dash", {"metrics.selector": {"model-name": "x"}}, False, "selector"),
    ("selector-digit", {"metrics.selector": {"9pod": "x"}}, False, "selector"),
    ("selector-empty-value", {"metrics.selector": {"namespace": ""}}, False, "selector"),
    ("selector-one-empty", {"metrics.selector": {"a": "x", "namespace": ""}}, False, "selector"),
    ("selector-blank-value", {"metrics.selector": {"namespace": " "}}, True, ""),
    ("selector-empty-defaults", {"metrics.selector": {}}, True, ""),
    ("ttft-p95-tiny", {"slo.ttftP95Seconds": 0.001}, True, ""),
    ("ttft-p95-zero", {"slo.ttftP95Seconds": 0}, False, "ttftP95Seconds"),
    ("ttft-p99-equals-p95", {"slo.ttftP99Seconds": 1.0}, True, ""),
    ("ttft-p99-below-p95", {"slo.ttftP99Seconds": 0.9}, False, "ttftP99Seconds"),
    ("mode-enforce", {"mode": "Enforce"}, True, ""),
    ("mode-lowercase", {"mode": "enforce"}, False, "mode"),
    ("engine-sglang", {"target.engine": "sglang"}, True, ""),
    ("engine-unknown", {"target.engine": "tgi"}, False, "engine"),
    ("deployment-uppercase", {"target.deploymentName": "Llama"}, False, "deploymentName"),
    (
        "target-scaled-object",
        {"target.hpaName": None, "target.scaledObjectName": "llama"},
        True,
        "",
    ),
    ("target-both-autoscalers", {"target.scaledObjectName": "llama"}, False, "scaledObjectName"),
    ("target-no-autoscaler", {"target.hpaName": None}, False, "scaledObjectName"),
    (
        "target-scaled-object-uppercase",
        {"target.hpaName": None, "target.scaledObjectName": "Llama"},
        False,
        "scaledObjectName",
    ),
    # scaledObjectName is a DNS subdomain like hpaName: bounded, lower case, no blanks.
    (
        "target-scaled-object-dotted",
        {"target.hpaName": None, "target.scaledObjectName": "llama.keda-1"},
        True,
        "",
    ),
    (
        "target-scaled-object-253",
        {"target.hpaName": None, "target.scaledObjectName": "a" * 253},
        True,
        "",
    ),
    (
        "target-scaled-object-254",
        {"target.hpaName": None, "target.scaledObjectName": "a" * 254},
        False,
        "scaledObjectName",
    ),
    (
        "target-scaled-object-70k",
        {"target.hpaName": None, "target.scaledObjectName": "a" * 70_000},
        False,
        "scaledObjectName",
    ),
    *(
        (
            f"target-scaled-object-{what}",
            {"target.hpaName": None, "target.scaledObjectName": name},
            False,
            "scaledObjectName",
        )
        for what, name in [
            ("empty", ""),
            ("underscore", "llama_keda"),
            ("trailing-dash", "llama-"),
            ("leading-dot", ".llama"),
            ("blank", "llama keda"),
            ("slash", "keda/llama"),
            ("unicode", "llamá"),
            # Go's `$` is the end of the text: no newline slips in after the name.
            ("trailing-newline", "llama\n"),
        ]
    ),
    (
        "target-scaled-object-number",
        {"target.hpaName": None, "target.scaledObjectName": 5},
        False,
        "scaledObjectName",
    ),
    # Both or neither, whatever the other name holds: the one-of rule still names both.
    (
        "target-both-with-a-bad-name",
        {"target.scaledObjectName": "Llama"},
        False,
        "scaledObjectName",
    ),
    (
        "target-both-empty-hpa",
        {"target.hpaName": "", "target.scaledObjectName": "llama"},
        False,
        "hpaName",
    ),
    ("drop-just-below-one", {"cache.collapseRelativeDrop": 0.99}, True, ""),
    ("drop-one", {"cache.collapseRelativeDrop": 1}, False, "collapseRelativeDrop"),
    ("drop-zero", {"cache.collapseRelativeDrop": 0}, False, "collapseRelativeDrop"),
    ("absolute-drop-zero", {"cache.collapseAbsoluteDrop": 0}, False, "collapseAbsoluteDrop"),
    ("windows-one", {"cache.collapseWindows": 1}, True, ""),
    ("windows-zero", {"cache.collapseWindows": 0}, False, "collapseWindows"),
    ("warmup-zero", {"cache.podWarmupSeconds": 0}, True, ""),
    ("warmup-negative", {"cache.podWarmupSeconds": -1}, False, "podWarmupSeconds"),
    ("on-collapse-cap", {"cache.onCollapse": "CapAtBudget"}, True, ""),
    ("on-collapse-unknown", {"cache.onCollapse": "Panic"}, False, "onCollapse"),
    ("cooldown-words", {"batching.cooldown": "half an hour"}, False, "cooldown"),
    # Strict types: the API server never turns a string into a number, or a number into a bool.
    ("replicas-quoted", {"budget.maxReplicas": "20"}, False, "maxReplicas"),
    ("budget-quoted", {"budget.gpuSecondsPer1kRequests": "900"}, False, "gpuSecondsPer1kRequests"),
    ("ttft-quoted", {"slo.ttftP95Seconds": "1.5"}, False, "ttftP95Seconds"),
    ("budget-integer-is-a-number", {"budget.gpuSecondsPer1kRequests": 900}, True, ""),
    ("restore-as-word", {"restoreOnDelete": "yes"}, False, "restoreOnDelete"),
    ("manage-as-one", {"batching.manageMaxNumSeqs": 1}, False, "manageMaxNumSeqs"),
    ("selector-number-value", {"metrics.selector": {"namespace": 5}}, False, "selector"),
    # Finite, bounded numbers (an infinite budget is above every maximum).
    ("budget-infinite", {"budget.gpuSecondsPer1kRequests": float("inf")}, False, "gpuSeconds"),
    ("budget-at-maximum", {"budget.gpuSecondsPer1kRequests": 10_000_000}, True, ""),
    ("budget-above-maximum", {"budget.gpuSecondsPer1kRequests": 1e8}, False, "gpuSeconds"),
    (
        "memory-above-maximum",
        {"batching.gpu": {"memoryGiB": 20_000}},
        False,
        "memoryGiB",
    ),
    ("reserve-infinite", {"batching.cacheReserveGiB": float("inf")}, False, "cacheReserveGiB"),
    # Physical sanity: the weights fit in the engine's share of the GPU.
    (
        "weights-fit",
        {"batching.model": {**SHAPE, "weightsGiB": 71.5}, "batching.gpu": GPU},
        True,
        "",
    ),
    (
        "weights-above-share",
        {"batching.model": {**SHAPE, "weightsGiB": 72.5}, "batching.gpu": GPU},
        False,
        "weightsGiB",
    ),
    (
        "weights-500-on-80",
        {"batching.model": {**SHAPE, "weightsGiB": 500}, "batching.gpu": GPU},
        False,
        "weightsGiB",
    ),
    (
        "weights-fit-at-full-utilisation",
        {
            "batching.model": {**SHAPE, "weightsGiB": 75},
            "batching.gpu": {"memoryGiB": 80, "gpuMemoryUtilization": 1},
        },
        True,
        "",
    ),
    # Bounded durations.
    ("window-a-day", {"metrics.window": "24h", "metrics.interval": "4m"}, True, ""),
    ("window-360-intervals", {"metrics.window": "1h", "metrics.interval": "10s"}, True, ""),
    (
        "window-361-intervals",
        {"metrics.window": "1h10s", "metrics.interval": "10s"},
        False,
        "window",
    ),
    ("window-over-a-day", {"metrics.window": "24h1s"}, False, "window"),
    ("window-past-go-range", {"metrics.window": "99999999999h"}, False, "window"),
    ("cooldown-a-week", {"batching.cooldown": "168h"}, True, ""),
    ("cooldown-over-a-week", {"batching.cooldown": "169h"}, False, "cooldown"),
    ("cooldown-past-go-range", {"batching.cooldown": "9999999h"}, False, "cooldown"),
    ("prompt-source", {"cache.promptSources": [RAG]}, True, ""),
    ("prompt-source-secret", {"cache.promptSources": [{**RAG, "kind": "Secret"}]}, True, ""),
    ("prompt-source-kind", {"cache.promptSources": [{**RAG, "kind": "Pod"}]}, False, "kind"),
    (
        "prompt-source-no-selector",
        {"cache.promptSources": [{"namespace": "rag", "kind": "Deployment"}]},
        False,
        "labelSelector",
    ),
    (
        "prompt-source-empty-selector",
        {"cache.promptSources": [{**RAG, "labelSelector": ""}]},
        False,
        "labelSelector",
    ),
    (
        "prompt-source-namespace",
        {"cache.promptSources": [{**RAG, "namespace": "Rag_Ns"}]},
        False,
        "namespace",
    ),
    ("prompt-sources-16", {"cache.promptSources": [RAG] * 16}, True, ""),
    ("prompt-sources-17", {"cache.promptSources": [RAG] * 17}, False, "promptSources"),
    ("prompt-sources-1000", {"cache.promptSources": [RAG] * 1000}, False, "promptSources"),
    ("prompt-sources-empty", {"cache.promptSources": []}, True, ""),
    # The shapes around an item: a list of objects, each with exactly its three fields.
    ("prompt-sources-object", {"cache.promptSources": RAG}, False, "promptSources"),
    ("prompt-sources-string", {"cache.promptSources": "app=rag-api"}, False, "promptSources"),
    ("prompt-source-string", {"cache.promptSources": ["app=rag-api"]}, False, "promptSources"),
    ("prompt-source-number", {"cache.promptSources": [5]}, False, "promptSources"),
    ("prompt-source-nested", {"cache.promptSources": [[RAG]]}, False, "promptSources"),
    # A null item is not pruned as a null field is: it is an item of the wrong type.
    ("prompt-source-null", {"cache.promptSources": [None]}, False, "promptSources"),
    ("prompt-source-empty-object", {"cache.promptSources": [{}]}, False, "namespace"),
    *(
        (f"prompt-source-without-{key}", {"cache.promptSources": [item]}, False, key)
        for key in ("namespace", "kind")
        for item in [{k: v for k, v in RAG.items() if k != key}]
    ),
    ("prompt-source-configmap", {"cache.promptSources": [{**RAG, "kind": "ConfigMap"}]}, True, ""),
    *(
        (
            f"prompt-source-kind-{what}",
            {"cache.promptSources": [{**RAG, "kind": kind}]},
            False,
            "kind",
        )
        for what, kind in [
            ("lowercase", "deployment"),
            ("plural", "Deployments"),
            ("padded", " Secret"),
            ("empty", ""),
            ("group", "apps/v1/Deployment"),
            ("number", 1),
        ]
    ),
    *(
        (
            f"prompt-source-namespace-{what}",
            {"cache.promptSources": [{**RAG, "namespace": ns}]},
            valid,
            "namespace",
        )
        for what, ns, valid in [
            ("63", "n" * 63, True),
            ("64", "n" * 64, False),
            ("70k", "n" * 70_000, False),
            ("empty", "", False),
            ("dotted", "rag.prod", False),
            ("newline", "rag\nprod", False),
            ("trailing-newline", "rag\n", False),
            ("number", 7, False),
        ]
    ),
    (
        "prompt-source-selector-256",
        {"cache.promptSources": [{**RAG, "labelSelector": "a=b," * 63 + "a=bb"}]},
        True,
        "",
    ),
    (
        "prompt-source-selector-257",
        {"cache.promptSources": [{**RAG, "labelSelector": "a=b," * 63 + "a=bbb"}]},
        False,
        "labelSelector",
    ),
    (
        "prompt-source-selector-70k",
        {"cache.promptSources": [{**RAG, "labelSelector": "a=" + "b" * 70_000}]},
        False,
        "labelSelector",
    ),
    (
        "prompt-source-selector-number",
        {"cache.promptSources": [{**RAG, "labelSelector": 5}]},
        False,
        "labelSelector",
    ),
    (
        "prompt-source-selector-list",
        {"cache.promptSources": [{**RAG, "labelSelector": ["app=rag-api"]}]},
        False,
        "labelSelector",
    ),
    # A bad item anywhere in the list is named, not only the first.
    (
        "prompt-source-last-bad",
        {"cache.promptSources": [RAG] * 15 + [{**RAG, "kind": "Pod"}]},
        False,
        "kind",
    ),
]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.mark.parametrize(
    ("edits", "valid", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_pydantic_verdict(edits: dict[str, Any], valid: bool, field: str) -> None:
    problems = problems_in_document(edited(edits), 1)
    assert (not problems) == valid, problems
    if not valid:
        assert any(field in p.path or field in p.message for p in problems), problems


@pytest.mark.parametrize(
    ("edits", "valid", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_crd_verdict_matches(
    crd: dict[str, Any], edits: dict[str, Any], valid: bool, field: str
) -> None:
    errors = crd_errors(crd, edited(edits))
    assert (not errors) == valid, errors
    if not valid:
        assert any(field in error for error in errors), errors


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_numbers_must_be_finite(value: float) -> None:
    # Not in CASES: JSON cannot carry NaN, so the API server never sees one.
    problems = problems_in_document(edited({"slo.ttftP95Seconds": value}), 1)
    assert [p.path for p in problems] == ["spec.slo.ttftP95Seconds"], problems


def test_a_malformed_prompt_source_selector_is_named() -> None:
    # Not in CASES: the selector's grammar is the operator's check (the CRD bounds its
    # length only), so a malformed one shows as InvalidSpec, not at kubectl apply.
    policy = edited({"cache.promptSources": [{**RAG, "labelSelector": "app in (a"}]})
    (problem,) = problems_in_document(policy, 1)
    assert problem.path == "spec.cache.promptSources[0].labelSelector", problem
    assert "is not a label selector" in problem.message


def test_unknown_field_rejected_by_pydantic() -> None:
    policy = edited({"slo.ttftP95": 1})
    problems = problems_in_document(policy, 1)
    assert any(p.path == "spec.slo.ttftP95" and "unknown field" in p.message for p in problems)


def test_defaults_a_user_can_live_with() -> None:
    policy = base_policy()
    del policy["spec"]["budget"]["minReplicas"]
    assert problems_in_document(policy, 1) == []
    from cachescale.api.policy import CacheScalingPolicy

    spec = CacheScalingPolicy.model_validate(policy).spec
    assert spec.mode == "Advise"
    assert spec.budget.min_replicas == 1
    assert spec.metrics.window_seconds == 300
    assert spec.metrics.interval_seconds == 30
    assert spec.batching.manage_max_num_seqs is False
    assert spec.batching.cooldown_seconds == 1800
    assert spec.cache.on_collapse == "Hold"


def test_crd_stores_only_the_mode_default(crd: dict[str, Any]) -> None:
    """What a policy leaves out stays out of the stored object (so ``kubectl describe``
    shows what its author wrote) but ``mode``; pydantic fills in the rest, the same."""
    from tests.api.crd_emulation import _apply_defaults

    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    defaulted = _apply_defaults(copy.deepcopy(base_policy()), schema)
    assert defaulted["spec"] == {**base_policy()["spec"], "mode": "Advise"}
    spec = CacheScalingPolicy.model_validate(base_policy()).spec
    assert (spec.mode, spec.cache.collapse_windows) == ("Advise", 3)
    assert (spec.batching.cooldown, spec.metrics.window) == ("30m", "5m")


def test_an_empty_or_absent_selector_reads_the_policy_namespace() -> None:
    empty: dict[str, Any] = {"metrics.selector": {}}
    for edits in (empty, {}):
        spec = CacheScalingPolicy.model_validate(edited(edits)).spec
        assert spec.metrics.selector_in("llm") == {"namespace": "llm"}
    given = {"metrics.selector": {"model_name": "x"}}
    spec = CacheScalingPolicy.model_validate(edited(given)).spec
    assert spec.metrics.selector_in("llm") == {"model_name": "x"}
