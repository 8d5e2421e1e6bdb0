"""Per-pod signals and each engine's cache configuration, from one policy's results.

Every pod the engines' series name gets its age, token hit rate, lookup volume, queue,
batch and KV usage; a value that cannot be read is unknown with the reason, and a pod
seen in too few samples for a rate has its rates unknown (a new pod). Series without a
``pod`` label give no per-pod signals at all, with a note saying how to add it. Ages come
from the Kubernetes API when the caller has them, else from kube-state-metrics when asked
to read it. The cache configuration is vLLM's ``cache_config_info`` labels per engine; a
label that is absent or unreadable is None, never a default.

Pure: a ``SeriesReader`` in, signals out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cachescale.gather.engine_series import VLLM_CACHE_CONFIG
from cachescale.gather.promql import QueryKey
from cachescale.gather.selector import POD_LABEL
from cachescale.gather.series_reader import SeriesReader, ratio, unknown
from cachescale.snapshot import CacheConfig, EngineCacheConfig, Measured, PodSignals, Unit


def pod_signals(
    reader: SeriesReader,
    samples: Mapping[str, Measured],
    min_samples: int,
    ages_given: Mapping[str, float] | None,
    kube_state_metrics: bool,
) -> tuple[tuple[PodSignals, ...], str]:
    """Per-pod signals, or none and the reason when the series carry no pod label.

    ``samples`` is each pod's sample count; ``ages_given`` the pods' ages from the
    Kubernetes API (None: read them from kube-state-metrics if ``kube_state_metrics``)."""
    if "" in samples:
        return (), (
            f"engine series carry no '{POD_LABEL}' label, so per-pod signals are "
            "unavailable: add it in the scrape config (a PodMonitor does)"
        )
    hits = reader.per_pod(QueryKey.POD_HITS, Unit.TOKENS_PER_SECOND)
    looked_up = reader.per_pod(QueryKey.POD_LOOKED_UP, Unit.TOKENS_PER_SECOND)
    waiting = reader.per_pod(QueryKey.POD_WAITING, Unit.REQUESTS)
    running = reader.per_pod(QueryKey.POD_RUNNING, Unit.REQUESTS)
    kv_usage = reader.per_pod(QueryKey.POD_KV_USAGE, Unit.RATIO)
    ages = _ages(reader, sorted(samples), ages_given, kube_state_metrics)
    pods = []
    for pod in sorted(samples):
        count = samples[pod].value
        if count is None or count < min_samples:
            reason = (
                f"this pod's sample count could not be read ({samples[pod].reason}); a "
                f"rate needs {min_samples}"
                if count is None
                else f"only {count:g} sample(s) of this pod in the window (new pod?); a "
                f"rate needs {min_samples}"
            )
            hit_rate = unknown(reason, Unit.RATIO)
            volume = unknown(reason, Unit.TOKENS_PER_SECOND)
        else:
            missing = unknown(
                f"{reader.reads(QueryKey.POD_HITS)} has no data for pod {pod}",
                Unit.TOKENS_PER_SECOND,
            )
            volume = looked_up.get(pod, missing)
            hit_rate = ratio(
                hits.get(pod, missing),
                volume,
                Unit.RATIO,
                "no prompt tokens were looked up on this pod in the window",
            )
        absent = f"no samples for pod {pod} in the window"
        pods.append(
            PodSignals(
                pod=pod,
                age_seconds=ages[pod],
                token_hit_rate=hit_rate,
                prompt_tokens_looked_up_per_second=volume,
                waiting_requests=waiting.get(pod, unknown(absent, Unit.REQUESTS)),
                running_requests=running.get(pod, unknown(absent, Unit.REQUESTS)),
                kv_cache_usage_ratio=kv_usage.get(pod, unknown(absent, Unit.RATIO)),
            )
        )
    return tuple(pods), ""


def _ages(
    reader: SeriesReader,
    pods: Sequence[str],
    given: Mapping[str, float] | None,
    kube_state_metrics: bool,
) -> dict[str, Measured]:
    """Pod ages from the Kubernetes API if given, else from kube-state-metrics."""
    if given is not None:
        missing = "not among the pods the Kubernetes API listed (terminated?)"
        return {
            pod: Measured.known(given[pod], Unit.SECONDS)
            if pod in given
            else unknown(missing, Unit.SECONDS)
            for pod in pods
        }
    if kube_state_metrics:
        found = reader.per_pod(QueryKey.POD_AGE, Unit.SECONDS)
        absent = reader.absent(QueryKey.POD_AGE)
        return {pod: found.get(pod, unknown(absent, Unit.SECONDS)) for pod in pods}
    reason = "pod ages not given (from the Kubernetes API) and kube-state-metrics not used"
    return {pod: unknown(reason, Unit.SECONDS) for pod in pods}


def mean_per_pod(pods: Sequence[PodSignals], attribute: str, pod_note: str) -> Measured:
    """Mean of a per-pod gauge; unknown if any pod's value is."""
    if not pods:
        return unknown(pod_note or "no pods", Unit.REQUESTS)
    values = []
    for pod in pods:
        measured: Measured = getattr(pod, attribute)
        if measured.value is None:
            return unknown(f"pod {pod.pod}: {measured.reason}", Unit.REQUESTS)
        values.append(measured.value)
    return Measured.known(sum(values) / len(values), Unit.REQUESTS)


def cache_config(reader: SeriesReader) -> CacheConfig:
    """Each engine's ``vllm:cache_config_info`` labels; a label that is absent or
    unreadable is None (an older vLLM exports no hash algorithm), never a default."""
    if not reader.queried(QueryKey.POD_CACHE_CONFIG):
        return CacheConfig.unknown(
            "SGLang exports no cache configuration metric (no equivalent of "
            f"{VLLM_CACHE_CONFIG}): its hash algorithm cannot be read"
        )
    series = reader.series(QueryKey.POD_CACHE_CONFIG)
    if not series:
        return CacheConfig.unknown(f"{VLLM_CACHE_CONFIG} has no data for {reader.selector}")
    engines = sorted(
        (_engine_cache_config(s.labels) for s in series),
        key=lambda e: (e.pod, str(e.hash_algo), str(e.prefix_caching), e.block_size or 0),
    )
    return CacheConfig(engines=tuple(engines))


def _engine_cache_config(labels: Mapping[str, str]) -> EngineCacheConfig:
    """One ``vllm:cache_config_info`` series as settings (Python's ``str`` of the values:
    ``True``/``False``, ``16``)."""
    caching = {"True": True, "False": False}.get(labels.get("enable_prefix_caching", ""))
    size = labels.get("block_size", "")
    return EngineCacheConfig(
        pod=labels.get(POD_LABEL, ""),
        hash_algo=labels.get("prefix_caching_hash_algo") or None,
        prefix_caching=caching,
        block_size=int(size) if size.isdigit() else None,
    )
