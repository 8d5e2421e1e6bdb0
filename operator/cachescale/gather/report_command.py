"""``cachescale report``: the cost around a moment, window by window, with a verdict.

The command line and the printing of ``gather/report.py``'s rows: a table, Markdown (for
an incident document), JSON or CSV (for a script), and optionally a PNG. It follows
``cachescale signals``' rules: flags checked by argparse types (a bad one is exit 2 naming
it), the selector parsed as ``name="value"`` pairs only, one line on stderr for any
failure (1 invalid input, 3 Prometheus unreadable), and the HTTP client imported only in
``run``, so registering the subcommand costs the CLI nothing. ``--timeout`` is one
deadline per window: each window is one signals evaluation.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from cachescale.api.exit_codes import ExitCode
from cachescale.api.flags import duration_seconds, output_folder, positive_number
from cachescale.api.spec import Engine
from cachescale.gather.command import (
    client_config,
    evaluation_time,
    measured_json,
    prometheus_url,
)
from cachescale.gather.promql import Selector, SelectorError
from cachescale.gather.report import (
    COLUMNS,
    Row,
    notes,
    positive_duration,
    read_report,
    verdict,
    windows,
)
from cachescale.gather.signals import AmbiguousSeriesError, SignalRequest
from cachescale.snapshot import Measured, Unit

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


def _around(text: str) -> datetime:
    if text.startswith("policy/"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: centring on a policy's last collapse is not supported yet; give its "
            "time (ISO 8601 or Unix seconds) from the policy's status"
        )
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
            "error, 3 Prometheus could not be read."
        ),
    )
    parser.add_argument(
        "--prometheus",
        required=True,
        type=prometheus_url,
        metavar="URL",
        help="Prometheus base URL",
    )
    parser.add_argument("--engine", required=True, choices=[e.value for e in Engine])
    parser.add_argument(
        "--selector",
        required=True,
        help='label matchers, e.g. \'namespace="llm",model_name="llama-3-8b"\' (only name="value")',
    )
    parser.add_argument(
        "--around",
        required=True,
        type=_around,
        metavar="TIME",
        help="the moment to centre on (ISO 8601, UTC when no zone is given, or Unix seconds)",
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
        help="GPUs each pod requests (needed for GPU-s/1k)",
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
    parser.set_defaults(handler=run)


def _fail(message: str, code: ExitCode) -> int:
    print(f"cachescale report: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Handle ``cachescale report``; return the exit code."""
    try:  # the HTTP client comes with the operator extra; the rest of the CLI needs none
        from cachescale.gather.prometheus import PrometheusClient, PrometheusError
    except ImportError as error:
        return _fail(f"needs {error.name}: pip install 'cachescale[operator]'", ExitCode.INVALID)

    try:
        selector = Selector.parse(args.selector)
    except SelectorError as error:
        return _fail(f"--selector: {error}", ExitCode.USAGE)
    try:
        spans, future = windows(args.around, args.step, args.before, args.after, datetime.now(UTC))
    except ValueError as error:
        return _fail(str(error), ExitCode.USAGE)
    if not spans:
        return _fail("--around: every window ends in the future", ExitCode.USAGE)
    if args.out is not None:
        if importlib.util.find_spec("matplotlib") is None:
            needs = "--out needs matplotlib: pip install 'cachescale[plots]'"
            return _fail(needs, ExitCode.INVALID)
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
    header = _header(args, str(selector), len(rows), future, elapsed)
    if args.out is not None:
        _write_png(Path(args.out) / PNG_NAME, rows, header, args.slo_ttft_p95)
    sys.stdout.write(_render(args.format, rows, sentences, header, args, elapsed) + "\n")
    return ExitCode.OK


def _header(
    args: argparse.Namespace, selector: str, count: int, future: int, elapsed: float
) -> str:
    around = args.around.isoformat(timespec="seconds")
    left_out = f", {future} ending after now left out" if future else ""
    return (
        f"report for {selector} ({args.engine}) around {around}: {count} windows of "
        f"{positive_duration(args.step)}{left_out}, read in {elapsed:.1f}s"
    )


