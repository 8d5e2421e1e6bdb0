"""What ``cachescale simulate`` prints: the on-call table, the verdict and the JSON object.

The table is what an on-call engineer would want on the incident's night: per window,
the token hit rate beside the request hit share (the two disagree exactly when it
matters), TTFT p95, replicas, traffic, cost and preemptions. The verdict says in words
what changed and what the autoscaler did about it, with the numbers.
"""

from __future__ import annotations

import math
from typing import Any

from cachescale.sim.incident import (
    SAME_LATENCY_S,
    SAME_LATENCY_SHARE,
    change_s,
    onset,
    recovery,
    recovery_words,
)
from cachescale.sim.report import Signals, Windows, rounded, signals_dict
from cachescale.sim.run import RunResult

SIGNAL_COLUMNS = (
    ("window", 13),
    ("tok-hit", 7),
    ("req-hit", 7),
    ("TTFT-p95", 8),
    ("replicas", 8),
    ("req/s", 6),
    ("GPU-s/1k", 8),
    ("preempt/s", 9),
)


def before_after(result: RunResult) -> tuple[tuple[float, float], tuple[float, float]]:
    """The steady window before the first change and the last third of the run."""
    scenario = result.scenario
    duration = scenario.duration_s
    change = change_s(scenario)
    before = (max(0.0, change - scenario.report.steady_window_s), change)
    after = (duration - duration / 3, duration)
    return before, after


def from_change(result: RunResult) -> tuple[float, float]:
    """From the first change to the end of the run: what the whole incident cost. The
    last third can start after an incident is over, and then hides how it was served."""
    return change_s(result.scenario), result.scenario.duration_s


