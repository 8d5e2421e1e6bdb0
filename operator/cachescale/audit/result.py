"""The result of ``cachescale audit run``: figures, causes and what makes two comparable.

A result is one JSON object (:data:`FORMAT`). ``settings`` holds everything that changes
what a hit is (engine, block size, pool bound, hash, tokenizer, chat template, the hit
threshold): two results are comparable only when their settings are equal, and
``compare`` refuses otherwise. ``corpus`` names the corpus by its sha256, so a reader can
tell which corpus a figure came from. ``passes`` holds the figures of the warm-up and the
audit pass; the gate reads the audit pass. ``causes`` lists, per pass, the classified
misses with a few quoted examples. ``requests`` holds every request's figures and a short
prefix of each of its block hashes (``chain``), so ``compare`` can say where the
candidate's prompts left the baseline's. ``tenancy``, ``notes`` and ``warnings`` say what
tenants share (``audit/tenancy.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cachescale.audit.causes import CAUSES
from cachescale.audit.corpus import Corpus
from cachescale.audit.explain import Outcome
from cachescale.audit.replay import Replay
from cachescale.audit.tenancy import tenancy

FORMAT = "cachescale-audit/v1"
#: Examples quoted per cause.
EXAMPLES = 3
#: Requests per point of the hit-rate series (replay order, both passes).
WINDOW = 100
#: Bytes of each block hash kept per request (hex in the file): enough for ``compare`` to
#: find the first block where a candidate's prompt leaves the baseline's (a false match
#: is a 1 in 2**32 chance per block), at 8 characters a block.
CHAIN_BYTES = 4

#: The figures of a set of requests, and the keys ``compare`` gates on.
METRICS = (
    "token_hit_rate",
    "request_hit_share",
    "recomputed_tokens_per_request",
    "prompt_tokens_per_request",
)


class ResultError(ValueError):
    """A result file that cannot be read or compared; the message names the file."""


def _figures(outcomes: list[Outcome]) -> dict[str, float | int]:
    prompt = sum(o.prompt_tokens for o in outcomes)
    cached = sum(o.cached_tokens for o in outcomes)
    n = len(outcomes)
    return {
        "requests": n,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "request_hit_share": sum(o.hit for o in outcomes) / n if n else 0.0,
        "recomputed_tokens_per_request": (prompt - cached) / n if n else 0.0,
        "prompt_tokens_per_request": prompt / n if n else 0.0,
    }


def _causes(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    total = len(outcomes)
    found: list[dict[str, Any]] = []
    for cause, meaning in CAUSES.items():
        hit = [o for o in outcomes if o.cause == cause]
        if not hit:
            continue
        found.append(
            {
                "cause": cause,
                "meaning": meaning,
                "requests": len(hit),
                "share": len(hit) / total,
                "recomputed_tokens": sum(o.recomputed_tokens for o in hit),
                "examples": [
                    {
                        "conversation_id": o.record.conversation_id,
                        "turn": o.record.turn,
                        "line": o.record.line,
                        "where": o.divergence.describe(),
                        "position": o.divergence.position,
                        "block": o.divergence.block,
                        "against": o.divergence.against,
                        "inserted": o.divergence.inserted,
                        "removed": o.divergence.removed,
                        "text": o.divergence.text,
                        "reference_text": o.divergence.reference_text,
                    }
                    for o in hit[:EXAMPLES]
                    if o.divergence is not None
                ],
            }
        )
    found.sort(key=lambda entry: -int(entry["recomputed_tokens"]))
    return found


def _conversations(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    by_id: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_id.setdefault(outcome.record.conversation_id, []).append(outcome)
    return [
        {"conversation_id": key, "pass": group[0].pass_name, **_figures(group)}
        for key, group in by_id.items()
    ]


def _windows(outcomes: list[Outcome]) -> list[float]:
    series = []
    for start in range(0, len(outcomes), WINDOW):
        window = outcomes[start : start + WINDOW]
        series.append(round(float(_figures(window)["token_hit_rate"]), 4))
    return series


def build_result(
    corpus: Corpus,
    corpus_path: str,
    replay: Replay,
    tokenizer_sha256: str | None = None,
    chat_template_sha256: str | None = None,
) -> dict[str, Any]:
    """The result object of one audit run (``tokenizer_sha256``: the pinned tokenizer's
    file, when the corpus had text prompts; ``chat_template_sha256``: the chat template's
    text, when it had messages)."""
    passes = {
        name: [o for o in replay.outcomes if o.pass_name == name] for name in ("warmup", "audit")
    }
    shared, notes, warnings = tenancy(replay.outcomes, replay.block_size, replay.hash_algo)
    return {
        "format": FORMAT,
        "settings": {
            "engine": replay.engine,
            "block_size": replay.block_size,
            "kv_blocks": replay.kv_blocks,
            "hash_algo": replay.hash_algo,
            "tokenizer": tokenizer_sha256,
            "chat_template": chat_template_sha256,
            "hit_fraction": replay.hit_fraction,
        },
        "corpus": {
            "path": corpus_path,
            "sha256": corpus.sha256,
            "records": len(corpus.records),
            "conversations": len(corpus.conversations),
            "warmup_conversations": replay.warmup_conversations,
        },
        "tenancy": shared,
        "notes": notes,
        "warnings": warnings,
        "passes": {name: _figures(group) for name, group in passes.items()},
        "causes": {name: _causes(group) for name, group in passes.items()},
        "hit_rate_windows": {"requests": WINDOW, "token_hit_rate": _windows(replay.outcomes)},
        "conversations": _conversations(replay.outcomes),
        "requests": [
            {
                "conversation_id": o.record.conversation_id,
                "turn": o.record.turn,
                "prompt_tokens": o.prompt_tokens,
                "cached_tokens": o.cached_tokens,
                "cause": o.cause,
                "chain": "".join(block[:CHAIN_BYTES].hex() for block in o.chain),
            }
            for o in replay.outcomes
        ],
    }


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def load_result(path: Path) -> dict[str, Any]:
    """Read a result file and check the parts ``compare`` relies on."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ResultError(f"{path}: cannot read: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultError(f"{path}: not a JSON audit result ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultError(f"{path}: not a {FORMAT} result (write one with cachescale audit run)")
    passes, causes = data.get("passes"), data.get("causes")
    audit = passes.get("audit") if isinstance(passes, dict) else None
    if (
        not isinstance(audit, dict)
        or not all(_number(audit.get(key)) for key in METRICS)
        or not isinstance(data.get("settings"), dict)
        or not isinstance(causes, dict)
        or not isinstance(causes.get("audit"), list)
        or not all(_cause_entry(entry) for entry in causes["audit"])
        or not isinstance(data.get("requests"), list)
        or not all(_request_entry(entry) for entry in data["requests"])
    ):
        raise ResultError(
            f"{path}: an incomplete {FORMAT} result (passes, settings, causes, requests)"
        )
    return data


def _request_entry(entry: object) -> bool:
    """True when a request entry has what ``compare`` reads."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("conversation_id"), str)
        and isinstance(entry.get("turn"), int)
        and isinstance(entry.get("chain"), str)
    )


def _cause_entry(entry: object) -> bool:
    """True when a cause entry has what ``compare`` reads."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("cause"), str)
        and isinstance(entry.get("meaning"), str)
        and all(_number(entry.get(key)) for key in ("requests", "recomputed_tokens"))
        and isinstance(entry.get("examples"), list)
        and all(
            isinstance(example, dict)
            and {"conversation_id", "turn", "line", "where"} <= example.keys()
            for example in entry["examples"]
        )
    )


def incompatible(baseline: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """Why two results cannot be compared (the first differing setting), or None."""
    base, cand = baseline["settings"], candidate["settings"]
    first = ("mode", "engine")  # the difference that explains the others
    for key in sorted(set(base) | set(cand), key=lambda key: (key not in first, key)):
        if base.get(key) != cand.get(key):
            return (
                f"{key} differs ({base.get(key)} in the baseline, {cand.get(key)} in the "
                "candidate): rerun both with the same settings"
            )
    return None


def dumps(result: dict[str, Any]) -> str:
    """The result as the file holds it."""
    return json.dumps(result, indent=1) + "\n"
