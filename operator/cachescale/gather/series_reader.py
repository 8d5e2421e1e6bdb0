"""One policy's query results, read by the rules every signal shares.

Prometheus answers "nothing" in many ways, and each becomes an unknown with its reason
here, never a 0: an absent series names the series, the selector and the window (with a
hint where a common cause is known); NaN or ±Inf names the series. A fleet-level query
must return one series, a per-pod query at most one per pod: more is
``AmbiguousSeriesError``, since the selector then matches more than one deployment and
summing them would be wrong. Histogram buckets must be one group's, and a bound written
two ways is one bucket, as ``histogram_quantile`` merges them. A ratio is unknown when
either side is or when its denominator did not move, and ``no_traffic`` says whether that
was "no traffic".

Pure: results in, measurements out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from operator import itemgetter

from cachescale.gather.promql import Query, QueryKey, duration
from cachescale.gather.selector import POD_LABEL, ResultSeries, Selector
from cachescale.histogram import Cumulative, NoQuantile, prepare
from cachescale.snapshot import Measured, Unit

_RATE = Unit.REQUESTS_PER_SECOND
"""The unit of a bucket's rate."""
_ABSENT_HINTS = {
    QueryKey.HITS_EXTERNAL: " (no KV connector or storage tier configured?)",
    QueryKey.POD_AGE: " (is kube-state-metrics scraped?)",
    QueryKey.GPU_SECONDS: " (is kube-state-metrics scraped, with GPU requests on the pods?)",
    QueryKey.PODS_HOLDING_GPUS: " (is kube-state-metrics scraped?)",
}


