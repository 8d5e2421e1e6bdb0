"""Runs side by side: the plot's headline, the comparison of autoscalers, and sweeps.

``cachescale simulate --autoscaler both`` sets the HPA alone against the HPA with
cachescale: per run, replicas, cost and latency before the change and over the last third,
then from the change to the end, and in words which run served users better (keeping up
with demand first, then TTFT p95) and at what GPU time per request. A sweep is the same
scenario over a grid of fleet settings, one row per setting. Each run's own windows and
words are :mod:`cachescale.sim.present`'s.
"""

from __future__ import annotations

from typing import Any

from cachescale.sim.incident import SAME_LATENCY_S, SAME_LATENCY_SHARE, onset
from cachescale.sim.present import (
    alert_spans,
    before_after,
    fmt,
    from_change,
    minutes,
    pct_change,
    slo_breaches,
    timeline_windows,
    window_length,
)
from cachescale.sim.report import Signals, Windows, rounded, signals_dict
from cachescale.sim.run import RunResult


def headline(runs: dict[str, RunResult]) -> str:
    """What happened, for a plot's title: the workload's change (hit rate and traffic,
    before → last third), then per run its replicas, cost and SLO breaches."""
    first = next(iter(runs.values()))
    scenario = first.scenario
    (b0, b1), (a0, a1) = before_after(first)
    windows = Windows(first)
    before, after = windows.signals(b0, b1), windows.signals(a0, a1)
    lines = [
        f"{scenario.name} (seed {scenario.seed}): token hit rate "
        f"{fmt(before.token_hit_rate, '.2f')} → {fmt(after.token_hit_rate, '.2f')} while "
        f"offered traffic went {before.offered_req_per_s:.1f} → {after.offered_req_per_s:.1f} req/s"
    ]
    for name, result in runs.items():
        windows = Windows(result)
        (b0, b1), (a0, a1) = before_after(result)
        before, after = windows.signals(b0, b1), windows.signals(a0, a1)
        breaches = slo_breaches(result)
        slo = f"{result.scenario.report.slo_ttft_p95_s:g} s SLO"
        latency = (
            f"TTFT p95 above the {slo} in {len(breaches)} windows "
            f"(peak {max(p for _, p in breaches):,.1f} s)"
            if breaches
            else f"TTFT p95 never above the {slo}"
        )
        lines.append(
            f"{name}: replicas {fmt(before.replicas, '.1f')} → {fmt(after.replicas, '.1f')}, "
            f"GPU-s/1k {fmt(before.gpu_s_per_1k, ',.0f')} → {fmt(after.gpu_s_per_1k, ',.0f')}, "
            + latency
        )
    return "\n".join(lines)


def comparison(runs: dict[str, RunResult]) -> str:
    """``both``: the HPA alone against the HPA with cachescale, after the change."""
    rows = []
    for name, result in runs.items():
        windows = Windows(result)
        (b0, b1), (a0, a1) = before_after(result)
        before, after = windows.signals(b0, b1), windows.signals(a0, a1)
        alerts = sorted({span["reason"] for span in alert_spans(result)})
        rows.append(
            f"  {name:<11} replicas {fmt(before.replicas, '.1f')} → {fmt(after.replicas, '.1f')}"
            f" ({pct_change(before.replicas, after.replicas)}), GPU-s/1k "
            f"{fmt(after.gpu_s_per_1k, ',.0f')}, TTFT p95 {fmt(after.ttft_p95_s, '.2f')} s, "
            f"alerts: {', '.join(alerts) if alerts else 'none'}"
        )
    lines = ["side by side (before → last third of the run):", *rows]
    if {"hpa", "cachescale"} <= runs.keys():
        lines.append(who_served_better(runs["hpa"], runs["cachescale"]))
    first = next(iter(runs.values()))
    lines.append(f"from the change ({minutes(from_change(first)[0])}) to the end:")
    lines += [f"  {name:<11} {_incident_cells(result)}" for name, result in runs.items()]
    if {"hpa", "cachescale"} <= runs.keys():
        lines.append(onset(runs["hpa"], runs["cachescale"]).words())
    return "\n".join(lines)


