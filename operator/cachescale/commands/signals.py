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
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from cachescale.api.spec import Engine, MetricsSpec
from cachescale.api.validation import decode, field_path, plain_message
from cachescale.commands.flags import (
    check_url,
    evaluation_time,
    non_negative_number,
    positive_number,
)
from cachescale.commands.signals_output import render_table, snapshot_json
from cachescale.exit_codes import ExitCode
from cachescale.extras import needs_extra
from cachescale.gather.reading import gather_signals
from cachescale.gather.selector import Selector, SelectorError
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import SignalRequest
from cachescale.snapshot import (
    DEFAULT_FULL_HIT_MAX_COMPUTED_TOKENS,
)

if TYPE_CHECKING:
    from cachescale.gather.prometheus import PrometheusConfig


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


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
    parser.add_argument(
        "--replicas",
        type=_positive_int,
        metavar="N",
        help="pods holding GPUs, starting ones included (the Deployment's status.replicas)",
    )
    parser.add_argument(
        "--kube-state-metrics",
        action="store_true",
        help="read pod ages and GPU-seconds from kube-state-metrics (the GPU-seconds then "
        "come from there, not from --gpus-per-pod and --replicas)",
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
    check_url(args.prometheus)
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
        pods_holding_gpus=args.replicas,
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
        from cachescale.gather.prometheus import PrometheusClient
        from cachescale.gather.prometheus_errors import PrometheusError
    except ImportError as error:
        return _invalid(needs_extra(str(error.name), "operator"))
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
