"""Grouped gathering against a real Prometheus: the same outcome as reading each policy
alone, for every policy, with one request per group.

The differential test reads a few dozen policies both ways over the synthetic TSDB of
``gather_dataset`` (selectors on one, two and three label names, label sets sharing a
batch, values full of regex metacharacters, the same values in two namespaces, policies
whose deployment exports nothing, ambiguous selectors, SGLang and two vLLM generations
side by side, demand queries, kube-state-metrics on and off) and requires equal
outcomes: equal snapshots (every value, reason, note and pod, compared exactly) or errors
of the same type and text.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime

import pytest

from cachescale.api.spec import Engine
from cachescale.gather.grouped import DetectionCache, GroupedGatherer, Outcome, PolicyRead, plan
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig, Series
from cachescale.gather.prometheus_errors import (
    DeadlineReached,
    PrometheusBadResponse,
    PrometheusError,
    PrometheusQueryError,
    PrometheusTimeout,
    PrometheusUnreachable,
)
from cachescale.gather.promql import build_queries
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import QueryScope, Selector
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import SignalRequest
from cachescale.snapshot import EngineSignals, MetricsGeneration
from tests.gather.gather_dataset import AT, SPECIAL_MODELS, WINDOW_S
from tests.gather.gather_fakes import HANG, closed_port_url, fake_prometheus, parts_of


class CountingClient(PrometheusClient):
    """A real client that records every query it sends (views made by ``until`` share
    the record, so a batch's queries are counted too)."""

    def __init__(self, config: PrometheusConfig) -> None:
        super().__init__(config)
        self.sent: list[str] = []

    def query(self, promql: str, at: datetime) -> list[Series]:
        self.sent.append(promql)
        return super().query(promql, at)


@pytest.fixture
def client(synthetic_prometheus: str) -> Iterator[CountingClient]:
    counting = CountingClient(PrometheusConfig(url=synthetic_prometheus, retries=0))
    with counting:
        yield counting


def request(
    engine: Engine = Engine.VLLM,
    window: float = WINDOW_S,
    ksm: bool = False,
    demand: str | None = None,
    **selector: str,
) -> SignalRequest:
    return labelled(selector, engine, window, ksm, demand)


def labelled(
    selector: Mapping[str, str],
    engine: Engine = Engine.VLLM,
    window: float = WINDOW_S,
    ksm: bool = False,
    demand: str | None = None,
) -> SignalRequest:
    return SignalRequest(
        engine=engine,
        selector=Selector.of(selector),
        window_seconds=window,
        kube_state_metrics=ksm,
        demand_query=demand,
    )


def policies() -> dict[str, SignalRequest]:
    """Every selector shape the differential test reads, by a name for failure messages."""
    reads: dict[str, SignalRequest] = {}
    llm_models = ["steady", "reset", "legacy", "nan", "idle", "nolookups", "nopod", "wide"]
    llm_models += ["saturated", "sg", "missing", 'steady"} or vector(1) or up{x="']
    for model in llm_models:
        reads[f"llm/{model}"] = request(namespace="llm", model_name=model)
    reads["llm/steady again"] = request(namespace="llm", model_name="steady")
    for model in SPECIAL_MODELS:
        reads[f"sp/{model}"] = request(namespace="sp", model_name=model)
    for model in ("dot.model", "a+b", "ghost"):
        reads[f"sp.alt/{model}"] = request(namespace="sp.alt", model_name=model)
    for model in ("sg", "sgslow", "steady"):
        reads[f"sglang llm/{model}"] = request(Engine.SGLANG, namespace="llm", model_name=model)
    reads["sglang sp/^caret$"] = request(Engine.SGLANG, namespace="sp", model_name="^caret$")
    demand = 'sum(rate(vllm:request_success_total{namespace="llm",model_name="steady"}[5m]))'
    reads["demand llm/steady"] = request(demand=demand, namespace="llm", model_name="steady")
    reads["bad demand llm/reset"] = request(demand="sum(", namespace="llm", model_name="reset")
    # Another window: the cross product of these two also selects sp/a+b and sp.alt/dot.model.
    reads["120s sp/dot.model"] = request(window=120, namespace="sp", model_name="dot.model")
    reads["120s sp.alt/a+b"] = request(window=120, namespace="sp.alt", model_name="a+b")
    for model in ("steady", "saturated", "legacy", "nopod"):
        reads[f"ksm llm/{model}"] = request(ksm=True, namespace="llm", model_name=model)
    for number in (0, 1, 2, 3, 4, 8):  # d0 and d2 are in two namespaces: ambiguous
        reads[f"deployment d{number}"] = request(deployment=f"d{number}")
    reads["sglang deployment d9"] = request(Engine.SGLANG, deployment="d9")
    for ns, model, deployment in [
        ("sp", "dot.model", "d0"),
        ("sp.alt", "dot.model", "d0"),
        ("sp", "a+b", "d2"),
        ("sp", "q?{2}", "d6"),
        ("sp", "star*", "d5"),
        ("sp", "dot.model", "d1"),  # no such combination
    ]:
        three = {"namespace": ns, "model_name": model, "deployment": deployment}
        reads[f"3 labels {ns}/{model}/{deployment}"] = labelled(three)
    caret = {"namespace": "sp", "model_name": "^caret$", "deployment": "d9"}
    reads["sglang 3 labels ^caret$"] = labelled(caret, Engine.SGLANG)
    for ns in ("twins", "solo", "sp.alt", "nowhere"):
        reads[f"namespace {ns}"] = request(namespace=ns)
    reads["pod sp-2-a"] = request(namespace="sp", pod="sp-2-a")
    reads["pod steady-a"] = request(namespace="llm", pod="steady-a")
    reads["lone model wide"] = request(model_name="wide")
    return reads


def alone(client: PrometheusClient, req: SignalRequest) -> Outcome:
    """The per-policy path, as the controller calls it."""
    try:
        return gather_signals(client, req, AT)
    except (PrometheusError, AmbiguousSeriesError) as error:
        return error


def comparable(outcome: Outcome) -> object:
    if isinstance(outcome, EngineSignals):
        return outcome
    return type(outcome), str(outcome)


def test_grouped_outcomes_equal_reading_each_policy_alone(client: CountingClient) -> None:
    requests = policies()
    reads = [PolicyRead(name, client, req) for name, req in requests.items()]
    groups = plan(reads)
    shared = [g for g in groups if g.shared]
    # The shapes really are shared: 1, 2 and 3 label names, two label sets in one group,
    # and mixed engines in one.
    assert any(len(g.label_sets) > 1 for g in shared)
    assert {names for g in shared for names in g.label_sets} >= {
        ("deployment",),
        ("model_name", "namespace"),
        ("deployment", "model_name", "namespace"),
        ("namespace",),
    }
    assert any(len({m.request.engine for m in g.members}) == 2 for g in shared)
    assert all(not g.shared for g in groups if "pod" in g.selectors[0].names)

    grouped = GroupedGatherer().gather(reads, AT)

    expected = {name: comparable(alone(client, req)) for name, req in requests.items()}
    assert {name: comparable(outcome) for name, outcome in grouped.items()} == expected
    # Not vacuous: most policies have numbers, some are errors, some all-unknown.
    known = [o for o in grouped.values() if isinstance(o, EngineSignals) and o.profile]
    assert len(known) > 25
    assert sum(isinstance(o, AmbiguousSeriesError) for o in grouped.values()) >= 4
    absent = grouped["sp.alt/ghost"]
    assert isinstance(absent, EngineSignals)
    assert "no vLLM series match" in str(absent.token_hit_rate_local.reason)
    assert 'model_name="ghost"' in str(absent.token_hit_rate_local.reason)
    bad_demand = grouped["bad demand llm/reset"]
    assert isinstance(bad_demand, EngineSignals)
    assert "demandQuery failed" in str(bad_demand.arrivals_per_second.reason)
    assert bad_demand.requests_per_second.value == pytest.approx(2.0, rel=0.1)


def vllm_0_13_reads(client: PrometheusClient) -> list[PolicyRead[str]]:
    models = [("llm", m) for m in ("steady", "reset", "wide", "saturated")]
    models += [("sp", m) for m in SPECIAL_MODELS if m != "star*"]
    return [
        PolicyRead(f"{ns}/{m}", client, request(namespace=ns, model_name=m)) for ns, m in models
    ]


def test_n_groupable_policies_send_one_request_for_every_signal(client: CountingClient) -> None:
    reads = vllm_0_13_reads(client)
    now = [0.0]
    gatherer = GroupedGatherer(DetectionCache(ttl_seconds=300, clock=lambda: now[0]))
    signals = len(build_queries(MetricsGeneration.VLLM_0_13, QueryScope("", ()), WINDOW_S))

    first = gatherer.gather(reads, AT)
    detection, batch = client.sent  # one detection, one batch
    assert detection.startswith("count by (__name__")
    assert len(parts_of(batch)) == signals
    assert all(isinstance(o, EngineSignals) and o.profile for o in first.values())

    client.sent.clear()
    now[0] = 299.0
    assert gatherer.gather(reads, AT) == first
    assert client.sent == [batch]  # the profiles are cached

    client.sent.clear()
    now[0] = 300.0
    gatherer.gather(reads, AT)
    assert client.sent == [detection, batch]  # the cache expired: detected again

    client.sent.clear()
    for read in reads:
        gather_signals(client, read.request, AT)
    assert len(client.sent) == len(reads) * 2


def test_one_failing_group_does_not_touch_another(client: CountingClient) -> None:
    healthy = vllm_0_13_reads(client)[:3]
    with (
        fake_prometheus() as garbage,
        fake_prometheus() as hanging,
        PrometheusClient(PrometheusConfig(url=closed_port_url(), retries=0)) as down,
        PrometheusClient(PrometheusConfig(url=garbage.url, retries=0)) as bad,
        PrometheusClient(PrometheusConfig(url=hanging.url, timeout_seconds=1.0)) as slow,
    ):
        garbage.respond = lambda _query: (200, b"<html>not prometheus</html>")
        hanging.respond = lambda _query: HANG
        failing = {down: PrometheusUnreachable, bad: PrometheusBadResponse, slow: DeadlineReached}
        reads = list(healthy)
        for number, failing_client in enumerate(failing):
            for model in ("steady", "reset"):
                req = request(namespace="llm", model_name=model)
                reads.append(PolicyRead(f"{number}/{model}", failing_client, req))
        outcomes = GroupedGatherer().gather(reads, AT)

    for read in healthy:
        assert comparable(outcomes[read.key]) == comparable(alone(client, read.request))
    for read in reads[len(healthy) :]:
        assert isinstance(outcomes[read.key], failing[read.client])


def test_plan_splits_large_groups_and_isolates_pod_selectors(client: CountingClient) -> None:
    def read(key: str, **selector: str) -> PolicyRead[str]:
        return PolicyRead(key, client, labelled(selector))

    reads = [read(f"m{i}", namespace="llm", model_name=f"m{i}") for i in range(5)]
    reads += [read("again", namespace="llm", model_name="m0")]  # a duplicate costs nothing
    reads += [read(f"pod{i}", namespace="llm", pod="p") for i in range(2)]
    groups = plan(reads, max_group_size=2)
    sizes = [(len(g.selectors), len(g.members)) for g in groups]
    assert sizes == [(2, 3), (2, 2), (1, 1), (1, 1), (1, 1)]
    members: Mapping[str, int] = {m.key: i for i, g in enumerate(groups) for m in g.members}
    assert members["again"] == members["m0"]
    assert members["pod0"] != members["pod1"]


def test_a_missing_deployment_is_looked_for_again_while_found_ones_stay_cached(
    client: CountingClient,
) -> None:
    reads = vllm_0_13_reads(client)[:2]
    ghost = request(namespace="sp.alt", model_name="ghost")
    reads.append(PolicyRead("ghost", client, ghost))
    gatherer = GroupedGatherer(DetectionCache(clock=lambda: 0.0))
    gatherer.gather(reads, AT)
    client.sent.clear()
    outcomes = gatherer.gather(reads, AT)
    detections = [q for q in client.sent if q.startswith("count by (__name__")]
    assert len(detections) == 1
    assert 'model_name="ghost"' in detections[0]
    assert "steady" not in detections[0]
    assert comparable(outcomes["ghost"]) == comparable(alone(client, ghost))


def mixed_reads(client: PrometheusClient) -> list[PolicyRead[str]]:
    """Two label sets on one model label: ``llm`` series carry no ``deployment``, ``sp``
    series do, so ``sp/dot.model``'s share of a batch grouped by ``deployment`` is not its own."""
    three = {"namespace": "sp", "model_name": "a+b", "deployment": "d2"}
    return [
        PolicyRead("llm/steady", client, request(namespace="llm", model_name="steady")),
        PolicyRead("llm/reset", client, request(namespace="llm", model_name="reset")),
        PolicyRead("sp/a+b/d2", client, labelled(three)),
        PolicyRead("sp/dot.model", client, request(namespace="sp", model_name="dot.model")),
    ]


def test_label_sets_share_a_batch_unless_a_member_carries_the_others_labels(
    client: CountingClient,
) -> None:
    reads = mixed_reads(client)
    (group,) = plan(reads)
    assert group.label_sets == (
        ("model_name", "namespace"),
        ("deployment", "model_name", "namespace"),
    )

    outcomes = GroupedGatherer().gather(reads, AT)

    assert {k: comparable(o) for k, o in outcomes.items()} == {
        read.key: comparable(alone(client, read.request)) for read in reads
    }
    assert all(isinstance(o, EngineSignals) and o.profile for o in outcomes.values())
    detection, mixed, apart = client.sent[:3]
    assert detection.startswith("count by (__name__, deployment, model_name, namespace)")
    assert parts_of(mixed)[-1][1].startswith("count by (deployment, model_name, namespace)")
    # sp/dot.model's series carry deployment="d0": read again in its own label set, alone.
    assert 'model_name="dot.model"' in apart
    assert "deployment" not in apart
    assert len(client.sent) == 3 + 2 * len(reads)  # then each read alone, to compare


class RejectingMixes(CountingClient):
    """Prometheus refusing a batch that mixes label sets, as it does when a pod's series
    carry two values of a label a join groups by (many-to-many matching)."""

    def query(self, promql: str, at: datetime) -> list[Series]:
        if "count by (deployment, model_name, namespace)" in promql:
            self.sent.append(promql)
            raise PrometheusQueryError(self._url, "HTTP 422 Unprocessable Entity (execution)")
        return super().query(promql, at)


def gathered_as_alone(
    client: CountingClient, reads: list[PolicyRead[str]]
) -> tuple[dict[str, Outcome], list[str]]:
    """The grouped outcomes of ``reads``, checked equal to reading each alone, and the
    queries the grouped read sent."""
    outcomes = GroupedGatherer().gather(reads, AT)
    sent = list(client.sent)
    assert {k: comparable(o) for k, o in outcomes.items()} == {
        read.key: comparable(alone(client, read.request)) for read in reads
    }
    return outcomes, sent


def test_a_rejected_mix_is_read_again_per_label_set(synthetic_prometheus: str) -> None:
    with RejectingMixes(PrometheusConfig(url=synthetic_prometheus, retries=0)) as rejecting:
        outcomes, sent = gathered_as_alone(rejecting, mixed_reads(rejecting))
    assert all(isinstance(o, EngineSignals) and o.profile for o in outcomes.values())
    assert len(sent) == 1 + 1 + 2  # detection, the rejected mix, one batch per label set


PLAIN_MODELS = ("steady", "reset", "wide", "saturated")


class SlowOnMany(CountingClient):
    """Prometheus running out of time on a query that carries more than ``most`` of the
    plain models, or any that carries ``never`` (as a large chunk, or one slow
    deployment's series, would)."""

    most = len(PLAIN_MODELS)
    never = "no such model"

    def query(self, promql: str, at: datetime) -> list[Series]:
        carried = [m for m in PLAIN_MODELS if m in promql]
        if len(carried) > self.most or self.never in carried:
            self.sent.append(promql)
            raise PrometheusTimeout(self._url, "no answer within 1s")
        return super().query(promql, at)


def plain_reads(client: PrometheusClient) -> list[PolicyRead[str]]:
    return [PolicyRead(m, client, request(namespace="llm", model_name=m)) for m in PLAIN_MODELS]


def test_a_chunk_that_times_out_is_read_again_as_halves(synthetic_prometheus: str) -> None:
    with SlowOnMany(PrometheusConfig(url=synthetic_prometheus, retries=0)) as slow:
        slow.most = 2
        outcomes, sent = gathered_as_alone(slow, plain_reads(slow))
    assert all(isinstance(o, EngineSignals) and o.profile for o in outcomes.values())
    assert len(sent) == 1 + 2 * 2  # the chunk's detection timed out; per half: detect, batch


def test_a_half_that_times_out_again_is_its_members_timeout_only(
    synthetic_prometheus: str,
) -> None:
    with SlowOnMany(PrometheusConfig(url=synthetic_prometheus, retries=0)) as slow:
        slow.never = "saturated"
        outcomes = GroupedGatherer().gather(plain_reads(slow), AT)
        sent = list(slow.sent)
    assert {k for k, o in outcomes.items() if isinstance(o, PrometheusTimeout)} == {
        "wide",
        "saturated",
    }
    assert all(isinstance(outcomes[k], EngineSignals) for k in ("steady", "reset"))
    assert len(sent) == 1 + 2 + 1  # the chunk, one half's detection and batch, the other's
