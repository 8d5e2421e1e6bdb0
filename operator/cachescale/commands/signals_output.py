"""How ``cachescale signals`` shows a snapshot: a table for a person, JSON for a script.

Every signal is shown with its unit or, when unknown, ``unknown: <reason>`` (JSON:
``"value": null`` and the reason), never a 0 that was not measured. A quantile past its
histogram's last finite bucket is shown as a lower bound, one in a wide bucket with that
bucket. Then one line per pod, the engines' cache configuration and the notes.
``cachescale report`` writes its signals with the same ``measured_json``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from cachescale.gather.selector import Selector
from cachescale.snapshot import CacheConfig, EngineSignals, Measured, PodSignals, Unit

_LABELS = {
    "token_hit_rate_local": "token hit rate, local (token-weighted)",
    "token_hit_rate_with_external": "token hit rate, local + external",
    "request_full_hit_share": "full-hit share (request-weighted)",
    "prefill_tokens_per_request": "prefill tokens computed per request",
    "ttft_p50_seconds": "TTFT p50",
    "ttft_p95_seconds": "TTFT p95",
    "ttft_p99_seconds": "TTFT p99",
    "itl_p95_seconds": "inter-token latency p95",
    "requests_per_second": "successful requests per second (served)",
    "arrivals_per_second": "arriving requests per second (offered)",
    "preemptions_per_second": "preemptions per second",
    "waiting_requests_per_pod": "waiting requests per pod",
    "running_requests_per_pod": "running requests per pod",
    "kv_cache_usage_ratio": "KV cache usage",
    "gpu_seconds_per_1k_requests": "GPU-seconds per 1k requests",
    "context_tokens_per_request": "context tokens per request (prompt + output)",
}
_POD_COLUMNS = (
    ("age", "age_seconds"),
    ("hit rate", "token_hit_rate"),
    ("waiting", "waiting_requests"),
    ("running", "running_requests"),
    ("KV usage", "kv_cache_usage_ratio"),
)


def measured_json(measured: Measured) -> dict[str, object]:
    """One signal as JSON-ready data: ``value`` (null when unknown), ``unit``, ``reason``."""
    out: dict[str, object] = {
        "value": measured.value,
        "unit": measured.unit.value,
        "reason": measured.reason,
    }
    if measured.lower_bound:
        out["lower_bound"] = True  # the true value is above "value"
    if measured.bucket is not None:
        out["bucket"] = list(measured.bucket)
    return out


def _pod_json(pod: PodSignals) -> dict[str, object]:
    out: dict[str, object] = {"pod": pod.pod}
    for _, attribute in _POD_COLUMNS:
        out[attribute] = measured_json(getattr(pod, attribute))
    out["prompt_tokens_looked_up_per_second"] = measured_json(
        pod.prompt_tokens_looked_up_per_second
    )
    return out


def snapshot_json(snapshot: EngineSignals, selector: Selector) -> dict[str, object]:
    """The snapshot as JSON-ready data; unknown signals have ``value: null`` and a reason."""
    return {
        "selector": str(selector),
        "profile": snapshot.profile.value if snapshot.profile else None,
        "observed_at": snapshot.observed_at.isoformat(),
        "window_seconds": snapshot.window_seconds,
        "full_hit_max_computed_tokens": snapshot.full_hit_max_computed_tokens,
        "signals": {name: measured_json(m) for name, m in snapshot.signals().items()},
        "pods": [_pod_json(pod) for pod in snapshot.pods],
        "cache_config": {
            "engines": [dataclasses.asdict(e) for e in snapshot.cache_config.engines],
            "reason": snapshot.cache_config.reason,
        },
        "notes": list(snapshot.notes),
        "failure": snapshot.failure.value if snapshot.failure else None,
    }


def cache_config_line(config: CacheConfig) -> str:
    """``cache config: sha256, prefix caching on, block size 16 (2 engines)``, one clause
    per distinct setting, or ``unknown: reason``."""
    if config.reason is not None:
        return f"cache config: unknown: {config.reason}"
    counts = Counter(
        (e.hash_algo or "hash not exported", e.prefix_caching, e.block_size) for e in config.engines
    )
    caching = {True: "prefix caching on", False: "prefix caching OFF", None: "prefix caching ?"}
    clauses = [
        f"{algo}, {caching[on]}, block size {size if size is not None else '?'} ({n} engine"
        f"{'s' if n != 1 else ''})"
        for (algo, on, size), n in sorted(counts.items(), key=str)
    ]
    return "cache config: " + "; ".join(clauses)


def format_value(measured: Measured) -> str:
    """``0.853 (85.3%)``, ``1.42 s``, ``> 400 s (...)``, ``1.42 s (bucket 1–2.5 s)``, or
    ``unknown: reason``."""
    if measured.value is None:
        return f"unknown: {measured.reason}"
    value = measured.value
    if measured.unit is Unit.RATIO:
        return f"{value:.3f} ({value:.1%})"
    if measured.lower_bound:
        return (
            f"> {value:.4g} {measured.unit.value} (past the histogram's last finite bucket: "
            "only a lower bound is known)"
        )
    if measured.bucket is not None:
        low, high = measured.bucket
        return f"{value:.4g} {measured.unit.value} (bucket {low:,g}–{high:,g} s)"
    return f"{value:.4g} {measured.unit.value}"


def _short(measured: Measured) -> str:
    if measured.value is None:
        return "?"
    if measured.unit is Unit.SECONDS:
        return f"{measured.value:.0f}s"
    if measured.unit is Unit.RATIO:
        return f"{measured.value:.3f}"
    return f"{measured.value:.3g}"


def _label(name: str, snapshot: EngineSignals) -> str:
    label = _LABELS[name]
    if name == "request_full_hit_share" and snapshot.full_hit_max_computed_tokens is not None:
        label += f", <= {snapshot.full_hit_max_computed_tokens:g} tokens computed"
    return label


def _pod_lines(pods: tuple[PodSignals, ...]) -> list[str]:
    header = ["pod", *(title for title, _ in _POD_COLUMNS)]
    rows = [[pod.pod, *(_short(getattr(pod, a)) for _, a in _POD_COLUMNS)] for pod in pods]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    reasons = sorted(
        {
            f"  ? {pod.pod} {title}: {getattr(pod, a).reason}"
            for pod in pods
            for title, a in _POD_COLUMNS
            if getattr(pod, a).reason is not None
        }
    )
    return ["", *lines, *reasons]


def render_table(snapshot: EngineSignals, selector: Selector) -> str:
    """The human-readable report: one signal per line, then one line per pod."""
    profile = snapshot.profile.value if snapshot.profile else "no engine profile"
    lines = [
        f"signals for {selector} ({profile}, window {snapshot.window_seconds:g}s, "
        f"at {snapshot.observed_at.isoformat(timespec='seconds')})",
        "",
    ]
    signals = snapshot.signals()
    width = max(len(_label(name, snapshot)) for name in signals)
    lines += [
        f"{_label(name, snapshot).ljust(width)}  {format_value(m)}" for name, m in signals.items()
    ]
    if snapshot.pods:
        lines += _pod_lines(snapshot.pods)
    lines += ["", cache_config_line(snapshot.cache_config)]
    lines += [f"note: {note}" for note in snapshot.notes]
    return "\n".join(lines)
