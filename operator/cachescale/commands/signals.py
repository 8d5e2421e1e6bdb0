"""``cachescale signals``: print the engine signals the operator would read from Prometheus.

This is the first thing to run when something looks wrong, so it shows every signal with
its unit or, when unknown, the reason — the same snapshot the decision layer gets. Input
is validated before any request (the selector is parsed as ``name="value"`` pairs only,
so nothing can be spliced into PromQL), and Prometheus failures end in one line on
stderr, never a traceback. ``--timeout`` is one deadline for the whole read, every query
and retry together (``gather/deadline.py``); the line says how long was actually spent.

Exit codes: 0 the signals were read (some may be unknown), 1 invalid input (an unreadable
token or CA file, a selector that matches more than one deployment, or the operator extra
not installed), 2 usage error (a flag missing, malformed or out of range: a URL without a
scheme, a bad selector or window, each reported with the flag's name), 3 Prometheus could
not be read (unreachable, timed out, bad response, query rejected). Only ``run`` imports
the HTTP client, so registering the subcommand costs the CLI nothing when
``prometheus-api-client`` is not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import ValidationError

from cachescale.api.spec import Engine, MetricsSpec
from cachescale.api.validation import decode, field_path, plain_message
from cachescale.commands.flags import non_negative_number, positive_number
from cachescale.exit_codes import ExitCode
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import Selector, SelectorError
from cachescale.gather.signals import AmbiguousSeriesError, SignalRequest
from cachescale.snapshot import (
    DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
    CacheConfig,
    EngineSignals,
    Measured,
    PodSignals,
    Unit,
)

if TYPE_CHECKING:
    from cachescale.gather.prometheus import PrometheusConfig


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


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def evaluation_time(text: str) -> datetime:
    """A ``--at`` value: ISO 8601 (UTC when no zone is given) or Unix seconds."""
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ISO 8601 nor Unix seconds"
        ) from error
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cachescale signals``."""
    parser = subparsers.add_parser(
        "signals",
        help="read the cache, latency and cost signals of one deployment from Prometheus",
        description=(
            "Print every signal the operator would read for the engine series matching "
            "SELECTOR, with its unit, or 'unknown' and why. Exit codes: 0 read, 1 invalid "
            "input, 2 usage error, 3 Prometheus could not be read."
        ),
    )
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL")
    parser.add_argument("--engine", required=True, choices=[e.value for e in Engine])
    parser.add_argument(
        "--selector",
        required=True,
        help='label matchers, e.g. \'namespace="llm",model_name="llama-3-8b"\' (only name="value")',
    )
    parser.add_argument("--window", default="5m", help="rate and quantile window (default 5m)")
    parser.add_argument(
        "--demand-query",
        metavar="PROMQL",
        help="PromQL for the arrival rate (one series, req/s), e.g. a gateway's request "
        "counter; replaces the estimate from the engines (a policy's metrics.demandQuery)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--bearer-token-file", metavar="FILE", help="file holding a bearer token")
    parser.add_argument("--ca-file", metavar="FILE", help="PEM CA bundle to verify TLS with")
    parser.add_argument(
        "--insecure-skip-verify", action="store_true", help="do not verify TLS (test clusters)"
    )
    parser.add_argument(
        "--gpus-per-pod", type=_positive_int, metavar="N", help="GPUs each pod requests"
    )
    parser.add_argument("--replicas", type=_positive_int, metavar="N", help="ready replicas")
    parser.add_argument(
        "--kube-state-metrics",
        action="store_true",
        help="read pod ages and GPU-seconds from kube-state-metrics",
    )
    parser.add_argument(
        "--full-hit-max-computed-tokens",
        type=non_negative_number,
        default=DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
        metavar="N",
        help="a request computing at most N prompt tokens is a full hit (default %(default)g)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_number,
        default=10.0,
        metavar="SECONDS",
        help="time allowed for the whole read, all queries and retries together: one "
        "deadline, not a timeout per query (default %(default)g)",
    )
    parser.add_argument(
        "--at",
        type=evaluation_time,
        metavar="TIME",
        help="evaluate at TIME (ISO 8601 or Unix seconds) instead of now, e.g. to look back "
        "at an incident",
    )
    parser.set_defaults(handler=run)


def _invalid(message: str) -> int:
    print(f"cachescale signals: {message}", file=sys.stderr)
    return ExitCode.INVALID


