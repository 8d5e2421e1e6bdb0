"""Prometheus's histogram_quantile over classic buckets, against hand-computed values.

(``tests/gather/test_gather_quantiles.py`` checks it against a real Prometheus.)
"""

from __future__ import annotations

import math

import pytest

from cachescale.histogram import (
    BucketQuantile,
    NoQuantile,
    histogram_quantile,
    locate_quantile,
    prepare,
)

INF = math.inf

BUCKETS = [(1.0, 10.0), (2.0, 30.0), (INF, 40.0)]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 1.5),  # rank 20 in (1, 2]: 1 + 1 × (20 − 10) / (30 − 10)
        (0.25, 1.0),  # rank 10 fills the first bucket exactly
        (0.1, 0.4),  # rank 4 in the first bucket, from 0: 1 × 4 / 10
        (0.75, 2.0),  # rank 30 ends the second bucket
        (0.9, 2.0),  # rank 36 in +Inf: the highest finite bound
        (0.0, 0.0),  # rank 0 in the first bucket: its lower edge
    ],
)
def test_quantile_interpolates_inside_the_bucket(q: float, expected: float) -> None:
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_quantile_out_of_range_and_degenerate_inputs() -> None:
    assert histogram_quantile(-0.1, BUCKETS) == -INF
    assert histogram_quantile(1.1, BUCKETS) == INF
    assert math.isnan(histogram_quantile(math.nan, BUCKETS))
    assert math.isnan(histogram_quantile(0.5, []))
    assert math.isnan(histogram_quantile(0.5, [(1.0, 0.0), (INF, 0.0)]))  # no observations
    assert math.isnan(histogram_quantile(0.5, [(INF, 7.0)]))  # fewer than 2 buckets
    assert math.isnan(histogram_quantile(0.5, [(1.0, 3.0), (2.0, 7.0)]))  # no +Inf bucket


def test_quantile_with_a_single_finite_bucket() -> None:
    # rank 3.96 of 4 in (0, 0.5]: 0.5 × 3.96 / 4.
    assert histogram_quantile(0.99, [(0.5, 4.0), (INF, 4.0)]) == pytest.approx(0.495)
    # Everything above the only bound: the bound.
    assert histogram_quantile(0.5, [(0.5, 0.0), (INF, 4.0)]) == 0.5