def _fmt(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m"


def _window_length(seconds: float) -> str:
    """``30 s``, ``1 min``, ``5 min``."""
    return f"{seconds:g} s" if seconds < 60 else f"{seconds / 60:g} min"


def signal_cells(signals: Signals) -> list[str]:
    """Table cells for one window's signals (``?`` for unknown)."""
    return [
        _fmt(signals.token_hit_rate, ".2f"),
        _fmt(signals.request_hit_share, ".2f"),
        _fmt(signals.ttft_p95_s, ".2f") + ("s" if signals.ttft_p95_s is not None else ""),
        _fmt(signals.replicas, ".1f"),
        f"{signals.req_per_s:.1f}",
        _fmt(signals.gpu_s_per_1k, ".0f"),
        _fmt(signals.preemptions_per_s, ".2f"),
    ]


def on_call_table(result: RunResult) -> str:
    """Windowed table of the run, one row per ``report.window_s``."""
    windows = Windows(result)
    step = result.scenario.report.window_s
    header = "  ".join(name.rjust(width) for name, width in SIGNAL_COLUMNS)
    lines = [header, "-" * len(header)]
    start = 0.0
    change = result.scenario.change_at_s
    while start < result.scenario.duration_s:
        end = min(start + step, result.scenario.duration_s)
        label = f"{_minutes(start)}-{_minutes(end)}"
        if change is not None and start <= change < end:
            label = "*" + label
        cells = [label, *signal_cells(windows.signals(start, end))]
        lines.append(
            "  ".join(
                cell.rjust(width) for cell, (_, width) in zip(cells, SIGNAL_COLUMNS, strict=True)
            )
        )
        start = end
    if change is not None:
        lines.append(f"* the window in which the change happens (t = {_minutes(change)})")
    return "\n".join(lines)


def _pct_change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return "an unknown amount"
    return f"{(after - before) / before:+.0%}"


COLLAPSED_HIT_SHARE = 0.5
"""A collapse, in a report: the token hit rate fell under this share of the one before."""


def _bought_replicas_for_a_collapse(before: Signals, after: Signals) -> bool:
    """The hit rate at least halved while replicas grew by a fifth and traffic did not."""
    hit_before, hit_after = before.token_hit_rate, after.token_hit_rate
    replicas_before, replicas_after = before.replicas, after.replicas
    if hit_before is None or hit_after is None:
        return False
    if replicas_before is None or replicas_after is None:
        return False
    return (
        hit_after < COLLAPSED_HIT_SHARE * hit_before
        and replicas_after > 1.2 * replicas_before
        and after.req_per_s < 1.1 * before.req_per_s
    )


def verdict(result: RunResult) -> str:
    """A paragraph in plain words: what changed, what the autoscaler did, what it cost."""
    windows = Windows(result)
    (b0, b1), (a0, a1) = before_after(result)
    before, after = windows.signals(b0, b1), windows.signals(a0, a1)
    parts = [
        f"Before the change the token-weighted hit rate was {_fmt(before.token_hit_rate, '.2f')}"
        f" (request hit share {_fmt(before.request_hit_share, '.2f')}); in the last third of "
        f"the run it was {_fmt(after.token_hit_rate, '.2f')} "
        f"(request hit share {_fmt(after.request_hit_share, '.2f')}).",
        f"Traffic went from {before.req_per_s:.1f} to {after.req_per_s:.1f} req/s "
        f"({_pct_change(before.req_per_s, after.req_per_s)}), while prefill tokens computed per "
        f"request went from {_fmt(before.prefill_tokens_per_request, ',.0f')} to "
        f"{_fmt(after.prefill_tokens_per_request, ',.0f')}.",
        f"The {result.autoscaler} autoscaler ran {_fmt(before.replicas, '.1f')} replicas before "
        f"and {_fmt(after.replicas, '.1f')} after "
        f"({_pct_change(before.replicas, after.replicas)}; peak {windows.replicas_max()}); "
        f"GPU-seconds per 1k requests went from {_fmt(before.gpu_s_per_1k, ',.0f')} to "
        f"{_fmt(after.gpu_s_per_1k, ',.0f')} "
        f"({_pct_change(before.gpu_s_per_1k, after.gpu_s_per_1k)}).",
    ]
    if after.offered_req_per_s > 1.05 * after.req_per_s:
        parts.append(
            f"Demand outran service: {after.offered_req_per_s:.1f} req/s arrived and "
            f"{after.req_per_s:.1f} were served"
            + (
                f" ({after.aborted_per_s:.1f} req/s aborted by clients that gave up)."
                if after.aborted_per_s
                else "."
            )
        )
    if after.ttft_p95_s is not None:
        parts.append(_latency_sentence(result, after.ttft_p95_s))
    found = recovery(result, before)
    if found is not None:
        parts.append(f"After the change: {recovery_words(found)}.")
    if result.autoscaler == "hpa" and _bought_replicas_for_a_collapse(before, after):
        parts.append(
            "The HPA raised no alert and bought replicas: it cannot tell more traffic from "
            "more expensive requests."
        )
    if result.dropped:
        parts.append(f"{result.dropped} requests found no ready pod and were dropped.")
    return " ".join(parts)


def run_json(result: RunResult) -> dict[str, Any]:
    """One autoscaler's entry of the ``--json`` object."""
    windows = Windows(result)
    (b0, b1), (a0, a1) = before_after(result)
    timeline: list[dict[str, Any]] = []
    for start, end in timeline_windows(result):
        detail = windows.detail(start, end)
        timeline.append(
            rounded(
                {
                    "t_s": start,
                    **signals_dict(windows.signals(start, end)),
                    "ttft_p95_hit_s": detail.ttft_p95_hit_s,
                    "ttft_p95_miss_s": detail.ttft_p95_miss_s,
                    "ttft_p99_s": detail.ttft_p99_s,
                }
            )
        )
    before = windows.signals(b0, b1)
    found = recovery(result, before)
    return {
        "change_at_s": result.scenario.change_at_s,
        "before": signals_dict(before),
        "after": signals_dict(windows.signals(a0, a1)),
        "from_change": signals_dict(windows.signals(*from_change(result))),
        "recovery": None if found is None else found.as_dict(),
        "slo_breaches": [
            rounded({"t_s": start, "ttft_p95_s": p95}) for start, p95 in slo_breaches(result)
        ],
        "replicas_max": windows.replicas_max(),
        "alerts": alert_spans(result),
        "max_num_seqs": max_num_seqs_changes(result),
        "envelope": envelope_changes(result),
        "dropped_requests": result.dropped,
        "timeline": timeline,
    }


def alert_spans(result: RunResult) -> list[dict[str, Any]]:
    """Each alert the policy raised: when, why, and when it cleared (None: still active)."""
    spans: list[dict[str, Any]] = []
    open_spans: dict[str, dict[str, Any]] = {}
    for record in result.policy:
        for reason, words in zip(record.cleared, record.cleared_messages, strict=True):
            span = open_spans.pop(reason, None)
            if span is not None:
                span["cleared_at_s"] = record.t_s
                span["cleared_message"] = words
        for raised in record.raised:
            reason, _, message = raised.partition(": ")
            span = {"reason": reason, "raised_at_s": record.t_s, "cleared_at_s": None}
            span["message"] = message
            open_spans[reason] = span
            spans.append(span)
    return spans


def max_num_seqs_changes(result: RunResult) -> list[dict[str, Any]]:
    """The batch ceiling at the start and after each change the policy made."""
    changes = [{"at_s": 0.0, "value": result.scenario.fleet.max_num_seqs}]
    for record in result.policy:
        if record.max_num_seqs is not None and record.max_num_seqs != changes[-1]["value"]:
            changes.append({"at_s": record.t_s, "value": record.max_num_seqs})
    return changes


def envelope_changes(result: RunResult) -> list[dict[str, Any]]:
    """The HPA envelope (min, max, target) each time the policy changed it."""
    changes: list[dict[str, Any]] = []
    for record in result.policy:
        entry = {
            "min_replicas": record.min_replicas,
            "max_replicas": record.max_replicas,
            "target": record.target,
        }
        if not changes or {k: changes[-1][k] for k in entry} != entry:
            changes.append({"at_s": record.t_s, **entry, "reason": record.reason})
    return changes


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
        f"{_fmt(before.token_hit_rate, '.2f')} → {_fmt(after.token_hit_rate, '.2f')} while "
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
            f"{name}: replicas {_fmt(before.replicas, '.1f')} → {_fmt(after.replicas, '.1f')}, "
            f"GPU-s/1k {_fmt(before.gpu_s_per_1k, ',.0f')} → {_fmt(after.gpu_s_per_1k, ',.0f')}, "
            + latency
        )
    return "\n".join(lines)


