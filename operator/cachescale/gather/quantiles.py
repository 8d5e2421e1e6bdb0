"""Latency quantiles and the full-hit share, from histogram bucket rates.

A latency quantile is computed from its histogram's bucket rates exactly as Prometheus's
``histogram_quantile`` would (``cachescale.histogram``), and is unknown where that would
be NaN (no observations, no ``+Inf`` bucket or no other), with the reason. Past the last
finite bucket it is only a lower bound, and marked so; in a wide bucket it carries that
bucket. The full-hit share is the share of requests that computed at most a threshold of
prompt tokens, read at the highest bucket bound not above it (vLLM 0.13 or newer: the
other generations export no per-request computed-token histogram).

Pure: a ``SeriesReader`` in, measurements out.
"""

from __future__ import annotations

import math

from cachescale.gather.promql import QueryKey
from cachescale.gather.series_reader import SeriesReader, no_traffic, ratio, unknown
from cachescale.histogram import BucketQuantile, NoQuantile
from cachescale.snapshot import Measured, MetricsGeneration, Unit

_NO_FULL_HIT_HISTOGRAM = {
    MetricsGeneration.VLLM_0_9_2: (
        "needs vllm:request_prefill_kv_computed_tokens (vLLM 0.13 or newer, on every pod)"
    ),
    MetricsGeneration.SGLANG_0_5_20: "SGLang exports no per-request computed-token histogram",
}


def full_hit_share(
    reader: SeriesReader, profile: MetricsGeneration, threshold: float, rps: Measured
) -> tuple[Measured, float | None]:
    """Share of requests at or under ``threshold`` computed tokens, read at the highest
    bucket bound not above it; also returns that bound."""
    if profile in _NO_FULL_HIT_HISTOGRAM:
        return unknown(_NO_FULL_HIT_HISTOGRAM[profile], Unit.RATIO), None
    finite = [b for b in reader.bucket_rates(QueryKey.COMPUTED_BUCKETS) if b != math.inf]
    bounds = [bound for bound in finite if bound <= threshold]
    if not bounds:
        reason = (
            reader.absent(QueryKey.COMPUTED_BUCKETS)
            if not finite
            else f"no bucket bound of {reader.reads(QueryKey.COMPUTED_BUCKETS)} is at or "
            f"below {threshold:g} tokens"
        )
        return unknown(reason, Unit.RATIO), None
    bound = max(bounds)
    zero = no_traffic(rps, "no requests finished") or (
        f"{reader.reads(QueryKey.COMPUTED_COUNT)} did not increase although "
        f"{rps.value:.3g} requests/s finished"
    )
    share = ratio(
        reader.bucket(QueryKey.COMPUTED_BUCKETS, bound),
        reader.fleet(QueryKey.COMPUTED_COUNT, Unit.REQUESTS_PER_SECOND),
        Unit.RATIO,
        zero,
    )
    if share.value is not None and share.value > 1:  # float rounding of two rates
        share = Measured.known(1.0, Unit.RATIO)
    return share, bound


def quantile(reader: SeriesReader, q: float, key: QueryKey, rps: Measured) -> Measured:
    """The ``q``-quantile of ``key``'s buckets, as ``histogram_quantile(q, <key>)``
    would give it, qualified by the bucket it lies in; the reason when there is none."""
    if not reader.bucket_rates(key):
        return unknown(reader.absent(key), Unit.SECONDS)
    histogram = reader.histogram(key)
    if isinstance(histogram, Measured):
        return unknown(str(histogram.reason), Unit.SECONDS)
    if isinstance(histogram, NoQuantile):
        return unknown(_no_quantile(reader, key, histogram, rps), Unit.SECONDS)
    return _qualified(histogram.locate(q))


def _no_quantile(reader: SeriesReader, key: QueryKey, why: NoQuantile, rps: Measured) -> str:
    """Why ``key``'s buckets give no quantile (``histogram_quantile`` answers NaN)."""
    reads, selector = reader.reads(key), reader.selector
    if why is NoQuantile.NO_INF_BUCKET:
        return (
            f'{reads} has no le="+Inf" bucket for {selector} over the {reader.window} '
            "window: without the count of every observation there is no quantile"
        )
    if why is NoQuantile.NO_FINITE_BUCKET:
        return (
            f'{reads} has only its le="+Inf" bucket for {selector}: no finite bound '
            "to place a quantile at"
        )
    return no_traffic(rps, f"no observations of {reads}") or (
        f"{reads} has no observations in the window although {rps.value:.3g} requests/s finished"
    )


def _qualified(located: BucketQuantile) -> Measured:
    """The quantile as far as its bucket allows: a lower bound when its rank is past the
    last finite bucket (the value is then that bucket's bound), the value with its bucket
    when that bucket is wider than twice its lower edge, else the value."""
    if located.upper == math.inf:
        return Measured.quantile(located.value, Unit.SECONDS, lower_bound=True)
    if located.upper > 2 * located.lower:
        bucket = (located.lower, located.upper)
        return Measured.quantile(located.value, Unit.SECONDS, bucket=bucket)
    return Measured.known(located.value, Unit.SECONDS)
