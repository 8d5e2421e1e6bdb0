"""``bench_fleet``'s run as the Markdown block ``bench/RESULTS.md`` keeps: the setup in
words, then each measured window as a table per 30 s interval (``fleet_counts.py`` counts
what it shows).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import sys
from collections.abc import Mapping
from typing import NamedTuple

from bench.fleet_counts import (
    INTERVAL_S,
    PROFILE_RATE,
    Run,
    Snapshot,
    delta,
    quantile,
    schedule,
)
from bench.fleet_operators import process_names
from bench.provenance import provenance


def render(args: argparse.Namespace, run: Run) -> str:
    """The run as a Markdown block for bench/RESULTS.md."""
    rounds = (run.b.at - run.a.at) / INTERVAL_S
    command = " ".join(["python -m bench.bench_fleet", *sys.argv[1:]])
    count = run.shape.count
    lines = [
        f"### {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: {count:,} policies, `{command}`",
        "",
        *(f"- `{line}`" for line in provenance()),
        f"- fleet: {run.shape.words()}",
        f"- setup: {count:,} × (Deployment + pod + HPA + policy) created in "
        f"{run.creation_s:.0f} s "
        f"({args.threads} threads, 7 requests each); {run.evaluated:,} policies in "
        f"{run.evaluated_namespaces:,} namespaces evaluated at "
        f"least once {run.first_round_s:.0f} s after the operator started (once every window "
        f"held 5 minutes of scraped data); kopf's first pass over the policies (its "
        f"finalizer and annotation) over after {run.first_pass_s:.0f} s; then measured "
        f"{rounds:.2f} intervals of 30 s, {args.warmup:.0f} s later; 1-minute load average "
        f"{run.a.load} at its start, {run.b.load} at its end (everything runs under nice 10 "
        "on a machine shared with other jobs)",
        *(
            [
                f"- profiled: py-spy stopped the operator {PROFILE_RATE} times a second over "
                "the steady window to sample the stack holding the GIL"
            ]
            if args.profile
            else []
        ),
        "",
        *window_rows(run, run.a, run.b, run.rss_mib),
    ]
    if run.then is not None:
        then = run.then
        lines += [
            "",
            f"Then `{then.what}` ({DISRUPTION_WORDS[then.what]}), measured from the fault "
            f"for {(then.b.at - then.a.at) / INTERVAL_S:.2f} intervals, its first round "
            f"included; load {then.a.load} → {then.b.load}:",
            "",
            *window_rows(run, then.a, then.b, then.rss_mib),
        ]
    return "\n".join(lines) + "\n"


DISRUPTION_WORDS = {
    "restart": "the operator SIGKILLed and started again",
    "relist": "kube-apiserver killed, etcd compacted, kube-apiserver restarted",
}


def window_rows(run: Run, a: Snapshot, b: Snapshot, rss_mib: list[float]) -> list[str]:
    """One measured window as table rows, per 30 s interval; with shards, a table of
    them follows; with a slow chunk, its rows end the first."""
    rounds = (b.at - a.at) / INTERVAL_S
    names = run.shape.keys()
    late, missed, counted = schedule(run.evaluations.times, names, a.at, b.at, INTERVAL_S)
    api = delta(b.api, a.api, rounds)
    bench = delta(b.bench, a.bench, rounds)
    api = {k: v - run.baseline.get(k, 0.0) - bench.get(k, 0.0) for k, v in api.items()}
    api = {k: v for k, v in api.items() if round(v, 1) != 0}
    by_verb: dict[str, float] = collections.defaultdict(float)
    for key, value in api.items():
        by_verb[key.split()[0]] += value
    prom = delta(b.prometheus, a.prometheus, rounds)
    cpu = delta(b.cpu, a.cpu, rounds)
    own = delta(b.own, a.own, rounds)
    evaluated = own.get(OWN_EVALUATIONS)
    operator_cpu = sum(cpu.get(name, 0.0) for name in process_names(run.shape.shards))
    return [
        "| per 30 s interval | value |",
        "|---|---|",
        f"| evaluations, the operator's own count (wanted {run.shape.count:,}) | "
        + (f"{evaluated:,.0f} |" if evaluated is not None else "– |"),
        "| operator CPU per evaluation (ms) | "
        + (f"{1000 * operator_cpu / evaluated:.2f} |" if evaluated else "– |"),
        f"| evaluations seen between /metrics reads | {counted / rounds:,.0f} |",
        f"| missed intervals (policy × interval, whole window) | {missed:,} |",
        f"| longest gap between two reads of the operator's /metrics (s) | "
        f"{run.evaluations.longest_gap(a.at, b.at):.1f} |",
        f"| lateness p95 / max (s), over {len(late):,} evaluations after a first | "
        + (f"{quantile(late, 0.95):.1f} / {max(late):.1f} |" if late else "– |"),
        f"| Prometheus API requests | {sum(prom.values()):,.0f} "
        f"({', '.join(f'{k} {v:,.0f}' for k, v in prom.items())}) |",
        f"| API-server requests (minus its own baseline and the bench's restarts) | "
        f"{sum(api.values()):,.1f} "
        f"({', '.join(f'{k} {v:,.1f}' for k, v in by_verb.items())}) |",
        *(f"| — {k} | {v:,.1f} |" for k, v in sorted(api.items(), key=lambda kv: -kv[1])),
        f"| operator CPU-seconds | {operator_cpu:.2f} ({operator_cpu / INTERVAL_S:.2f} cores) |",
        f"| operator peak RSS (VmHWM) | {sum(rss_mib):,.0f} MiB |",
        f"| Prometheus / API-server CPU-seconds | {cpu.get('prometheus', 0.0):.2f} "
        f"/ {cpu.get('apiserver', 0.0):.2f} |",
        *own_rows(own),
        *(slow_rows(run, a, b, api) if run.shape.slowed else []),
        *(shard_rows(run, a, b, rss_mib) if run.shape.shards > 1 else []),
    ]


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def slow_rows(run: Run, a: Snapshot, b: Snapshot, api: Mapping[str, float]) -> list[str]:
    """With a slow chunk: the slowed policies and the others on their schedules, the
    proxy's requests, and the API writes (``api``, per interval) against N/10. A slowed
    evaluation lasts up to two deadlines and its stamp is seen when it ends, so the
    window's last one may end after the window: its policies then count a missed
    interval here (not in the operator's own missed counter)."""
    rounds = (b.at - a.at) / INTERVAL_S
    shape = run.shape
    slowed = [shape.key(k) for k in sorted(shape.slowed)]
    others = [shape.key(k) for k in range(shape.count) if k not in shape.slowed]
    times = run.evaluations.times
    _, slow_missed, slow_counted = schedule(times, slowed, a.at, b.at, INTERVAL_S)
    late, missed, counted = schedule(times, others, a.at, b.at, INTERVAL_S)
    proxy = delta(b.proxy, a.proxy, rounds)
    writes = {k: v for k, v in api.items() if k.split()[0] in WRITE_VERBS}
    return [
        f"| slow chunk: policies reading through the slow proxy / the others | "
        f"{len(slowed):,} / {len(others):,} |",
        f"| — evaluations seen between /metrics reads: slowed / others | "
        f"{slow_counted / rounds:,.0f} / {counted / rounds:,.0f} |",
        f"| — missed intervals (policy × interval, whole window): slowed / others | "
        f"{slow_missed:,} / {missed:,} |",
        f"| — the others' lateness p95 / max (s), over {len(late):,} evaluations | "
        + (f"{quantile(late, 0.95):.1f} / {max(late):.1f} |" if late else "– |"),
        "| — slow proxy requests: delayed (of them abandoned by their client) / passed | "
        f"{proxy.get('delayed', 0.0):,.1f} ({proxy.get('abandoned', 0.0):,.1f}) "
        f"/ {proxy.get('passed', 0.0):,.1f} |",
        f"| — API writes (wanted ≤ N/10 = {shape.count / 10:,.0f}) | "
        f"{sum(writes.values()):,.1f} "
        f"({', '.join(f'{k} {v:,.1f}' for k, v in sorted(writes.items()))}) |",
    ]


class ShardRow(NamedTuple):
    """One shard's line (or their sum) in the shards' table, per interval."""

    who: str
    namespaces: int
    policies: int
    evaluations: float
    cpu_s: float
    rss_mib: float

    def cells(self) -> str:
        per = f"{1000 * self.cpu_s / self.evaluations:.2f}" if self.evaluations else "–"
        return (
            f"| {self.who} | {self.namespaces:,} | {self.policies:,} | {self.evaluations:,.0f} "
            f"| {self.cpu_s:.2f} ({self.cpu_s / INTERVAL_S:.2f}) | {per} | {self.rss_mib:,.0f} |"
        )


def shard_rows(run: Run, a: Snapshot, b: Snapshot, rss_mib: list[float]) -> list[str]:
    """With shards: each shard's namespaces and policies, its evaluations (its own
    count), CPU-seconds (cores), CPU per evaluation and peak RSS, per interval; then
    their sum."""
    rounds = (b.at - a.at) / INTERVAL_S
    shape = run.shape
    cpu = delta(b.cpu, a.cpu, rounds)
    spaces = min(shape.count, shape.namespaces)
    rows = [
        ShardRow(
            str(i),
            sum(1 for j in range(spaces) if j % shape.shards == i),
            sum(1 for k in range(shape.count) if shape.shard(k) == i),
            (b.shards[i].get(OWN_EVALUATIONS, 0.0) - a.shards[i].get(OWN_EVALUATIONS, 0.0))
            / rounds,
            cpu.get(name, 0.0),
            rss_mib[i],
        )
        for i, name in enumerate(process_names(shape.shards))
    ]
    total = ShardRow(
        "sum",
        spaces,
        shape.count,
        sum(row.evaluations for row in rows),
        sum(row.cpu_s for row in rows),
        sum(row.rss_mib for row in rows),
    )
    return [
        "",
        "| shard | namespaces | policies | evaluations (own count) | CPU-seconds (cores) "
        "| CPU per evaluation (ms) | peak RSS (VmHWM, MiB) |",
        "|---|---|---|---|---|---|---|",
        *(row.cells() for row in [*rows, total]),
    ]


OWN_EVALUATIONS = "cachescale_evaluation_lateness_seconds_count{}"
"""The operator's own count of the evaluations it started (one lateness each): what the
headline row counts. The stamps seen between /metrics reads miss an evaluation that
started but had not ended at a read, and count two between reads as one."""


def own_rows(own: Mapping[str, float]) -> list[str]:
    """The operator's own counters, per interval; its lateness histogram as a p95 bound."""
    bucket = "cachescale_evaluation_lateness_seconds_bucket"
    buckets = sorted(
        (float(json.loads(k[len(bucket) :])["le"]), v)
        for k, v in own.items()
        if k.startswith(bucket)
    )
    rows = [f"| operator's own `{k}` | {v:,.1f} |" for k, v in own.items() if bucket not in k]
    if buckets and buckets[-1][1] > 0:
        bound = next(le for le, seen in buckets if seen >= 0.95 * buckets[-1][1])
        rows.append(f"| operator's own lateness histogram: p95 ≤ | {bound:g} s |")
    return rows