def slo_breaches(result: RunResult) -> list[tuple[float, float]]:
    """``(window start, TTFT p95)`` of every timeline window whose p95 is above the SLO."""
    windows = Windows(result)
    slo = result.scenario.report.slo_ttft_p95_s
    found = []
    for start, end in timeline_windows(result):
        p95 = windows.signals(start, end).ttft_p95_s
        if p95 is not None and p95 > slo:
            found.append((start, p95))
    return found


def timeline_windows(result: RunResult) -> list[tuple[float, float]]:
    """The report's timeline windows, ``report.timeline_s`` long, over the whole run."""
    step, duration = result.scenario.report.timeline_s, result.scenario.duration_s
    starts = [index * step for index in range(math.ceil(duration / step - 1e-9))]
    return [(start, min(start + step, duration)) for start in starts]


def _latency_sentence(result: RunResult, final_p95: float) -> str:
    """Where TTFT p95 ended against the SLO, and every window on the way that breached it:
    a p95 back under the SLO at the end says nothing about the spike before."""
    slo = result.scenario.report.slo_ttft_p95_s
    state = "within" if final_p95 <= slo else "above"
    ended = f"TTFT p95 ended at {final_p95:.2f} s, {state} the {slo:g} s SLO"
    breaches = slo_breaches(result)
    if not breaches:
        return (
            ended
            + ", and no window of the run was above it: a latency alert would have stayed silent."
        )
    step = result.scenario.report.timeline_s
    first, last = breaches[0][0], breaches[-1][0] + step
    peak = max(p95 for _, p95 in breaches)
    return (
        f"{ended}; {len(breaches)} of the run's {_window_length(step)} windows were above it, "
        f"between {_minutes(first)} and {_minutes(last)} (peak {peak:,.1f} s)."
    )


def policy_story(result: RunResult) -> str:
    """What cachescale did, line by line: alerts raised and cleared, ceiling changes."""
    if not result.policy:
        return ""
    lines = [f"cachescale: {len(result.policy)} evaluations"]
    for span in alert_spans(result):
        cleared = span["cleared_at_s"]
        until = f", cleared at {_minutes(cleared)}" if cleared is not None else ", still active"
        lines.append(
            f"  {_minutes(span['raised_at_s'])} {span['reason']}{until}: {span['message']}"
        )
    for change in max_num_seqs_changes(result)[1:]:
        lines.append(f"  {_minutes(change['at_s'])} --max-num-seqs → {change['value']}")
    if len(lines) == 1:
        lines.append("  no alert raised, no ceiling change")
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
            f"  {name:<11} replicas {_fmt(before.replicas, '.1f')} → {_fmt(after.replicas, '.1f')}"
            f" ({_pct_change(before.replicas, after.replicas)}), GPU-s/1k "
            f"{_fmt(after.gpu_s_per_1k, ',.0f')}, TTFT p95 {_fmt(after.ttft_p95_s, '.2f')} s, "
            f"alerts: {', '.join(alerts) if alerts else 'none'}"
        )
    lines = ["side by side (before → last third of the run):", *rows]
    if {"hpa", "cachescale"} <= runs.keys():
        lines.append(who_served_better(runs["hpa"], runs["cachescale"]))
    first = next(iter(runs.values()))
    lines.append(f"from the change ({_minutes(from_change(first)[0])}) to the end:")
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
        f"replicas {_fmt(signals.replicas, '.1f')} (peak {windows.replicas_max()}), GPU-s/1k "
        f"{_fmt(signals.gpu_s_per_1k, ',.0f')}, TTFT p95 {_fmt(signals.ttft_p95_s, '.2f')} s, "
        f"above the {result.scenario.report.slo_ttft_p95_s:g} s SLO in {len(breaches)} of "
        f"{spans} windows of {_window_length(step)}{worst}"
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
        f"{_fmt(with_policy.ttft_p95_s, '.2f')} s against {_fmt(alone.ttft_p95_s, '.2f')} s; "
        f"{with_policy.req_per_s:.1f} against {alone.req_per_s:.1f} of "
        f"{with_policy.offered_req_per_s:.1f} req/s served), at {cost} "
        f"({_fmt(with_policy.gpu_s_per_1k, ',.0f')} against {_fmt(alone.gpu_s_per_1k, ',.0f')} "
        f"GPU-s/1k; {_fmt(with_policy.replicas, '.1f')} against {_fmt(alone.replicas, '.1f')} "
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