def _incident_cells(result: RunResult) -> str:
    """Replicas, cost and latency from the change to the end, with every timeline window
    above the SLO in that span: what users felt and paid through the whole incident."""
    start, end = from_change(result)
    windows = Windows(result)
    signals = windows.signals(start, end)
    breaches = [p95 for at, p95 in slo_breaches(result) if at >= start]
    step = result.scenario.report.timeline_s
    spans = len([at for at, _ in timeline_windows(result) if at >= start])
    worst = f" (worst {max(breaches):,.1f} s)" if breaches else ""
    return (
        f"replicas {fmt(signals.replicas, '.1f')} (peak {windows.replicas_max()}), GPU-s/1k "
        f"{fmt(signals.gpu_s_per_1k, ',.0f')}, TTFT p95 {fmt(signals.ttft_p95_s, '.2f')} s, "
        f"above the {result.scenario.report.slo_ttft_p95_s:g} s SLO in {len(breaches)} of "
        f"{spans} windows of {window_length(step)}{worst}"
    )


KEEPS_UP_SHARE = 0.95
"""A run that serves at least 95% of what arrives keeps up with its demand."""


def who_served_better(hpa: RunResult, cachescale: RunResult) -> str:
    """In plain words, over the last third: which run served users better (keeping up
    with demand first, then TTFT p95) and what it cost against the other."""
    alone, with_policy = _after(hpa), _after(cachescale)
    latency = _latency_comparison(alone, with_policy)
    cost = _cost_words(alone.gpu_s_per_1k, with_policy.gpu_s_per_1k)
    return (
        f"Over the last third, cachescale {latency} (TTFT p95 "
        f"{fmt(with_policy.ttft_p95_s, '.2f')} s against {fmt(alone.ttft_p95_s, '.2f')} s; "
        f"{with_policy.req_per_s:.1f} against {alone.req_per_s:.1f} of "
        f"{with_policy.offered_req_per_s:.1f} req/s served), at {cost} "
        f"({fmt(with_policy.gpu_s_per_1k, ',.0f')} against {fmt(alone.gpu_s_per_1k, ',.0f')} "
        f"GPU-s/1k; {fmt(with_policy.replicas, '.1f')} against {fmt(alone.replicas, '.1f')} "
        "replicas)."
    )


def _cost_words(alone: float | None, with_policy: float | None) -> str:
    """``9% less GPU time per request`` (or more, or the same)."""
    if alone is None or with_policy is None or alone == 0:
        return "an unknown GPU time per request"
    change = (with_policy - alone) / alone
    if round(change, 2) == 0:
        return "the same GPU time per request"
    return f"{abs(change):.0%} {'less' if change < 0 else 'more'} GPU time per request"


def _after(result: RunResult) -> Signals:
    _, (start, end) = before_after(result)
    return Windows(result).signals(start, end)


def _latency_comparison(alone: Signals, with_policy: Signals) -> str:
    keeps_up = [
        s.offered_req_per_s <= 0 or s.req_per_s >= KEEPS_UP_SHARE * s.offered_req_per_s
        for s in (alone, with_policy)
    ]
    if keeps_up[1] and not keeps_up[0]:
        return "served users better than the HPA alone, which fell behind its demand"
    if keeps_up[0] and not keeps_up[1]:
        return "served users worse than the HPA alone: it fell behind its demand"
    a, b = alone.ttft_p95_s, with_policy.ttft_p95_s
    if a is None or b is None:
        return "served users at a latency that cannot be compared (TTFT unknown)"
    if abs(a - b) <= max(SAME_LATENCY_S, SAME_LATENCY_SHARE * min(a, b)):
        return "served users as well as the HPA alone"
    return "served users " + ("better" if b < a else "worse") + " than the HPA alone"


def sweep_json(points: list[tuple[dict[str, object], RunResult]]) -> list[dict[str, Any]]:
    """The ``sweep`` list: per point, its settings, whole-run signals and TTFT detail."""
    rows: list[dict[str, Any]] = []
    for setting, result in points:
        windows = Windows(result)
        duration = result.scenario.duration_s
        detail = windows.detail(0.0, duration)
        rows.append(
            {
                **signals_dict(windows.signals(0.0, duration)),
                **{key: str(value) for key, value in setting.items()},
                **rounded(
                    {
                        "throughput_tok_s": detail.throughput_tok_s,
                        "ttft_p50_s": detail.ttft_p50_s,
                        "ttft_p99_s": detail.ttft_p99_s,
                    }
                ),
            }
        )
    return rows


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a table: one line per setting combination."""
    keys = [k for k in ("replicas", "router", "max_num_seqs") if rows and k in rows[0]]
    columns = [
        *keys,
        "token_hit_rate",
        "request_hit_share",
        "throughput_tok_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "preemptions_per_s",
    ]
    widths = [max(len(c), 12) for c in columns]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    for row in rows:
        cells = ["?" if row.get(c) is None else str(row[c]) for c in columns]
        lines.append("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)
