"""PromQL building: selectors cannot inject, queries read the right series per profile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cachescale.api.spec import Engine
from cachescale.gather.detection import detect_profile, detection_query
from cachescale.gather.prometheus import Series
from cachescale.gather.promql import QueryKey, build_queries, duration, label_query
from cachescale.gather.selector import (
    QueryScope,
    Selector,
    SelectorError,
    escape_label_value,
    split_by_selector,
)
from cachescale.snapshot import MetricsGeneration

# Go/PromQL double-quoted string: any run of non-quote, non-backslash chars or escapes.
_PROMQL_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_GO_UNESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n", "\\r": "\r", "\\t": "\t"}

INJECTIONS = [
    'llm"} or vector(1) or up{x="',
    "llm\\",
    'a\\"b',
    "line\nbreak",
    'x",__name__="up',
    "tab\tand\rreturn",
    "ünïcödé ✓",
]


def go_unquote(body: str) -> str:
    return re.sub(r"\\.", lambda m: _GO_UNESCAPES[m.group(0)], body)


@pytest.mark.parametrize("value", INJECTIONS)
def test_escaped_value_is_one_string_literal_that_reads_back_unchanged(value: str) -> None:
    literal = f'"{escape_label_value(value)}"'
    match = _PROMQL_STRING.fullmatch(literal)
    assert match is not None, literal
    assert go_unquote(match.group(1)) == value


@pytest.mark.parametrize("value", INJECTIONS)
def test_injection_attempt_stays_inside_its_matcher(value: str) -> None:
    selector = Selector.of({"namespace": "llm", "model_name": value})
    matchers = selector.matchers()
    literals = _PROMQL_STRING.findall(matchers)
    assert [go_unquote(body) for body in literals] == [value, "llm"]
    assert _PROMQL_STRING.sub('""', matchers) == 'model_name="",namespace=""'


@pytest.mark.parametrize(
    "name", ["__name__", "le", "1abc", "a-b", "a b", "", 'x"', "a=b", "__meta_pod"]
)
def test_label_names_that_could_change_the_query_are_rejected(name: str) -> None:
    with pytest.raises(SelectorError):
        Selector.of({name: "x"})


def test_selector_string_is_parsed_into_exact_matchers() -> None:
    selector = Selector.parse(' namespace="llm" , model_name="llama \\"3\\"\\n" ')
    assert selector.labels == (("model_name", 'llama "3"\n'), ("namespace", "llm"))
    assert Selector.parse('{namespace="llm"}') == Selector.of({"namespace": "llm"})


@pytest.mark.parametrize("text", ["", "  ", "{}", 'namespace=""', 'namespace="llm",pod=""'])
def test_an_empty_selector_or_an_empty_value_is_refused(text: str) -> None:
    # No matcher reads every engine; name="" also matches series that lack the label.
    with pytest.raises(SelectorError, match="empty"):
        Selector.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        'namespace=~"llm.*"',
        'namespace!="llm"',
        "namespace=llm",
        'namespace="llm" model_name="x"',
        'namespace="llm",namespace="other"',
        'namespace="unterminated',
        'namespace="bad\\x"',
        'namespace="llm"} or vector(1)',
        '__name__="up"',
        'cachescale_query="0"',  # the tag of a combined batch
    ],
)
def test_selector_string_accepts_only_name_equals_quoted_value(text: str) -> None:
    with pytest.raises(SelectorError):
        Selector.parse(text)


def test_selector_matches_result_labels_exactly() -> None:
    selector = Selector.of({"namespace": "llm", "model_name": "m"})
    assert selector.matches({"namespace": "llm", "model_name": "m", "pod": "a"})
    assert not selector.matches({"namespace": "llm", "model_name": "m2"})
    assert Selector((("tenant", ""),)).matches({"namespace": "llm"})  # absent equals ""


@pytest.mark.parametrize("profile", list(MetricsGeneration))
def test_every_query_uses_the_selector_and_groups_by_deployment(profile: MetricsGeneration) -> None:
    selector = Selector.of({"namespace": "llm", "model_name": "m"})
    queries = build_queries(
        profile, QueryScope.for_selector(selector), 300, kube_state_metrics=True
    )
    for key, query in queries.items():
        assert 'model_name="m",namespace="llm"' in query.promql, key
        outer = re.search(r"by \(([^)]*)\)", query.promql)
        assert outer is not None, key
        groups = outer.group(1).split(", ")
        assert groups[:2] == ["model_name", "namespace"], key
        assert ("pod" in groups) == key.name.startswith("POD_"), key


@pytest.mark.parametrize("profile", list(MetricsGeneration))
def test_counters_are_only_read_through_rate(profile: MetricsGeneration) -> None:
    queries = build_queries(profile, QueryScope.for_selector(Selector(())), 300)
    for query in queries.values():
        for counter in re.findall(
            r"[a-z_:]+_total\b|[a-z_:]+_(?:bucket|sum|count)\b", query.promql
        ):
            assert re.search(rf"rate\({re.escape(counter)}\b", query.promql), (counter, query)


def test_sglang_never_reads_the_last_batch_hit_rate_gauge() -> None:
    queries = build_queries(
        MetricsGeneration.SGLANG_0_5_20, QueryScope.for_selector(Selector(())), 60
    )
    text = "\n".join(q.promql for q in queries.values())
    assert "sglang:cache_hit_rate" not in text
    assert 'sglang:prefill_effective_tokens_total{mode=~"device_hit|host_hit"}' in text


def test_profiles_differ_where_vllm_changed() -> None:
    scope = QueryScope.for_selector(Selector(()))
    new = build_queries(MetricsGeneration.VLLM_0_13, scope, 300)
    old = build_queries(MetricsGeneration.VLLM_0_9_2, scope, 300)
    assert "vllm:request_prefill_kv_computed_tokens_sum" in new[QueryKey.PREFILL_COMPUTED].promql
    assert "vllm:prompt_tokens_total" in old[QueryKey.PREFILL_COMPUTED].promql
    assert QueryKey.COMPUTED_BUCKETS not in old
    assert "time_per_output_token_seconds_bucket" in old[QueryKey.ITL_BUCKETS].promql


def test_successful_requests_exclude_aborts_and_errors() -> None:
    queries = build_queries(MetricsGeneration.VLLM_0_13, QueryScope.for_selector(Selector(())), 300)
    assert 'finished_reason!~"abort|error"' in queries[QueryKey.REQUESTS].promql


def test_latency_histograms_are_read_per_scraped_bucket_not_fixed_bounds() -> None:
    queries = build_queries(MetricsGeneration.VLLM_0_13, QueryScope.for_selector(Selector(())), 300)
    for key in (QueryKey.TTFT_BUCKETS, QueryKey.ITL_BUCKETS):
        buckets = queries[key].promql
        assert buckets.startswith("sum by (model_name, namespace, le) (rate("), key
        assert "le=" not in buckets, key


@pytest.mark.parametrize(
    ("profile", "count"),
    [
        (MetricsGeneration.VLLM_0_13, 20),
        (MetricsGeneration.VLLM_0_9_2, 18),
        (MetricsGeneration.SGLANG_0_5_20, 17),
    ],
)
def test_a_batch_reads_each_histogram_once_and_asks_for_no_quantile(
    profile: MetricsGeneration, count: int
) -> None:
    # The quantiles are computed from the bucket rates (gather.signals), not asked of
    # Prometheus: one histogram_quantile per quantile cost 4 more of the batch's slowest
    # operands. kube-state-metrics adds pod ages, GPU-seconds and the pods holding GPUs.
    scope = QueryScope.for_selector(Selector(()))
    for ksm, queries in ((False, count), (True, count + 3)):
        batch = build_queries(profile, scope, 300, kube_state_metrics=ksm)
        assert len(batch) == queries, (profile, ksm)
        assert not [key for key, query in batch.items() if "histogram_quantile" in query.promql]


@pytest.mark.parametrize(("seconds", "text"), [(300, "300s"), (90.0, "90s"), (1.5, "1500ms")])
def test_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_shared_scope_matches_every_policy_with_escaped_regexes() -> None:
    selectors = [
        Selector.of({"namespace": "llm", "model_name": "a.b"}),
        Selector.of({"namespace": "llm", "model_name": 'q"x|y'}),
    ]
    scope = QueryScope.shared(selectors)
    assert scope.matchers == 'model_name=~"a\\\\.b|q\\"x\\\\|y",namespace=~"llm"'
    assert scope.group_by == ("model_name", "namespace")


def test_policies_on_different_label_sets_cannot_share() -> None:
    with pytest.raises(SelectorError):
        QueryScope.shared([Selector.of({"namespace": "a"}), Selector.of({"job": "b"})])


def test_split_hands_each_policy_its_own_series() -> None:
    results = {
        QueryKey.REQUESTS: [
            Series({"namespace": "llm", "model_name": "a"}, 1.0),
            Series({"namespace": "llm", "model_name": "b"}, 2.0),
            Series({"namespace": "other", "model_name": "a"}, 3.0),
        ]
    }
    mine = split_by_selector(results, Selector.of({"namespace": "llm", "model_name": "a"}))
    assert [s.value for s in mine[QueryKey.REQUESTS]] == [1.0]


def counts(**by_name: float) -> list[Series]:
    return [Series({"__name__": name}, value) for name, value in by_name.items()]


@pytest.mark.parametrize(
    ("series", "profile"),
    [
        (
            {
                "vllm:request_prefill_kv_computed_tokens_count": 2,
                "vllm:prefix_cache_queries_total": 2,
            },
            MetricsGeneration.VLLM_0_13,
        ),
        ({"vllm:prefix_cache_queries_total": 2}, MetricsGeneration.VLLM_0_9_2),
        (
            {
                "vllm:request_prefill_kv_computed_tokens_count": 1,
                "vllm:prefix_cache_queries_total": 2,
            },
            MetricsGeneration.VLLM_0_9_2,
        ),
        ({"vllm:gpu_prefix_cache_queries_total": 2}, None),
        ({}, None),
    ],
)
def test_vllm_generation_is_detected_from_the_series_that_exist(
    series: dict[str, float], profile: MetricsGeneration | None
) -> None:
    detection = detect_profile(Engine.VLLM, Selector(()), counts(**series))
    assert detection.profile is profile
    assert bool(detection.reason) == (profile is None)


def test_mixed_vllm_fleet_falls_back_and_says_so() -> None:
    detection = detect_profile(
        Engine.VLLM,
        Selector(()),
        counts(
            **{
                "vllm:request_prefill_kv_computed_tokens_count": 1,
                "vllm:prefix_cache_queries_total": 3,
            }
        ),
    )
    assert "only 1 of 3 engines" in detection.notes[0]


def test_old_sglang_is_refused_with_the_reason() -> None:
    detection = detect_profile(
        Engine.SGLANG, Selector(()), counts(**{"sglang:num_running_reqs": 1})
    )
    assert detection.profile is None
    assert "older than 0.5.20" in detection.reason
    detected = detect_profile(
        Engine.SGLANG, Selector(()), counts(**{"sglang:prefill_effective_tokens_total": 4})
    )
    assert detected.profile is MetricsGeneration.SGLANG_0_5_20


def test_detection_query_counts_marker_series_per_group() -> None:
    query = detection_query(Engine.VLLM, QueryScope.for_selector(Selector.of({"namespace": "n"})))
    assert query.startswith("count by (__name__, model_name, namespace) ({__name__=~")
    assert 'namespace="n"' in query


def test_docs_show_the_queries_the_code_builds() -> None:
    folder = Path(__file__).resolve().parents[2] / "docs"
    docs = "".join((folder / page).read_text() for page in ("signals.md", "report.md"))
    selector = Selector.of({"namespace": "llm", "model_name": "llama-3-8b"})
    queries = build_queries(
        MetricsGeneration.VLLM_0_13, QueryScope.for_selector(selector), 300, kube_state_metrics=True
    )
    missing = [key.name for key, query in queries.items() if query.promql not in docs]
    assert missing == []


@pytest.mark.parametrize("profile", list(MetricsGeneration))
@pytest.mark.parametrize("ksm", [False, True])
def test_the_label_query_counts_every_series_the_batch_selects(
    profile: MetricsGeneration, ksm: bool
) -> None:
    selectors = [
        Selector.of({"namespace": "llm", "model_name": "a"}),
        Selector.of({"model_name": "b", "app": "x"}),
    ]
    scope = QueryScope.shared(selectors)
    batch = " ".join(
        q.promql for q in build_queries(profile, scope, 300, kube_state_metrics=ksm).values()
    )
    selected = set(re.findall(r"([a-z_:]+)\{" + re.escape(scope.matchers), batch))
    counted = label_query(profile, scope, 300, kube_state_metrics=ksm)
    assert counted.startswith("count by (app, model_name, namespace) ({__name__=~")
    assert selected
    assert (
        set(re.search(r'__name__=~"([^"]+)"', counted)[1].replace("\\", "").split("|")) == selected
    )


def test_selectors_share_a_scope_on_the_labels_they_all_match_on() -> None:
    two = Selector.of({"namespace": "llm", "model_name": "a"})
    three = Selector.of({"namespace": "sp", "model_name": "b", "adapter": "x"})
    scope = QueryScope.shared([two, three])
    assert scope.matchers == 'model_name=~"a|b",namespace=~"llm|sp"'
    assert scope.group_by == ("adapter", "model_name", "namespace")
    with pytest.raises(SelectorError, match="no common label"):
        QueryScope.shared([Selector.of({"app": "a"}), Selector.of({"model_name": "b"})])


def test_cost_counts_scheduled_pods_of_the_target_not_only_ready_exporting_ones() -> None:
    # Pods loading weights are scheduled and hold GPUs but export nothing and are not
    # ready: the cost and the pods holding GPUs reach them through the owners of the pods
    # that export, and read the scheduled condition, never the ready one.
    selector = Selector.of({"namespace": "llm", "model_name": "m"})
    batch = build_queries(
        MetricsGeneration.VLLM_0_13, QueryScope.for_selector(selector), 300, kube_state_metrics=True
    )
    for key in (QueryKey.GPU_SECONDS, QueryKey.PODS_HOLDING_GPUS):
        promql = batch[key].promql
        assert "kube_pod_status_ready" not in promql, key
        assert 'kube_pod_status_scheduled{namespace="llm",condition="true"}' in promql, key
        assert 'kube_pod_owner{namespace="llm",owner_kind="ReplicaSet"}' in promql, key
        assert 'kube_replicaset_owner{namespace="llm",owner_kind="Deployment"}' in promql, key
        assert promql.startswith("avg_over_time((sum by (model_name, namespace) ("), key
        assert "[300s:30s])" in promql, key
    assert batch[QueryKey.GPU_SECONDS].promql.endswith(" * 300")
