"""Demand (``decide.demand``): arrivals when known, else the served rate flagged as such,
and what requests cost over the baseline at that demand, as tables of cases."""

from __future__ import annotations

import pytest

from cachescale.decide.demand import Demand, ExtraCost, demand, extra_cost
from tests.decide.decide_builders import signals, snapshot


@pytest.mark.parametrize(
    ("arrivals", "served", "expected", "words"),
    [
        (41.0, 32.0, Demand(41.0, True), "41"),
        (None, 32.0, Demand(32.0, False), "32 (served; arrivals unknown)"),
        (None, None, Demand(None, False), "unknown (served; arrivals unknown)"),
    ],
    ids=["arrivals", "served-only", "unknown"],
)
def test_demand(arrivals: float | None, served: float | None, expected: Demand, words: str) -> None:
    state = snapshot(signals(arrivals_per_second=arrivals, requests_per_second=served))
    assert demand(state) == expected
    assert demand(state).rate() == words


@pytest.mark.parametrize(
    ("cost", "baseline", "need", "expected"),
    [
        # 420 GPU-s/1k × 32 req/s × 86,400 s / 1,000 / 3,600 = 322.56 GPU-hours a day.
        (1100.0, 680.0, Demand(32.0, True), (420.0, 322.56)),
        (680.0, 680.0, Demand(32.0, True), None),
        (600.0, 680.0, Demand(32.0, True), None),
        (None, 680.0, Demand(32.0, True), None),
        (1100.0, None, Demand(32.0, True), None),
        (1100.0, 680.0, Demand(None, False), None),
    ],
    ids=["over", "at-baseline", "under", "cost-unknown", "no-baseline", "demand-unknown"],
)
def test_extra_cost(
    cost: float | None, baseline: float | None, need: Demand, expected: tuple[float, float] | None
) -> None:
    extra = extra_cost(cost, baseline, need)
    if expected is None:
        assert extra is None
    else:
        assert extra is not None
        assert (extra.gpu_seconds_per_1k, extra.gpu_hours_per_day) == pytest.approx(expected)


def test_extra_cost_words() -> None:
    assert ExtraCost(420.0, 322.56, 680.0).words() == (
        "this costs 420 GPU-s per 1k requests over the baseline, 323 GPU-hours per day "
        "(learned baseline 680 GPU-s/1k)"
    )


def test_extra_cost_quotes_the_baseline_it_subtracts() -> None:
    extra = extra_cost(1900.0, 758.0, Demand(10.0, True))
    assert extra is not None
    assert extra.gpu_seconds_per_1k + extra.baseline_gpu_seconds_per_1k == 1900.0
    assert extra.words().startswith("this costs 1,142 GPU-s per 1k requests over the baseline")
    assert extra.words().endswith("(learned baseline 758 GPU-s/1k)")
