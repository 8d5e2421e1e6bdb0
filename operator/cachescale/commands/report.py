"""``cachescale report``: the cost around a moment, window by window, with a verdict.

The flags and the run: it reads ``gather/report.py``'s rows and hands them to
``commands/report_output.py`` to print (a table, Markdown, JSON or CSV, and optionally a
PNG). It follows ``cachescale signals``' rules: flags checked by argparse types (a bad one
is exit 2 naming it), the selector parsed as ``name="value"`` pairs only, one line on
stderr for any failure (1 invalid input, 3 Prometheus or the API server unreadable), and
the HTTP client imported only in ``run``, so registering the subcommand costs the CLI
nothing. ``--timeout`` is one deadline per window: each window is one signals evaluation.

``--around policy/NAME`` reads the policy from the API server
(``commands/report_policy.py``; the Kubernetes client is imported only then), centres on
its last collapse (``report_around.collapse_centre``) and takes ``--prometheus``,
``--selector`` and ``--engine`` from its spec when not given.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from cachescale.api.spec import Engine
from cachescale.commands import report_output
from cachescale.commands.flags import (
    duration_seconds,
    evaluation_time,
    output_folder,
    positive_number,
    prometheus_url,
)
from cachescale.commands.report_around import (
    PolicyReadError,
    PolicyRef,
    collapse_centre,
    namespace_name,
    no_collapse,
    policy_ref,
    sources,
)
from cachescale.commands.report_policy import read_policy
from cachescale.commands.signals import client_config
from cachescale.exit_codes import ExitCode
from cachescale.extras import missing_extra, needs_extra
from cachescale.gather.report import (
    caveats,
    read_report,
    verdict,
    windows,
)
from cachescale.gather.selector import Selector, SelectorError
from cachescale.gather.series_reader import AmbiguousSeriesError
from cachescale.gather.signals import SignalRequest

FORMATS = ("table", "markdown", "json", "csv")
PNG_NAME = "report.png"


def _step(text: str) -> float:
    seconds = duration_seconds(text)
    if seconds < 60:
        raise argparse.ArgumentTypeError(f"{text!r} is under a minute; rates need longer")
    return seconds


def _gpus(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def _around(text: str) -> datetime | PolicyRef:
    if text.startswith("policy/"):
        return policy_ref(text)
    return evaluation_time(text)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cachescale report``."""
    parser = subparsers.add_parser(
        "report",
        help="hit rate, TTFT, replicas and cost per window around a moment, with a verdict",
        description=(
            "Print one row of signals per --step window from --around minus --before to "
            "--around plus --after, read from Prometheus history with the operator's own "
            "queries, then a verdict in words. Exit codes: 0 read, 1 invalid input, 2 usage "
            "error, 3 Prometheus or the API server could not be read."
        ),
    )
    parser.add_argument(
        "--prometheus",
        type=prometheus_url,
        metavar="URL",
        help="Prometheus base URL (default with policy/NAME: the policy's metrics.prometheusUrl)",
    )
    parser.add_argument(
        "--engine",
        choices=[e.value for e in Engine],
        help="default with policy/NAME: the policy's target.engine",
    )
    parser.add_argument(
        "--selector",
        help='label matchers, e.g. \'namespace="llm",model_name="llama-3-8b"\' (only '
        'name="value"; default with policy/NAME: the policy\'s metrics.selector)',
    )
    parser.add_argument(
        "--around",
        required=True,
        type=_around,
        metavar="TIME|policy/NAME",
        help="the moment to centre on (ISO 8601, UTC when no zone is given, or Unix "
        "seconds), or policy/NAME: that policy's last PrefixCollapse, read from its status",
    )
    parser.add_argument(
        "--namespace",
        type=namespace_name,
        help="the policy's namespace (policy/NAME only; default: the kubeconfig context's)",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig (policy/NAME only; default: $KUBECONFIG)"
    )
    parser.add_argument(
        "--step", required=True, type=_step, metavar="D", help="window length, e.g. 12h"
    )
    parser.add_argument(
        "--before",
        type=duration_seconds,
        default=48 * 3600.0,
        metavar="D",
        help="how far back from --around, a whole number of --step (default 48h)",
    )
    parser.add_argument(
        "--after",
        type=duration_seconds,
        default=48 * 3600.0,
        metavar="D",
        help="how far on from --around, a whole number of --step (default 48h); windows "
        "ending after now are left out",
    )
    parser.add_argument(
        "--gpus-per-pod",
        type=_gpus,
        metavar="N",
        help="GPUs each pod requests (GPU-s/1k from the pods exporting metrics; not needed "
        "with --kube-state-metrics)",
    )
    parser.add_argument(
        "--kube-state-metrics",
        action="store_true",
        help="count replicas and GPU-s/1k from kube-state-metrics: every pod holding GPUs, "
        "starting ones included (without it, only pods exporting engine metrics count)",
    )
    parser.add_argument(
        "--slo-ttft-p95", type=positive_number, metavar="S", help="judge TTFT p95 against S seconds"
    )
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--out", metavar="DIR", help=f"also write {PNG_NAME} into this folder")
    parser.add_argument("--bearer-token-file", metavar="FILE", help="file holding a bearer token")
    parser.add_argument("--ca-file", metavar="FILE", help="PEM CA bundle to verify TLS with")
    parser.add_argument(
        "--insecure-skip-verify", action="store_true", help="do not verify TLS (test clusters)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_number,
        default=30.0,
        metavar="SECONDS",
        help="time allowed for each window's queries and retries together (default %(default)g)",
    )
    parser.set_defaults(handler=run, centred_on=None)