def _cell(measured: Measured) -> str:
    value = measured.value
    if value is None:
        return "?"
    prefix = ">" if measured.lower_bound else ""
    if measured.unit is Unit.RATIO:
        return f"{value:.2f}"
    if measured.unit is Unit.SECONDS:
        return f"{prefix}{value:.2f}s"
    if measured.unit is Unit.PODS:
        return f"{value:.1f}"
    if measured.unit is Unit.GPU_SECONDS_PER_1K_REQUESTS or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _table(rows: list[Row]) -> list[str]:
    header = ["window", *COLUMNS.values()]
    body = [[row.window.label, *(_cell(m) for m in row.columns().values())] for row in rows]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(cell.rjust(width) for cell, width in zip(r, widths, strict=True))
        for r in [header, *body]
    ]


def _render(
    form: str,
    rows: list[Row],
    sentences: list[str],
    header: str,
    args: argparse.Namespace,
    elapsed: float,
) -> str:
    if form == "json":
        return json.dumps(_json(rows, sentences, args, elapsed), indent=2)
    if form == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["window", "start", "end", *COLUMNS])
        for row in rows:
            values = ["" if m.value is None else f"{m.value:.6g}" for m in row.columns().values()]
            start, end = row.window.start.isoformat(), row.window.end.isoformat()
            writer.writerow([row.window.label, start, end, *values])
        return buffer.getvalue().rstrip("\n")
    if form == "markdown":
        lines = [f"**{header}**", "", "| window | " + " | ".join(COLUMNS.values()) + " |"]
        lines.append("|" + "---|" * (len(COLUMNS) + 1))
        for row in rows:
            cells = [_cell(m) for m in row.columns().values()]
            lines.append(f"| {row.window.label} | " + " | ".join(cells) + " |")
        lines += ["", *(f"- {sentence}" for sentence in sentences)]
        lines += [f"- note: {note}" for note in notes(rows)]
        return "\n".join(lines)
    lines = [header, "", *_table(rows), "", "verdict:"]
    lines += [f"  {sentence}" for sentence in sentences]
    lines += [f"note: {note}" for note in notes(rows)]
    return "\n".join(lines)


def _json(
    rows: list[Row], sentences: list[str], args: argparse.Namespace, elapsed: float
) -> dict[str, object]:
    return {
        "engine": args.engine,
        "selector": args.selector,
        "around": args.around.isoformat(),
        "step_seconds": args.step,
        "gpus_per_pod": args.gpus_per_pod,
        "slo_ttft_p95_seconds": args.slo_ttft_p95,
        "windows": [
            {
                "window": row.window.label,
                "start": row.window.start.isoformat(),
                "end": row.window.end.isoformat(),
                "signals": {name: measured_json(m) for name, m in row.columns().items()},
            }
            for row in rows
        ],
        "verdict": sentences,
        "read_seconds": round(elapsed, 3),
    }


def _write_png(path: Path, rows: list[Row], title: str, slo_s: float | None) -> None:
    """Hit rate, replicas, GPU-s/1k and TTFT p95 (and its SLO) per window, the moment
    marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(name: str) -> list[float]:
        values = [getattr(row, name).value for row in rows]
        return [float("nan") if v is None else v for v in values]

    hours = [row.window.end_offset_s / 3600 for row in rows]
    panels = (
        ("token_hit_rate", "token hit rate"),
        ("replicas", "replicas"),
        ("gpu_seconds_per_1k", "GPU-s / 1k req"),
        ("ttft_p95_seconds", "TTFT p95 (s)"),
    )
    figure, axes = plt.subplots(len(panels), 1, figsize=(9, 10), sharex=True)
    for axis, (name, label) in zip(axes, panels, strict=True):
        axis.plot(hours, series(name), marker="o", drawstyle="steps-pre")
        axis.axvline(0, color="grey", linestyle="--", linewidth=1)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    if slo_s is not None:
        axes[-1].axhline(slo_s, color="red", linewidth=0.8, label="SLO")
        axes[-1].legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("hours from --around (each point: the window ending there)")
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
