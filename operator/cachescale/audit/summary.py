"""What ``cachescale audit run`` prints: both passes' figures and the audit pass's causes."""

from __future__ import annotations

from typing import Any

_ROWS = (
    ("token_hit_rate", "token hit rate", "{:.3f}"),
    ("request_hit_share", "request hit share", "{:.3f}"),
    ("recomputed_tokens_per_request", "recomputed tokens / request", "{:,.0f}"),
    ("prompt_tokens_per_request", "prompt tokens / request", "{:,.0f}"),
    ("requests", "requests", "{:,}"),
)


def render_run(result: dict[str, Any]) -> str:
    """A short report of one result."""
    corpus, settings = result["corpus"], result["settings"]
    live = result.get("live")
    pool = settings["kv_blocks"] or ("the engine's" if live else "unbounded")
    engine = settings.get("engine", "vllm")
    cache = (
        "SGLang radix cache (page size 1)"
        if engine == "sglang"
        else f"block size {settings['block_size']}, pool {pool}, hash {settings['hash_algo']}"
    )
    lines = [
        f"corpus {corpus['path']}: {corpus['records']:,} requests in "
        f"{corpus['conversations']:,} conversations ({corpus['warmup_conversations']:,} warm "
        f"the cache); {cache}",
        "",
        f"{'':<30}{'warm-up':>10}{'audit':>10}",
    ]
    if live:
        lines[1:1] = [
            f"live: {live['endpoint']}, counters {live['metrics']} at {live['metrics_url']}"
        ]
    warm, audit = result["passes"]["warmup"], result["passes"]["audit"]
    for key, label, form in _ROWS:
        lines.append(f"{label:<30}{form.format(warm[key]):>10}{form.format(audit[key]):>10}")
    causes = result["causes"]["audit"]
    if causes:
        lines += ["", "why the audit pass missed:"]
    for entry in causes:
        lines.append(
            f"  - {entry['cause']}: {entry['requests']:,} request"
            f"{'' if entry['requests'] == 1 else 's'} ({entry['share']:.0%}), "
            f"{entry['recomputed_tokens']:,} tokens recomputed: {entry['meaning']}"
        )
        lines += [
            f"      conversation {ex['conversation_id']} turn {ex['turn']} (line {ex['line']}): "
            f"{ex['where']}"
            for ex in entry["examples"][:1]
        ]
    lines += [f"note: {note}" for note in result.get("notes", [])]
    lines += [f"warning: {warning}" for warning in result.get("warnings", [])]
    return "\n".join(lines) + "\n"
