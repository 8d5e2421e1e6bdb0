"""Which metric generation an engine's series belong to, from the series that exist.

The formulas differ between generations (vLLM 0.9.2 to 0.12, vLLM 0.13 and newer, SGLang
0.5.20 and newer), so every evaluation first asks which generation-marking series exist
for its selector (``detection_query``, one count per name and group) and picks the
profile from the answer (``detect_profile``). A fleet where only some engines export the
newer histogram (a rollout in progress) is read with the older formulas, with a note; an
engine too old to read, or no engine at all, gives no profile and the reason.

Pure: builds the query text and interprets its answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cachescale.api.engine_metrics import (
    SGLANG_PREFILL_EFFECTIVE_TOKENS,
    VLLM_LEGACY_PREFIX_CACHE_QUERIES,
)
from cachescale.api.spec import Engine
from cachescale.gather.engine_series import SGLANG, VLLM, VLLM_COMPUTED
from cachescale.gather.selector import QueryScope, ResultSeries, Selector, escape_regex
from cachescale.snapshot import MetricsGeneration

# Series whose presence tells the engine generation apart.
_VLLM_HISTOGRAM = VLLM_COMPUTED + "_count"
_VLLM_COUNTERS = VLLM.looked_up.metric
_VLLM_LEGACY = VLLM_LEGACY_PREFIX_CACHE_QUERIES
_SGLANG_EFFECTIVE = SGLANG_PREFILL_EFFECTIVE_TOKENS
_SGLANG_RUNNING = SGLANG.running
_MARKERS = {
    Engine.VLLM: (_VLLM_HISTOGRAM, _VLLM_COUNTERS, _VLLM_LEGACY),
    Engine.SGLANG: (_SGLANG_EFFECTIVE, _SGLANG_RUNNING),
}


def detection_query(engine: Engine, scope: QueryScope) -> str:
    """How many series of each generation-marking metric exist, per group."""
    names = "|".join(escape_regex(name) for name in _MARKERS[engine])
    matchers = ",".join(part for part in (f'__name__=~"{names}"', scope.matchers) if part)
    return f"count by (__name__, {', '.join(scope.group_by)}) ({{{matchers}}})"


@dataclass(frozen=True)
class Detection:
    """The profile chosen from the series that exist, or why none could be."""

    profile: MetricsGeneration | None
    reason: str = ""
    """Why no profile (when ``profile`` is None)."""
    notes: tuple[str, ...] = ()


def detect_profile(engine: Engine, selector: Selector, series: Iterable[ResultSeries]) -> Detection:
    """Interpret ``detection_query``'s results for one selector."""
    counts: dict[str, float] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        counts[name] = counts.get(name, 0.0) + s.value
    if engine is Engine.SGLANG:
        return _detect_sglang(selector, counts)
    return _detect_vllm(selector, counts)


def _detect_vllm(selector: Selector, counts: Mapping[str, float]) -> Detection:
    histograms, counters = counts.get(_VLLM_HISTOGRAM, 0.0), counts.get(_VLLM_COUNTERS, 0.0)
    if counters == 0:
        if counts.get(_VLLM_LEGACY, 0.0) > 0:
            return Detection(
                None,
                f"only {_VLLM_LEGACY} matches {selector}: vLLM older than 0.9.2 is not supported",
            )
        return Detection(
            None,
            f"no vLLM series match {selector} ({_VLLM_COUNTERS} is absent): check the "
            "selector, the scrape config and that the engine is up",
        )
    if histograms == 0:
        return Detection(MetricsGeneration.VLLM_0_9_2)
    if histograms < counters:
        note = (
            f"only {histograms:g} of {counters:g} engines export {VLLM_COMPUTED} (mixed "
            "vLLM versions, e.g. mid-rollout): using the vLLM 0.9.2-0.12 formulas"
        )
        return Detection(MetricsGeneration.VLLM_0_9_2, notes=(note,))
    return Detection(MetricsGeneration.VLLM_0_13)


def _detect_sglang(selector: Selector, counts: Mapping[str, float]) -> Detection:
    if counts.get(_SGLANG_EFFECTIVE, 0.0) > 0:
        return Detection(MetricsGeneration.SGLANG_0_5_20)
    if counts.get(_SGLANG_RUNNING, 0.0) > 0:
        return Detection(
            None,
            f"SGLang older than 0.5.20 at {selector}: {_SGLANG_EFFECTIVE} is absent and a "
            "windowed hit rate needs it (the sglang:cache_hit_rate gauge covers only the "
            "last batch); upgrade SGLang",
        )
    return Detection(
        None,
        f"no SGLang series match {selector} ({_SGLANG_RUNNING} is absent): check the "
        "selector, the scrape config and that SGLang runs with --enable-metrics",
    )
