"""``cachescale audit compare``: the gate, and the words that say why it failed.

Three gates, all on the audit pass (the warm-up pass is where a cold cache and a boundary
shift pay, and both heal, so it never fails the build):

* the token hit rate may fall by at most ``max_hit_rate_drop`` (absolute);
* recomputed (prefill) tokens per request may rise by at most ``max_recompute_rise``
  (relative);
* prompt tokens per request may grow by at most ``max_prompt_growth`` (relative): a prompt
  that doubled costs twice the prefill at a steady hit rate.

The cause named for a regression is the one whose recomputed tokens grew most from the
baseline to the candidate, quoted with an example; a failed prompt-growth gate names the
growth itself. Pure: it reads two result objects and returns a verdict to render.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cachescale.audit.against import MEANINGS
from cachescale.audit.result import CHAIN_BYTES

#: Hex characters per block in a result's ``chain``.
HEX_PER_BLOCK = 2 * CHAIN_BYTES

#: Causes that heal after warm-up or are the workload's own: never named as a regression's
#: cause while another cause grew.
_BENIGN = ("boundary-shift", "unique")

_LABELS = {
    "token_hit_rate": "token hit rate",
    "request_hit_share": "request hit share",
    "recomputed_tokens_per_request": "recomputed tokens / request",
    "prompt_tokens_per_request": "prompt tokens / request",
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The gate's limits."""

    max_hit_rate_drop: float = 0.05
    max_recompute_rise: float = 0.10
    max_prompt_growth: float = 0.25


@dataclass(frozen=True, slots=True)
class Verdict:
    """The comparison: the figures, the failed gates and the causes."""

    rows: list[tuple[str, float, float]]
    failures: list[str]
    causes: list[dict[str, Any]]
    headline: str
    notes: list[str]
    cause: str | None
    """The cause named for a regression: a cause id, or ``"prompt-growth"``."""
    warnings: list[str]
    """The candidate's warnings (a non-cryptographic hash shared by tenants)."""

    @property
    def regression(self) -> bool:
        """True when any gate failed."""
        return bool(self.failures)


def _relative(base: float, cand: float) -> float:
    return (cand - base) / base if base > 0 else (0.0 if cand <= 0 else float("inf"))