def test_quantile_lowest_bound_at_or_below_zero_is_returned_as_is() -> None:
    assert histogram_quantile(0.2, [(0.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == 0.0
    assert histogram_quantile(0.2, [(-1.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == -1.0


def test_quantile_sorts_and_merges_equal_bounds() -> None:
    shuffled = [(INF, 40.0), (2.0, 15.0), (1.0, 10.0), (2.0, 15.0)]
    assert histogram_quantile(0.5, shuffled) == pytest.approx(1.5)


def test_quantile_forces_monotonic_counts() -> None:
    # The le=2 count (4) is raised to 10: rank 12 in (2, 4] is 2 + 2 × (12 − 10) / 10.
    # Without the fix it would be 2 + 2 × (12 − 4) / 16 = 3.
    buckets = [(1.0, 10.0), (2.0, 4.0), (4.0, 20.0), (INF, 20.0)]
    assert histogram_quantile(0.6, buckets) == pytest.approx(2.4)


def test_quantile_ignores_float_noise_between_buckets() -> None:
    # le=2 exceeds le=1 by 1e-13 (relative): equalised, so a rank just above 1.0 falls past
    # it into +Inf (2.0), instead of 40% into (1, 2] as the raw counts would put it.
    buckets = [(1.0, 1.0), (2.0, 1.0 + 1e-13), (INF, 2.0)]
    assert histogram_quantile(0.5 + 2e-14, buckets) == 2.0


def test_float_noise_is_relative_to_the_sum_and_to_the_last_count_kept() -> None:
    # Each count is 1.5e-12 above the one below: 0.75e-12 of their sum, noise, so le=2
    # keeps 10. Then le=3 is compared with that 10 (3e-12 above, 1.5e-12 of the sum: a
    # real difference), not with the le=2 count it replaced. Rank 10 + 2e-11 then lies
    # 2/3 of the way into (2, 3]; a rule relative to the larger count (1.5e-12 > 1e-12)
    # or to the last count seen would keep le=2 and put it 1/3 of the way in.
    buckets = [(1.0, 10.0), (2.0, 10.0 + 1.5e-11), (3.0, 10.0 + 3e-11), (INF, 20.0)]
    assert histogram_quantile(0.5 + 1e-12, buckets) == pytest.approx(2 + 2 / 3, rel=1e-3)


@pytest.mark.parametrize(
    ("q", "located"),
    [
        (0.5, BucketQuantile(1.5, 1.0, 2.0)),
        (0.1, BucketQuantile(0.4, 0.0, 1.0)),  # the first bucket starts at 0
        (0.25, BucketQuantile(1.0, 0.0, 1.0)),  # a rank on a bound stays in its bucket
        (0.9, BucketQuantile(2.0, 2.0, INF)),  # past the last finite bound: only "> 2"
    ],
)
def test_located_quantile_names_the_bucket_its_rank_fell_in(
    q: float, located: BucketQuantile
) -> None:
    assert locate_quantile(q, BUCKETS) == pytest.approx(located)


def test_all_observations_in_the_first_bucket_interpolate_from_zero() -> None:
    buckets = [(0.1, 10.0), (0.5, 10.0), (1.0, 10.0), (INF, 10.0)]
    assert locate_quantile(0.5, buckets) == BucketQuantile(0.05, 0.0, 0.1)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.099)


def test_all_observations_past_the_last_bound_give_that_bound() -> None:
    buckets = [(0.1, 0.0), (1.0, 0.0), (INF, 10.0)]
    for q in (0.5, 0.95, 0.99):
        assert locate_quantile(q, buckets) == BucketQuantile(1.0, 1.0, INF)


@pytest.mark.parametrize(
    ("buckets", "why"),
    [
        ([], NoQuantile.NO_INF_BUCKET),
        ([(1.0, 3.0), (2.0, 7.0)], NoQuantile.NO_INF_BUCKET),
        ([(INF, 7.0)], NoQuantile.NO_FINITE_BUCKET),
        ([(INF, 3.0), (INF, 4.0)], NoQuantile.NO_FINITE_BUCKET),  # merged into one
        ([(1.0, 0.0), (INF, 0.0)], NoQuantile.NO_OBSERVATIONS),
    ],
)
def test_no_quantile_says_why(buckets: list[tuple[float, float]], why: NoQuantile) -> None:
    assert locate_quantile(0.5, buckets) is why
    assert math.isnan(histogram_quantile(0.5, buckets))


def test_observations_counted_below_an_empty_inf_bucket_still_count() -> None:
    # The +Inf count (0) is raised to le=1's 4 before observations are counted.
    assert locate_quantile(0.5, [(1.0, 4.0), (INF, 0.0)]) == BucketQuantile(0.5, 0.0, 1.0)


def test_one_prepared_histogram_answers_every_quantile_as_locating_each() -> None:
    """``prepare`` sorts and merges once; each quantile of it is ``locate_quantile``'s."""
    buckets = [(2.0, 30.0), (INF, 40.0), (1.0, 4.0), (1.0, 6.0), (0.5, 11.0)]
    prepared = prepare(buckets)
    assert not isinstance(prepared, NoQuantile)
    assert prepared.bounds == [0.5, 1.0, 2.0, INF]
    assert prepared.counts == [11.0, 11.0, 30.0, 40.0]  # 4 + 6 < 11: kept at 11
    for q in (0.0, 0.1, 0.25, 0.5, 0.95, 0.99, 1.0):
        assert prepared.locate(q) == locate_quantile(q, buckets)
    assert prepare([(1.0, 3.0)]) is NoQuantile.NO_INF_BUCKET
