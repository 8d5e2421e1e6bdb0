"""Files written by ``cachescale simulate --out DIR``: CSV time series and PNG plots.

The CSV holds the same timeline as the JSON report, one row per timeline window, so it
can be loaded into a spreadsheet or pandas. The plots put the perturbation on every panel
and never average the two hit rates or the hit/miss TTFTs into one line: the point of
the simulator is the gap between them.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

TIMELINE_FIELDS = (
    "t_s",
    "token_hit_rate",
    "request_hit_share",
    "prefill_tokens_per_request",
    "ttft_p95_s",
    "ttft_p95_hit_s",
    "ttft_p95_miss_s",
    "ttft_p99_s",
    "replicas",
    "req_per_s",
    "offered_req_per_s",
    "aborted_per_s",
    "gpu_s_per_1k",
    "preemptions_per_s",
)


def write_timeline_csv(path: Path, timeline: list[dict[str, Any]]) -> None:
    """One row per timeline window; unknown values are empty cells."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=TIMELINE_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in timeline:
            writer.writerow(
                {key: "" if row.get(key) is None else row[key] for key in TIMELINE_FIELDS}
            )


def write_plots(
    path: Path,
    title: str,
    runs: dict[str, list[dict[str, Any]]],
    change_at_s: float | None,
    slo_ttft_p95_s: float,
    budget_gpu_s_per_1k: float | None,
) -> None:
    """A five-panel PNG: hit rates; TTFT p95 overall and for hits vs misses; offered vs
    served req/s; replicas; GPU-s/1k (per autoscaler). ``title`` says what happened."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(5, 1, figsize=(11, 16), sharex=True)
    for name, timeline in runs.items():
        minutes = [row["t_s"] / 60 for row in timeline]

        def series(key: str, rows: list[dict[str, Any]] = timeline) -> list[float]:
            return [float("nan") if row.get(key) is None else row[key] for row in rows]

        axes[0].plot(minutes, series("token_hit_rate"), label=f"{name}: token-weighted hit rate")
        axes[0].plot(
            minutes, series("request_hit_share"), "--", label=f"{name}: request full-hit share"
        )
        axes[1].plot(minutes, series("ttft_p95_s"), linewidth=2, label=f"{name}: p95, all")
        axes[1].plot(minutes, series("ttft_p95_hit_s"), label=f"{name}: p95, full hits")
        axes[1].plot(minutes, series("ttft_p95_miss_s"), label=f"{name}: p95, misses")
        axes[1].plot(minutes, series("ttft_p99_s"), ":", label=f"{name}: p99, all")
        axes[2].plot(minutes, series("req_per_s"), label=f"{name}: served req/s")
        axes[2].plot(minutes, series("offered_req_per_s"), "--", label=f"{name}: offered req/s")
        axes[3].plot(minutes, series("replicas"), label=f"{name}: replicas")
        axes[4].plot(minutes, series("gpu_s_per_1k"), label=f"{name}: GPU-s per 1k requests")
    axes[1].axhline(slo_ttft_p95_s, color="red", linewidth=0.8, label="TTFT p95 SLO")
    if budget_gpu_s_per_1k is not None:
        axes[4].axhline(budget_gpu_s_per_1k, color="red", linewidth=0.8, label="budget")
    axes[0].set_ylim(0, 1)
    axes[1].set_yscale("log")
    labels = ("hit rate", "TTFT (s)", "req/s", "replicas", "GPU-s / 1k req")
    for axis, label in zip(axes, labels, strict=True):
        if change_at_s is not None:
            axis.axvline(change_at_s / 60, color="grey", linestyle="--", linewidth=1)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("simulated minutes (dashed line: the change)")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
