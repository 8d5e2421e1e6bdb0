"""The operator's latency quantiles against a real Prometheus's ``histogram_quantile``.

Each TTFT and ITL quantile the operator reports must be what Prometheus answers for
``histogram_quantile(q, <the operator's bucket query>)``, to 1e-9 (relative), "no
quantile" (NaN) included: for each shape of ``gather_dataset.QUANTILE_SHAPES``, read per
policy and from a group's shared batch; and ``cachescale.histogram`` must give
Prometheus's answer for many random bucket shapes given to both as numbers. (Those never
put two adjacent counts within 1e-12 of each other: the Prometheus the tests run predates
the float-noise rule, which ``tests/test_histogram.py`` checks on its own.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest

from cachescale.api.spec import Engine
from cachescale.gather.prometheus import PrometheusClient, PrometheusConfig
from cachescale.gather.promql import QueryKey, build_queries
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import QueryScope, Selector, split_by_selector
from cachescale.gather.signals import SignalRequest, compute_signals
from cachescale.histogram import histogram_quantile
from cachescale.snapshot import EngineSignals, MetricsGeneration
from tests.gather.gather_dataset import AT, QUANTILE_NAMESPACE, QUANTILE_SHAPES, WINDOW_S

RELATIVE = 1e-9
QUANTILES = {
    "ttft_p50_seconds": (0.5, QueryKey.TTFT_BUCKETS),
    "ttft_p95_seconds": (0.95, QueryKey.TTFT_BUCKETS),
    "ttft_p99_seconds": (0.99, QueryKey.TTFT_BUCKETS),
    "itl_p95_seconds": (0.95, QueryKey.ITL_BUCKETS),
}
"""Each quantile signal, its q and the query of the buckets it is computed from."""
PROFILE = MetricsGeneration.VLLM_0_9_2
"""What the shapes' deployments are detected as (no computed-tokens histogram)."""

Quantiles = dict[str, float | None]
"""Signal → value; None where there is no quantile."""


@pytest.fixture(scope="module")
def client(synthetic_prometheus: str) -> Iterator[PrometheusClient]:
    with PrometheusClient(PrometheusConfig(url=synthetic_prometheus, retries=0)) as c:
        yield c


def selector(model: str) -> Selector:
    return Selector.of({"namespace": QUANTILE_NAMESPACE, "model_name": model})


def prometheus_quantiles(client: PrometheusClient, model: str) -> Quantiles:
    """``histogram_quantile(q, <bucket query>)`` per signal, as Prometheus answers it."""
    queries = build_queries(PROFILE, QueryScope.for_selector(selector(model)), WINDOW_S)
    answers: Quantiles = {}
    for signal, (q, key) in QUANTILES.items():
        (answer,) = client.query(f"histogram_quantile({q}, {queries[key].promql})", AT)
        answers[signal] = None if math.isnan(answer.value) else answer.value
    return answers


def operator_quantiles(snapshot: EngineSignals) -> Quantiles:
    return {signal: getattr(snapshot, signal).value for signal in QUANTILES}


def assert_same(operator: Quantiles, prometheus: Quantiles) -> None:
    """The same signals without a quantile, and the others equal to ``RELATIVE``."""
    assert {s for s, v in operator.items() if v is None} == {
        s for s, v in prometheus.items() if v is None
    }
    known = {s: v for s, v in prometheus.items() if v is not None}
    assert {s: operator[s] for s in known} == pytest.approx(known, rel=RELATIVE)


@pytest.mark.parametrize("model", list(QUANTILE_SHAPES))
def test_each_policy_reads_the_quantiles_prometheus_computes(
    client: PrometheusClient, model: str
) -> None:
    snapshot = gather_signals(client, SignalRequest(Engine.VLLM, selector(model), WINDOW_S), AT)
    assert snapshot.profile is PROFILE
    assert_same(operator_quantiles(snapshot), prometheus_quantiles(client, model))


def test_a_groups_shared_batch_gives_each_policy_the_quantiles_prometheus_computes(
    client: PrometheusClient,
) -> None:
    selectors = [selector(model) for model in QUANTILE_SHAPES]
    queries = build_queries(PROFILE, QueryScope.shared(selectors), WINDOW_S)
    shared = client.query_many({key: query.promql for key, query in queries.items()}, AT)
    for model, own in zip(QUANTILE_SHAPES, selectors, strict=True):
        request = SignalRequest(Engine.VLLM, own, WINDOW_S)
        detection = client.detect(Engine.VLLM, own, AT)
        snapshot = compute_signals(request, detection, queries, split_by_selector(shared, own), AT)
        assert_same(operator_quantiles(snapshot), prometheus_quantiles(client, model))