def _usage(message: str) -> int:
    print(f"cachescale signals: {message}", file=sys.stderr)
    return ExitCode.USAGE


def _check_url(url: str) -> None:
    """``ValueError`` in a user's words when ``--prometheus`` is not an http(s) URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError as error:
        raise ValueError(f"--prometheus {url!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--prometheus {url!r} is not an http:// or https:// URL; write the scheme and "
            "host, e.g. http://prometheus.monitoring:9090"
        )


def prometheus_url(text: str) -> str:
    """An argparse type for a ``--prometheus`` flag: an http(s) URL, or exit 2 saying so."""
    try:
        _check_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--prometheus ")) from None
    return text


def client_config(args: argparse.Namespace) -> PrometheusConfig:
    """The client settings from the connection flags; raises ``ValueError`` or
    ``OSError`` on bad input."""
    from cachescale.gather.prometheus import PrometheusConfig

    token = None
    if args.bearer_token_file is not None:
        try:
            token = decode(Path(args.bearer_token_file).read_bytes()).strip()
        except ValueError as error:
            raise ValueError(f"{args.bearer_token_file}: {error}") from None
        if not token:
            raise ValueError(f"{args.bearer_token_file} is empty")
    if args.ca_file is not None:
        Path(args.ca_file).open("rb").close()  # OSError naming the file, before any request
    return PrometheusConfig(
        url=args.prometheus,
        timeout_seconds=args.timeout,
        bearer_token=token,
        ca_file=args.ca_file,
        verify_tls=not args.insecure_skip_verify,
    )


def _request(args: argparse.Namespace) -> SignalRequest:
    """The signal request; raises ``ValueError`` (incl. pydantic's) on bad input."""
    _check_url(args.prometheus)
    selector = Selector.parse(args.selector)
    metrics = MetricsSpec(
        prometheus_url=args.prometheus,
        selector=dict(selector.labels),
        window=args.window,
        demand_query=args.demand_query,
    )
    if (args.gpus_per_pod is None) != (args.replicas is None):
        raise ValueError("give --gpus-per-pod and --replicas together")
    return SignalRequest(
        engine=Engine(args.engine),
        selector=selector,
        window_seconds=metrics.window_seconds,
        full_hit_max_computed_tokens=args.full_hit_max_computed_tokens,
        gpus_per_pod=args.gpus_per_pod,
        ready_replicas=args.replicas,
        kube_state_metrics=args.kube_state_metrics,
        demand_query=metrics.demand_query,
    )


_FLAGS = {
    "prometheus_url": "--prometheus",
    "selector": "--selector",
    "window": "--window",
    "demand_query": "--demand-query",
}
"""The flag each MetricsSpec field comes from, to name it in an error."""


def _validation_message(error: ValidationError) -> str:
    messages = []
    for detail in error.errors(include_url=False):
        where = field_path(detail["loc"])
        flag = _FLAGS.get(where.split(".")[0], where)
        messages.append(f"{flag}: {plain_message(detail)}")
    return "; ".join(messages)


def run(args: argparse.Namespace) -> int:
    """Handle ``cachescale signals``; return the exit code."""
    try:  # the HTTP client comes with the operator extra; the rest of the CLI needs none
        from cachescale.gather.prometheus import PrometheusClient, PrometheusError
    except ImportError as error:
        return _invalid(f"needs {error.name}: pip install 'cachescale[operator]'")
    try:
        request = _request(args)
    except ValidationError as error:
        return _usage(_validation_message(error))
    except SelectorError as error:
        return _usage(f"--selector: {error}")
    except ValueError as error:
        return _usage(str(error))
    try:
        config = client_config(args)
    except OSError as error:
        return _invalid(f"{error.filename}: {error.strerror}")
    except ValueError as error:
        return _invalid(str(error))
    try:
        with PrometheusClient(config) as client:
            snapshot = gather_signals(client, request, args.at)
    except PrometheusError as error:
        print(error, file=sys.stderr)
        return ExitCode.UNAVAILABLE
    except AmbiguousSeriesError as error:
        return _invalid(str(error))
    if args.json:
        print(json.dumps(snapshot_json(snapshot, request.selector), indent=2))
    else:
        print(render_table(snapshot, request.selector))
    return ExitCode.OK


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