def _cause_table(baseline: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    base = {entry["cause"]: entry for entry in baseline["causes"].get("audit", [])}
    cand = {entry["cause"]: entry for entry in candidate["causes"].get("audit", [])}
    rows = []
    for cause in dict.fromkeys([*cand, *base]):
        b, c = base.get(cause, {}), cand.get(cause, {})
        rows.append(
            {
                "cause": cause,
                "meaning": c.get("meaning") or b.get("meaning", ""),
                "baseline_requests": int(b.get("requests", 0)),
                "candidate_requests": int(c.get("requests", 0)),
                "recomputed_tokens_change": int(c.get("recomputed_tokens", 0))
                - int(b.get("recomputed_tokens", 0)),
                "examples": list(c.get("examples", [])),
            }
        )
    rows.sort(key=lambda row: -row["recomputed_tokens_change"])
    return rows


def _named_cause(causes: list[dict[str, Any]]) -> dict[str, Any] | None:
    grown = [row for row in causes if row["recomputed_tokens_change"] > 0]
    harmful = [row for row in grown if row["cause"] not in _BENIGN]
    chosen = harmful or grown
    return chosen[0] if chosen else None


def _first_different_block(mine: str, other: str) -> int | None:
    """The first block at which two chains differ, or None when one extends the other."""
    step = HEX_PER_BLOCK
    for block in range(min(len(mine), len(other)) // step):
        if mine[block * step : (block + 1) * step] != other[block * step : (block + 1) * step]:
            return block
    return None


def _prompt_changes(
    baseline: dict[str, Any], candidate: dict[str, Any]
) -> tuple[int, int, int | None]:
    """Requests matched by conversation and turn, how many of them changed content (not
    only grew or shrank at the end), and the block where most changes begin."""
    base = {(r["conversation_id"], r["turn"]): r["chain"] for r in baseline["requests"]}
    matched = changed = 0
    starts: Counter[int] = Counter()
    for request in candidate["requests"]:
        other = base.get((request["conversation_id"], request["turn"]))
        if other is None:
            continue
        matched += 1
        first = _first_different_block(request["chain"], other)
        if first is not None:
            changed += 1
            starts[first] += 1
    return matched, changed, (starts.most_common(1)[0][0] if starts else None)


def compare(baseline: dict[str, Any], candidate: dict[str, Any], limits: Thresholds) -> Verdict:
    """Gate the candidate's audit pass against the baseline's."""
    base, cand = baseline["passes"]["audit"], candidate["passes"]["audit"]
    rows = [(key, float(base[key]), float(cand[key])) for key in _LABELS]
    failures: list[str] = []
    drop = base["token_hit_rate"] - cand["token_hit_rate"]
    if drop > limits.max_hit_rate_drop:
        failures.append(
            f"token hit rate fell {base['token_hit_rate']:.3f} → {cand['token_hit_rate']:.3f} "
            f"(−{drop:.3f}; limit −{limits.max_hit_rate_drop:g})"
        )
    rise = _relative(base["recomputed_tokens_per_request"], cand["recomputed_tokens_per_request"])
    if rise > limits.max_recompute_rise:
        failures.append(
            f"recomputed tokens per request rose {base['recomputed_tokens_per_request']:,.0f} → "
            f"{cand['recomputed_tokens_per_request']:,.0f} (+{rise:.0%}; limit "
            f"+{limits.max_recompute_rise:.0%})"
        )
    growth = _relative(base["prompt_tokens_per_request"], cand["prompt_tokens_per_request"])
    if growth > limits.max_prompt_growth:
        failures.append(
            f"prompt tokens per request grew {base['prompt_tokens_per_request']:,.0f} → "
            f"{cand['prompt_tokens_per_request']:,.0f} (+{growth:.0%}; limit "
            f"+{limits.max_prompt_growth:.0%})"
        )
    causes = _cause_table(baseline, candidate)
    named = _named_cause(causes)
    notes: list[str] = []
    matched, changed, block = _prompt_changes(baseline, candidate)
    if block is not None:
        block_size = int(candidate["settings"]["block_size"])
        notes.append(
            f"the candidate's prompts differ from the baseline's in {changed} of {matched} "
            f"requests matched by conversation and turn, most often from block {block} "
            f"(token {block * block_size})"
        )
    if not failures and block is not None:
        notes.append(
            "boundary shift: the prompts changed, yet the audit pass hits as well as the "
            "baseline's: the change heals after warm-up and does not fail the build"
        )
    elif not failures and any(
        row["cause"] == "boundary-shift" and row["candidate_requests"] for row in causes
    ):
        notes.append(
            "cold prefixes: some misses are new content that later requests reuse; it "
            "heals after warm-up and does not fail the build by itself"
        )
    cause: str | None = None
    if not failures:
        headline = "PASS: no cache regression"
    elif growth > limits.max_prompt_growth and (named is None or len(failures) == 1):
        headline = (
            f"REGRESSION: prompt growth: prompts are {growth:+.0%} longer per request at a "
            f"token hit rate of {cand['token_hit_rate']:.3f}"
        )
        cause = "prompt-growth"
    elif named is not None:
        example = named["examples"][0] if named["examples"] else None
        where = (
            f"; e.g. conversation {example['conversation_id']} turn {example['turn']}: "
            f"{example['where']}"
            if example
            else ""
        )
        headline = f"REGRESSION: cause: {named['meaning']}{where}"
        cause = str(named["cause"])
    else:
        headline = "REGRESSION: no single cause found (see the figures)"
    if not failures:
        notes += _under_the_gates(causes)
    notes += _baseline_notes(candidate.get("baseline"))
    notes += [f"candidate: {note}" for note in _strings(candidate.get("notes"))]
    warnings = _strings(candidate.get("warnings"))
    return Verdict(rows, failures, causes, headline, notes, cause, warnings)


def _under_the_gates(causes: list[dict[str, Any]]) -> list[str]:
    """A cause that costs recomputation while every gate passes (a sliding window whose
    requests still hit), named all the same."""
    notes = []
    for row in causes:
        if row["cause"] in _BENIGN or row["recomputed_tokens_change"] <= 0:
            continue
        example = row["examples"][0] if row["examples"] else None
        where = (
            f"; e.g. conversation {example['conversation_id']} turn {example['turn']}: "
            f"{example['where']}"
            if example
            else ""
        )
        notes.append(
            f"under the gates, {row['cause']} costs {row['recomputed_tokens_change']:+,} "
            f"recomputed tokens ({row['baseline_requests']} → {row['candidate_requests']} "
            f"requests): {row['meaning']}{where}"
        )
    return notes


def _baseline_notes(section: object) -> list[str]:
    """What the change did to the prompts, when the candidate was run with
    ``--baseline-corpus`` (``audit/against.py``)."""
    if not isinstance(section, dict) or not section.get("changes"):
        return []
    changes = section["changes"]
    counts = ", ".join(f"{entry['cause']} {entry['requests']}" for entry in changes)
    first = changes[0]["examples"][0] if changes[0]["examples"] else None
    example = (
        f"; e.g. conversation {first['conversation_id']} turn {first['turn']}: {first['where']}"
        if first
        else ""
    )
    notes = [
        f"against the baseline corpus, {section['changed']} of {section['matched']} requests "
        f"changed: {counts}{example}"
    ]
    notes += [MEANINGS[e["cause"]] for e in changes if e["cause"] in MEANINGS]
    return notes


def _strings(value: object) -> list[str]:
    """A result's list of notes or warnings (absent from older results)."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _fmt(key: str, value: float) -> str:
    return f"{value:.3f}" if key in ("token_hit_rate", "request_hit_share") else f"{value:,.0f}"


def _change(key: str, base: float, cand: float) -> str:
    if key in ("token_hit_rate", "request_hit_share"):
        return f"{cand - base:+.3f}"
    rel = _relative(base, cand)
    return f"{cand - base:+,.0f} ({rel:+.0%})" if rel != float("inf") else f"{cand - base:+,.0f}"


def render_table(verdict: Verdict) -> str:
    """Plain text for a terminal or a CI log."""
    lines = [verdict.headline, ""]
    lines.append(f"{'audit pass':<30}{'baseline':>12}{'candidate':>12}  change")
    for key, base, cand in verdict.rows:
        lines.append(
            f"{_LABELS[key]:<30}{_fmt(key, base):>12}{_fmt(key, cand):>12}  "
            f"{_change(key, base, cand)}"
        )
    if verdict.failures:
        lines += ["", "failed gates:"] + [f"  - {failure}" for failure in verdict.failures]
    if verdict.causes:
        lines += ["", "causes of misses (audit pass; requests baseline → candidate):"]
        for row in verdict.causes:
            lines.append(
                f"  - {row['cause']}: {row['baseline_requests']} → {row['candidate_requests']} "
                f"requests, recomputed tokens {row['recomputed_tokens_change']:+,}: "
                f"{row['meaning']}"
            )
            lines += [
                f"      conversation {ex['conversation_id']} turn {ex['turn']} "
                f"(line {ex['line']}): {ex['where']}"
                for ex in row["examples"][:2]
            ]
    lines += [f"note: {note}" for note in verdict.notes]
    lines += [f"warning: {warning}" for warning in verdict.warnings]
    return "\n".join(lines) + "\n"


def render_markdown(verdict: Verdict) -> str:
    """A pull-request comment."""
    mark = "❌" if verdict.regression else "✅"
    lines = [f"### {mark} cachescale audit: {verdict.headline}", ""]
    lines += ["| audit pass | baseline | candidate | change |", "|---|---:|---:|---:|"]
    lines += [
        f"| {_LABELS[key]} | {_fmt(key, base)} | {_fmt(key, cand)} | {_change(key, base, cand)} |"
        for key, base, cand in verdict.rows
    ]
    if verdict.failures:
        lines += ["", "**Failed gates**", ""] + [f"- {failure}" for failure in verdict.failures]
    if verdict.causes:
        lines += ["", "**Causes of misses** (audit pass)", ""]
        for row in verdict.causes:
            lines.append(
                f"- `{row['cause']}` ({row['baseline_requests']} → "
                f"{row['candidate_requests']} requests): {row['meaning']}"
            )
            lines += [
                f"  - conversation `{ex['conversation_id']}` turn {ex['turn']}: {ex['where']}"
                for ex in row["examples"][:1]
            ]
    lines += [""] + [f"_{note}_" for note in verdict.notes] if verdict.notes else []
    lines += [""] + [f"> ⚠️ {warning}" for warning in verdict.warnings] if verdict.warnings else []
    return "\n".join(lines) + "\n"


def render_json(verdict: Verdict) -> str:
    """One JSON object."""
    return (
        json.dumps(
            {
                "verdict": "regression" if verdict.regression else "pass",
                "cause": verdict.cause,
                "headline": verdict.headline,
                "metrics": [
                    {"metric": key, "baseline": base, "candidate": cand}
                    for key, base, cand in verdict.rows
                ],
                "failed": verdict.failures,
                "causes": verdict.causes,
                "notes": verdict.notes,
                "warnings": verdict.warnings,
            },
            indent=1,
        )
        + "\n"
    )
