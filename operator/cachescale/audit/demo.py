"""``cachescale audit demo``: baseline and candidate corpora for the incident's cases.

Every case starts from one baseline, a multi-turn RAG assistant whose prompts are
cache-friendly: a fixed system prompt, tool definitions in a fixed order, the chunks
retrieved once at the start of the conversation (512-token chunks of the topic's
document), then the history, append-only. Each candidate changes one thing:

* ``rechunk-retrieval-first``: the incident: 500-token chunks, retrieval re-run every turn
  and rendered ahead of the history;
* ``boundary-shift-only``: 500-token chunks and nothing else (heals: passes the gate);
* ``timestamp-top``: a per-request timestamp rendered near the top of the system prompt;
* ``shuffled-tools``: tool definitions in a new order on every request;
* ``sliding-window``: only the last four history messages are kept;
* ``prompt-doubled``: a long fixed preamble roughly doubles every prompt (the hit rate
  holds; the prefill bill does not).

Token ids are drawn from a seeded generator (no tokenizer needed), so a case is the same
bytes on every machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

CONVERSATIONS = 40
TURNS = 6
TOPICS = 10
_VOCAB = (1000, 60000)


@dataclass(frozen=True, slots=True)
class _Variant:
    chunk: int = 512
    retrieval_per_turn: bool = False
    timestamp: bool = False
    shuffle_tools: bool = False
    window: int | None = None
    preamble: int = 0


VARIANTS: dict[str, _Variant] = {
    "rechunk-retrieval-first": _Variant(chunk=500, retrieval_per_turn=True),
    "boundary-shift-only": _Variant(chunk=500),
    "timestamp-top": _Variant(timestamp=True),
    "shuffled-tools": _Variant(shuffle_tools=True),
    "sliding-window": _Variant(window=4),
    "prompt-doubled": _Variant(preamble=3000),
}


def _words(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*_VOCAB) for _ in range(n)]


def corpus_lines(variant: _Variant, seed: int) -> list[str]:
    """The JSONL lines of one corpus (the same seed gives every variant the same content)."""
    rng = random.Random(seed)
    change = random.Random(seed + 1)  # the variant's own draws: content stays the same
    system = _words(rng, 400)
    tools = [_words(rng, 60) for _ in range(8)]
    preamble = _words(rng, variant.preamble)
    documents = [_words(rng, 4096) for _ in range(TOPICS)]
    chunked = [
        [doc[i : i + variant.chunk] for i in range(0, len(doc), variant.chunk)] for doc in documents
    ]
    lines: list[str] = []
    for conversation in range(CONVERSATIONS):
        topic = rng.randrange(TOPICS)
        first = rng.sample(range(6), 2)
        messages: list[list[int]] = []
        for turn in range(TURNS):
            user = _words(rng, rng.randrange(100, 200))
            order = list(range(len(tools)))
            if variant.shuffle_tools:
                change.shuffle(order)
            picks = change.sample(range(6), 2) if variant.retrieval_per_turn and turn else first
            retrieved = [t for k in picks for t in chunked[topic][k]]
            top = system[:5] + _words(change, 6) + system[5:] if variant.timestamp else system
            history = messages if variant.window is None else messages[-variant.window :]
            head = preamble + top + [t for k in order for t in tools[k]]
            body = [t for message in history for t in message]
            prompt = head + retrieved + body + user
            lines.append(
                json.dumps(
                    {
                        "conversation_id": f"c{conversation}",
                        "turn": turn,
                        "prompt_token_ids": prompt,
                    }
                )
            )
            messages += [user, _words(rng, rng.randrange(200, 400))]
    return lines


def write_case(case: str, folder: Path, seed: int = 0) -> list[Path]:
    """Write ``baseline.jsonl`` and ``candidate.jsonl`` for a case; return their paths."""
    written = []
    for name, variant in (("baseline", _Variant()), ("candidate", VARIANTS[case])):
        path = folder / f"{name}.jsonl"
        path.write_text("\n".join(corpus_lines(variant, seed)) + "\n", encoding="utf-8")
        written.append(path)
    return written


def build_case(case: str, seed: int = 0) -> tuple[list[str], list[str]]:
    """A case's baseline and candidate JSONL lines."""
    return corpus_lines(_Variant(), seed), corpus_lines(VARIANTS[case], seed)