def _fail(message: str, code: ExitCode) -> int:
    print(f"cachescale report: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Handle ``cachescale report``; return the exit code."""
    try:  # the HTTP client comes with the operator extra; the rest of the CLI needs none
        from cachescale.gather.prometheus import PrometheusClient
        from cachescale.gather.prometheus_errors import PrometheusError
    except ImportError as error:
        return _fail(needs_extra(str(error.name), "operator"), ExitCode.INVALID)

    try:
        selector = None if args.selector is None else Selector.parse(args.selector)
    except SelectorError as error:
        return _fail(f"--selector: {error}", ExitCode.USAGE)
    if isinstance(args.around, PolicyRef):
        try:
            selector = _centre_on_policy(args, selector)
        except PolicyReadError as error:
            return _fail(str(error), error.code)
        except ImportError as error:
            return _fail(
                f"--around policy/NAME {needs_extra(str(error.name), 'operator')}", ExitCode.INVALID
            )
    else:
        for flag in ("--namespace", "--kubeconfig"):
            if getattr(args, flag[2:]) is not None:
                return _fail(f"{flag} applies only to --around policy/NAME", ExitCode.USAGE)
        missing = [f"--{f}" for f in ("prometheus", "engine", "selector") if not getattr(args, f)]
        if missing or selector is None:
            needed = f"{', '.join(missing)} needed unless --around is policy/NAME"
            return _fail(needed, ExitCode.USAGE)
    try:
        spans, future = windows(args.around, args.step, args.before, args.after, datetime.now(UTC))
    except ValueError as error:
        return _fail(str(error), ExitCode.USAGE)
    if not spans:
        return _fail("--around: every window ends in the future", ExitCode.USAGE)
    if args.out is not None:
        if (plots := missing_extra("matplotlib", "plots")) is not None:
            return _fail(f"--out {plots}", ExitCode.INVALID)
        if (problem := output_folder(args.out)) is not None:
            return _fail(problem, ExitCode.INVALID)
    try:
        config = client_config(args)
    except OSError as error:
        return _fail(f"{error.filename}: {error.strerror}", ExitCode.INVALID)
    except ValueError as error:
        return _fail(str(error), ExitCode.INVALID)
    request = SignalRequest(
        engine=Engine(args.engine),
        selector=selector,
        window_seconds=args.step,
        gpus_per_pod=args.gpus_per_pod,
        kube_state_metrics=args.kube_state_metrics,
    )
    started = time.monotonic()
    try:
        with PrometheusClient(config) as client:
            rows = read_report(client, request, spans)
    except PrometheusError as error:
        print(error, file=sys.stderr)
        return ExitCode.UNAVAILABLE
    except AmbiguousSeriesError as error:
        return _fail(str(error), ExitCode.INVALID)
    elapsed = time.monotonic() - started
    sentences = verdict(rows, args.slo_ttft_p95)
    header = report_output.header(args, str(selector), len(rows), future, elapsed)
    if args.out is not None:
        title = f"{args.centred_on}\n{header}" if args.centred_on else header
        report_output.write_png(Path(args.out) / PNG_NAME, rows, title, args.slo_ttft_p95)
    if args.centred_on and args.format == "csv":  # the CSV on stdout stays rows only
        print(args.centred_on, file=sys.stderr)
    output = report_output.render(
        args.format, rows, sentences, header, args, elapsed, caveats(request)
    )
    sys.stdout.write(output + "\n")
    return ExitCode.OK


def _centre_on_policy(args: argparse.Namespace, selector: Selector | None) -> Selector:
    """Read ``--around policy/NAME``, centre ``args.around`` on its last collapse and fill
    the flags not given from its spec; the selector to read with (``selector``, from
    ``--selector``, when given). Raises ``PolicyReadError`` or ``ImportError`` (no
    ``operator`` extra)."""
    name = args.around.name
    read = read_policy(args.kubeconfig, args.namespace, name)
    policy = f"{read.namespace}/{name}"
    centre = collapse_centre(policy, read.body.get("status") or {})
    if centre is None:
        raise PolicyReadError(no_collapse(policy), ExitCode.INVALID)
    try:
        found = sources(read.body.get("spec") or {}, read.namespace)
    except ValueError as error:
        raise PolicyReadError(f"policy {policy}: {error}", ExitCode.INVALID) from None
    if args.prometheus is None:
        if found.prometheus_url is None:
            raise PolicyReadError(
                f"policy {policy} reads the operator's default Prometheus (no "
                "spec.metrics.prometheusUrl); give --prometheus URL",
                ExitCode.INVALID,
            )
        args.prometheus = found.prometheus_url
    args.engine = args.engine or found.engine.value
    args.around = centre.at
    args.centred_on = centre.sentence
    if selector is not None:
        return selector
    try:
        selector = Selector.of(found.selector)
    except SelectorError as error:
        where = f"policy {policy}'s metrics.selector"
        raise PolicyReadError(f"{where}: {error}", ExitCode.INVALID) from None
    args.selector = str(selector)
    return selector
