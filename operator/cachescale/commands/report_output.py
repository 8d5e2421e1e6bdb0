"""How ``cachescale report`` shows its rows: a table, Markdown, JSON, CSV and a PNG.

The table and the Markdown (for an incident document) show each window's signals rounded
for reading, ``?`` where one is unknown, then the verdict's sentences and the notes; the
JSON (every signal as ``cachescale signals --json`` writes it) and the CSV (the values
alone, empty when unknown) are for a script. With ``--around policy/NAME`` the sentence
saying which moment was used heads the table and the Markdown, and the PNG's title; the
CSV on stdout stays rows only.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from cachescale.commands.signals_output import measured_json
from cachescale.gather.report import COLUMNS, Row, notes, positive_duration
from cachescale.snapshot import Measured, Unit


def header(args: argparse.Namespace, selector: str, count: int, future: int, elapsed: float) -> str:
    """The line naming what was read: selector, engine, moment, windows, time spent."""
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


def render(
    form: str,
    rows: list[Row],
    sentences: list[str],
    header: str,
    args: argparse.Namespace,
    elapsed: float,
    caveats: list[str],
) -> str:
    """The report in ``form``: ``table``, ``markdown``, ``json`` or ``csv``; ``caveats``
    (what the replicas and cost leave out) follow the notes."""
    if form == "json":
        return json.dumps(_json(rows, sentences, args, elapsed, caveats), indent=2)
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
        lines = [f"**{header}**", ""]
        if args.centred_on:
            lines += [f"_{args.centred_on}_", ""]
        lines.append("| window | " + " | ".join(COLUMNS.values()) + " |")
        lines.append("|" + "---|" * (len(COLUMNS) + 1))
        for row in rows:
            cells = [_cell(m) for m in row.columns().values()]
            lines.append(f"| {row.window.label} | " + " | ".join(cells) + " |")
        lines += ["", *(f"- {sentence}" for sentence in sentences)]
        lines += [f"- note: {note}" for note in [*notes(rows), *caveats]]
        return "\n".join(lines)
    lines = [*([args.centred_on] if args.centred_on else []), header, "", *_table(rows)]
    lines += ["", "verdict:"]
    lines += [f"  {sentence}" for sentence in sentences]
    lines += [f"note: {note}" for note in [*notes(rows), *caveats]]
    return "\n".join(lines)


def _json(
    rows: list[Row],
    sentences: list[str],
    args: argparse.Namespace,
    elapsed: float,
    caveats: list[str],
) -> dict[str, object]:
    return {
        "engine": args.engine,
        "selector": args.selector,
        "around": args.around.isoformat(),
        "centred_on": args.centred_on,
        "step_seconds": args.step,
        "gpus_per_pod": args.gpus_per_pod,
        "kube_state_metrics": args.kube_state_metrics,
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
        "caveats": caveats,
        "read_seconds": round(elapsed, 3),
    }


def write_png(path: Path, rows: list[Row], title: str, slo_s: float | None) -> None:
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