def label_text(labels: Mapping[str, str]) -> str:
    """A label set as PromQL writes it, sorted: ``{model_name="a",namespace="llm"}``."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class AmbiguousSeriesError(Exception):
    """More than one series where one is expected: the selector is not specific enough."""

    def __init__(self, selector: Selector, reads: str, label_sets: Sequence[Mapping[str, str]]):
        self.label_sets = [dict(labels) for labels in label_sets]
        shown = ", ".join(label_text(labels) for labels in self.label_sets)
        super().__init__(
            f"selector {selector} matches {len(label_sets)} series of {reads} where one is "
            f"expected: {shown}; add labels to the selector so it picks one deployment"
        )


def unknown(reason: str, unit: Unit) -> Measured:
    """An unknown measurement with its reason."""
    return Measured.unknown(reason, unit)


def ratio(numerator: Measured, denominator: Measured, unit: Unit, zero_reason: str) -> Measured:
    """numerator / denominator, unknown if either is, or if the denominator is 0."""
    if numerator.value is None or denominator.value is None:
        return unknown(str(numerator.reason or denominator.reason), unit)
    if denominator.value == 0:
        return unknown(zero_reason, unit)
    return Measured.known(numerator.value / denominator.value, unit)


def no_traffic(rps: Measured, nothing: str) -> str | None:
    """Why ``nothing`` happened when the request rate is zero or unknown; None when
    requests did finish (the caller then names the series that should have moved).

    Zero finished requests is "no traffic"; an unknown rate is not, and the reason
    carries why it is unknown."""
    if rps.value is None:
        return f"{nothing} in the window, and the request rate is unknown: {rps.reason}"
    if rps.value == 0:
        return f"no traffic: {nothing} in the window"
    return None


class SeriesReader:
    """One policy's (already split) query results, read by the rules above."""

    def __init__(
        self,
        selector: Selector,
        window_seconds: float,
        queries: Mapping[QueryKey, Query],
        results: Mapping[QueryKey, Sequence[ResultSeries]],
    ) -> None:
        self.selector = selector
        self.window = duration(window_seconds)
        """The window as PromQL writes it, for reasons."""
        self._queries = queries
        self._results = results
        self._parsed_buckets: dict[QueryKey, dict[float, float | Measured]] = {}
        self._histograms: dict[QueryKey, Cumulative | NoQuantile | Measured] = {}
        self._fleet: dict[tuple[QueryKey, Unit], Measured] = {}

    def queried(self, key: QueryKey) -> bool:
        """Whether the batch held ``key``'s query (some exist for one engine only)."""
        return key in self._queries

    def series(self, key: QueryKey) -> Sequence[ResultSeries]:
        """``key``'s series as returned, none when it returned nothing."""
        return self._results.get(key, ())

    def reads(self, key: QueryKey) -> str:
        """The series ``key``'s query reads, as reasons name it."""
        return self._queries[key].reads

    def absent(self, key: QueryKey) -> str:
        """Why ``key`` is unknown when its query returned nothing."""
        return (
            f"{self.reads(key)} has no data for {self.selector} over the "
            f"{self.window} window{_ABSENT_HINTS.get(key, '')}"
        )

    def finite(self, key: QueryKey, value: float, unit: Unit) -> Measured:
        """``value`` when finite, else unknown naming ``key``'s series."""
        if math.isfinite(value):
            return Measured.known(value, unit)
        return unknown(f"Prometheus returned {value} for {self.reads(key)}", unit)

    def fleet(self, key: QueryKey, unit: Unit) -> Measured:
        """The single series a fleet-level query must return (read once per key and
        unit: several signals divide by the same one)."""
        found = self._fleet.get((key, unit))
        if found is None:
            found = self._fleet[key, unit] = self._single(key, unit)
        return found

    def _single(self, key: QueryKey, unit: Unit) -> Measured:
        series = self._results.get(key, ())
        if len(series) > 1:
            raise AmbiguousSeriesError(self.selector, self.reads(key), [s.labels for s in series])
        if not series:
            return unknown(self.absent(key), unit)
        return self.finite(key, series[0].value, unit)

    def per_pod(self, key: QueryKey, unit: Unit) -> dict[str, Measured]:
        """One value per pod (pods missing from the result are left out)."""
        by_pod: dict[str, Measured] = {}
        for s in self._results.get(key, ()):
            pod = s.labels.get(POD_LABEL, "")
            if pod in by_pod:
                duplicates = [
                    x.labels for x in self._results[key] if x.labels.get(POD_LABEL, "") == pod
                ]
                raise AmbiguousSeriesError(self.selector, self.reads(key), duplicates)
            by_pod[pod] = self.finite(key, s.value, unit)
        return by_pod

    def bucket(self, key: QueryKey, bound: float) -> Measured:
        """The rate of ``key``'s bucket at ``bound`` (one of ``bucket_rates``')."""
        rate = self.bucket_rates(key)[bound]
        return rate if isinstance(rate, Measured) else Measured.known(rate, _RATE)

    def bucket_rates(self, key: QueryKey) -> dict[float, float | Measured]:
        """Bucket bound → rate, from a ``sum by (..., le)`` result of one group (``+Inf``
        included), or the unknown rate of a bucket that is NaN or ±Inf; read once per key
        (the TTFT buckets serve three quantiles)."""
        if key not in self._parsed_buckets:
            self._parsed_buckets[key] = self._read_buckets(key)
        return self._parsed_buckets[key]

    def histogram(self, key: QueryKey) -> Cumulative | NoQuantile | Measured:
        """``key``'s buckets ready for quantiles (``histogram.prepare``) or why they have
        none; or the first unknown rate (in the order the bounds were read), as a quantile
        needs them all. Once per key: the TTFT buckets serve three quantiles."""
        if key not in self._histograms:
            rates: dict[float, float] = {}
            for bound, rate in self.bucket_rates(key).items():
                if isinstance(rate, Measured):
                    self._histograms[key] = rate
                    break
                rates[bound] = rate
            else:
                self._histograms[key] = prepare(rates.items())
        return self._histograms[key]

    def _read_buckets(self, key: QueryKey) -> dict[float, float | Measured]:
        """Every bound of ``key``'s buckets but NaN, -Inf and an ``le`` that is no number
        (``histogram_quantile`` skips it too), after checking they are one group's (the
        label sets compared without ``le``, as ``label_text`` shows them). A bound written
        two ways (``1`` and ``1.0``, by two client versions) is one bucket: its rates are
        added, as ``histogram_quantile`` merges equal bounds. A known rate is kept as its
        float (a ``Measured`` per series would be most of a read's cost)."""
        series = self._results.get(key, ())
        if series and not _one_group(series):
            groups = [{k: v for k, v in s.labels.items() if k != "le"} for s in series]
            if any(g != groups[0] for g in groups) and len(set(map(label_text, groups))) > 1:
                raise AmbiguousSeriesError(
                    self.selector,
                    self.reads(key),
                    [s.labels for s in series if s.labels.get("le") == "+Inf"],
                )
        buckets: dict[float, float | Measured] = {}
        for s in series:
            bound = _bound(s.labels.get("le", ""))
            if bound is not None:
                finite = math.isfinite(s.value)
                rate = float(s.value) if finite else self.finite(key, s.value, _RATE)
                buckets[bound] = _sum(buckets[bound], rate) if bound in buckets else rate
        return buckets


def _one_group(series: Sequence[ResultSeries]) -> bool:
    """Whether every series has the first one's labels but ``le``: a quick yes for the
    usual case (False: not known so quickly; compare the label sets themselves)."""
    first = series[0].labels
    names = [name for name in first if name != "le"]
    if not names:
        return False
    values_of = itemgetter(*names)
    size, has_le, values = len(first), "le" in first, values_of(first)
    for s in series:
        labels = s.labels
        if len(labels) != size or ("le" in labels) != has_le:
            return False
        try:
            if values_of(labels) != values:
                return False
        except KeyError:
            return False
    return True


@lru_cache(maxsize=1024)
def _bound(le: str) -> float | None:
    """A bucket's ``le`` label as a number; None when it is none, NaN or -Inf (a bucket
    ``histogram_quantile`` skips). Cached: a fleet's histograms share a few bounds."""
    try:
        bound = float(le)
    except ValueError:
        return None
    return bound if math.isfinite(bound) or bound == math.inf else None


def _sum(first: float | Measured, second: float | Measured) -> float | Measured:
    """Two rates added; the first unknown one if either is."""
    if isinstance(first, Measured) or isinstance(second, Measured):
        return first if isinstance(first, Measured) else second
    added = Measured.known(first + second, _RATE)  # raises past the largest float, as ever
    assert added.value is not None
    return added.value
