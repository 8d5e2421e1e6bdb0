"""The candidate's prompts aligned with the baseline's: what the change did to each prompt.

``audit run CANDIDATE --baseline-corpus BASELINE`` matches every request of the candidate
corpus with the baseline corpus's request of the same conversation and turn, aligns the
two token by token from the first token where they part to the end (every change in turn:
``divergence.diff`` from where the last one rejoined), and names what the change did:

* ``cache-salt``: the same tokens under another ``cache_salt``;
* ``rechunked``: the same text with its boundaries moved: two or more changes, text
  inserted in one place and removed in another (at least one change only inserts or only
  removes), the prompts agreeing to the end, and more text kept than changed (chunks
  re-cut 512 → 500);
* otherwise the first change named as a turn's is (``causes.turn_cause``): a variable
  span, a reordering, text dropped (``sliding-window``), text inserted ahead of the rest
  (``retrieval-rerun``), or a rewrite.

The result keeps, per cause, how many requests changed so and a few quoted examples, and
per request the cause: ``compare`` says it beside the gate's figures. The baseline corpus
must come through the same tokenizer and template: run it with the same flags.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from cachescale.audit.causes import turn_cause
from cachescale.audit.corpus import Corpus, Record
from cachescale.audit.divergence import Change, Tokens, diff
from cachescale.audit.explain import Context, Decode, quote

#: Examples quoted per change.
EXAMPLES = 3
#: Changes followed along one prompt, at most.
MAX_CHANGES = 64

#: What a change to the baseline's prompts did, for causes only seen against the baseline.
MEANINGS = {
    "rechunked": "chunk boundaries moved: the same text, cut in other places (re-chunking); "
    "it heals after warm-up when the new chunks repeat",
}


def changes(a: Tokens, b: Tokens, block_size: int) -> list[Change]:
    """Every change from ``b`` to ``a``, in order: each diff starts where the last rejoined
    (the list ends with a change that never rejoins, or where both prompts end)."""
    found: list[Change] = []
    i = j = 0
    while len(found) < MAX_CHANGES:
        change = diff(a[i:], b[j:], 0, block_size)
        if change.position >= len(a) - i and change.position >= len(b) - j:
            break
        found.append(_shifted(change, i))
        if not change.rejoins:
            break
        i += change.position + change.inserted + change.rejoined
        j += change.position + change.removed + change.rejoined
    return found


def _shifted(change: Change, offset: int) -> Change:
    return Change(
        change.position + offset,
        change.inserted,
        change.removed,
        change.reordered,
        change.rejoined,
        change.keeps_rest,
    )


def _rechunked(found: list[Change]) -> bool:
    if len(found) < 2 or not found[-1].keeps_rest or any(c.reordered for c in found):
        return False
    moved = any(c.inserted == 0 or c.removed == 0 for c in found)
    both = any(c.inserted for c in found) and any(c.removed for c in found)
    kept = sum(c.rejoined for c in found[:-1])
    edited = sum(max(c.inserted, c.removed) for c in found)
    return moved and both and kept > edited


def cause_of(found: list[Change]) -> str:
    """What the changes from the baseline's prompt to the candidate's did."""
    if _rechunked(found):
        return "rechunked"
    return turn_cause(found[0])


def _example(candidate: Record, where: str) -> dict[str, Any]:
    return {
        "conversation_id": candidate.conversation_id,
        "turn": candidate.turn,
        "line": candidate.line,
        "where": where,
    }


def against_baseline(
    candidate: Corpus, baseline: Corpus, block_size: int, decode: Decode | None = None
) -> tuple[dict[str, Any], dict[tuple[str, int], str]]:
    """The result's ``baseline`` section and each changed request's cause, by
    (conversation, turn)."""
    base = {(r.conversation_id, r.turn): r for r in baseline.records}
    ctx = Context([], block_size, False, decode)
    per_request: dict[tuple[str, int], str] = {}
    examples: dict[str, list[dict[str, Any]]] = {}
    matched = 0
    for record in candidate.records:
        other = base.get((record.conversation_id, record.turn))
        if other is None:
            continue
        matched += 1
        found = changes(record.tokens, other.tokens, block_size)
        if found:
            cause = cause_of(found)
            where = quote(record.tokens, other.tokens, found[0], "baseline", ctx).describe()
        elif record.cache_salt != other.cache_salt:
            cause = "cache-salt"
            where = f"token 0, block 0: cache_salt {record.cache_salt!r} where the baseline "
            where += f"has {other.cache_salt!r}, the same tokens"
        else:
            continue
        per_request[(record.conversation_id, record.turn)] = cause
        quoted = examples.setdefault(cause, [])
        if len(quoted) < EXAMPLES:
            quoted.append(_example(record, where))
    counts = Counter(per_request.values())
    section = {
        "corpus_sha256": baseline.sha256,
        "matched": matched,
        "changed": len(per_request),
        "changes": [
            {"cause": cause, "requests": count, "examples": examples[cause]}
            for cause, count in counts.most_common()
        ],
    }
    return section, per_request


def attach(result: dict[str, Any], section: dict[str, Any], per_request: dict[Any, str]) -> None:
    """Put the ``baseline`` section in a result, and each request's ``baseline_change``."""
    result["baseline"] = section
    for request in result["requests"]:
        request["baseline_change"] = per_request.get((request["conversation_id"], request["turn"]))
