"""What ``cachescale simulate`` prints of one run: the on-call table, the verdict and the JSON.

The table is what an on-call engineer would want on the incident's night: per window,
the token hit rate beside the request hit share (the two disagree exactly when it
matters), TTFT p95, replicas, traffic, cost and preemptions. The verdict says in words
what changed and what the autoscaler did about it, with the numbers. The windows a report
reads (before the change, the last third, from the change on, the timeline) and how its
numbers are written live here; :mod:`cachescale.sim.compare` sets runs side by side with
them.
"""

from __future__ import annotations

import math
from typing import Any

from cachescale.sim.incident import change_s, recovery, recovery_words
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


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``?`` when it is unknown."""
    return "?" if value is None else format(value, spec)


def minutes(seconds: float) -> str:
    """Whole minutes into the run: ``2m``."""
    return f"{int(seconds // 60)}m"


def window_length(seconds: float) -> str:
    """``30 s``, ``1 min``, ``5 min``."""
    return f"{seconds:g} s" if seconds < 60 else f"{seconds / 60:g} min"


def signal_cells(signals: Signals) -> list[str]:
    """Table cells for one window's signals (``?`` for unknown)."""
    return [
        fmt(signals.token_hit_rate, ".2f"),
        fmt(signals.request_hit_share, ".2f"),
        fmt(signals.ttft_p95_s, ".2f") + ("s" if signals.ttft_p95_s is not None else ""),
        fmt(signals.replicas, ".1f"),
        f"{signals.req_per_s:.1f}",
        fmt(signals.gpu_s_per_1k, ".0f"),
        fmt(signals.preemptions_per_s, ".2f"),
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
        label = f"{minutes(start)}-{minutes(end)}"
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
        lines.append(f"* the window in which the change happens (t = {minutes(change)})")
    return "\n".join(lines)


def pct_change(before: float | None, after: float | None) -> str:
    """The signed change from ``before`` to ``after`` (``+12%``), or ``an unknown amount``."""
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
        f"Before the change the token-weighted hit rate was {fmt(before.token_hit_rate, '.2f')}"
        f" (request hit share {fmt(before.request_hit_share, '.2f')}); in the last third of "
        f"the run it was {fmt(after.token_hit_rate, '.2f')} "
        f"(request hit share {fmt(after.request_hit_share, '.2f')}).",
        f"Traffic went from {before.req_per_s:.1f} to {after.req_per_s:.1f} req/s "
        f"({pct_change(before.req_per_s, after.req_per_s)}), while prefill tokens computed per "
        f"request went from {fmt(before.prefill_tokens_per_request, ',.0f')} to "
        f"{fmt(after.prefill_tokens_per_request, ',.0f')}.",
        f"The {result.autoscaler} autoscaler ran {fmt(before.replicas, '.1f')} replicas before "
        f"and {fmt(after.replicas, '.1f')} after "
        f"({pct_change(before.replicas, after.replicas)}; peak {windows.replicas_max()}); "
        f"GPU-seconds per 1k requests went from {fmt(before.gpu_s_per_1k, ',.0f')} to "
        f"{fmt(after.gpu_s_per_1k, ',.0f')} "
        f"({pct_change(before.gpu_s_per_1k, after.gpu_s_per_1k)}).",
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
        f"{ended}; {len(breaches)} of the run's {window_length(step)} windows were above it, "
        f"between {minutes(first)} and {minutes(last)} (peak {peak:,.1f} s)."
    )


def policy_story(result: RunResult) -> str:
    """What cachescale did, line by line: alerts raised and cleared, ceiling changes."""
    if not result.policy:
        return ""
    lines = [f"cachescale: {len(result.policy)} evaluations"]
    for span in alert_spans(result):
        cleared = span["cleared_at_s"]
        until = f", cleared at {minutes(cleared)}" if cleared is not None else ", still active"
        lines.append(f"  {minutes(span['raised_at_s'])} {span['reason']}{until}: {span['message']}")
    for change in max_num_seqs_changes(result)[1:]:
        lines.append(f"  {minutes(change['at_s'])} --max-num-seqs → {change['value']}")
    if len(lines) == 1:
        lines.append("  no alert raised, no ceiling change")
    return "\n".join(lines)