def test_the_shapes_reach_every_case_they_are_named_for(client: PrometheusClient) -> None:
    """Guards the dataset: each shape still lands where its name says."""
    answers = {model: prometheus_quantiles(client, model) for model in QUANTILE_SHAPES}
    assert all(value is None for value in answers["empty"].values())
    assert all(value is None for value in answers["no-inf"].values())
    assert all(value is None for value in answers["only-inf"].values())
    assert answers["past"]["ttft_p50_seconds"] == 1.0  # the last finite bound
    assert answers["first"]["ttft_p50_seconds"] == pytest.approx(0.05)
    assert answers["boundary"]["ttft_p50_seconds"] == 0.5  # exactly the bound
    # The reset bucket's rate falls below the one under it: the monotonic fix moves p95.
    assert answers["reset"]["ttft_p95_seconds"] == pytest.approx(0.875)
    assert answers["inconsistent"]["ttft_p95_seconds"] == pytest.approx(0.95)
    # le="1" and le="1.0" are one bucket: rank 2 of 4 lies in (0.5, 1].
    assert answers["spellings"]["ttft_p50_seconds"] == pytest.approx(0.625)


# --- random shapes, as numbers ---------------------------------------------------------------


Shape = list[tuple[str, float]]
"""``(le, cumulative count)`` per bucket."""


def random_shape(rng: random.Random) -> Shape:
    """Up to six finite buckets (sometimes one bounded at or below 0, or one bound written
    twice), counts rising by random steps with some empty buckets, some decreases, some
    all-zero histograms and some without a ``+Inf`` bucket."""
    bounds = sorted({round(rng.uniform(0.01, 20.0), rng.choice((0, 2, 6))) for _ in range(6)})
    bounds = [bound for bound in bounds if bound > 0][: rng.randint(1, 6)] or [1.0]
    if rng.random() < 0.1:
        bounds[0] = rng.choice((0.0, -1.0))
    counts, count = [], 0.0
    for _ in (*bounds, math.inf):
        count += rng.choice((0.0, rng.uniform(0.0, 5.0)))
        counts.append(count)
    if rng.random() < 0.3:  # an inconsistent bucket: below the one before it
        worse = rng.randrange(1, len(counts))
        counts[worse] = counts[worse - 1] * rng.uniform(0.0, 0.99)
    if rng.random() < 0.1:
        counts = [0.0] * len(counts)
    shape = [(repr(bound), c) for bound, c in zip((*bounds, math.inf), counts, strict=True)]
    shape[-1] = ("+Inf", shape[-1][1])
    integral = [i for i, bound in enumerate(bounds) if bound.is_integer() and bound > 0]
    if integral and rng.random() < 0.3:  # one bound also written as an integer, e.g. "3"
        i = rng.choice(integral)
        shape.append((str(int(bounds[i])), rng.uniform(0.0, 2.0)))
    if rng.random() < 0.05:
        shape.pop(len(bounds))  # the +Inf bucket
    return shape


def as_promql(shapes: list[Shape]) -> str:
    """Every shape as one instant vector: each bucket a ``vector(count)`` with its ``le``
    and the shape's index as labels."""
    return " or ".join(
        f'label_replace(label_replace(vector({count!r}), "le", "{le}", "", ""), '
        f'"shape", "{index}", "", "")'
        for index, shape in enumerate(shapes)
        for le, count in shape
    )


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_random_bucket_shapes_give_prometheus_quantile(client: PrometheusClient, q: float) -> None:
    rng = random.Random(f"histogram-quantile-{q}")
    shapes = [random_shape(rng) for _ in range(150)]
    answers = client.query(f"histogram_quantile({q}, {as_promql(shapes)})", AT)
    by_shape = {int(answer.labels["shape"]): answer.value for answer in answers}
    assert sorted(by_shape) == list(range(len(shapes)))
    for index, shape in enumerate(shapes):
        ours = histogram_quantile(q, [(float(le), count) for le, count in shape])
        theirs = by_shape[index]
        assert math.isnan(ours) == math.isnan(theirs), shape
        if not math.isnan(theirs):
            assert ours == pytest.approx(theirs, rel=RELATIVE), shape
