"""Small multi-turn corpora in three prompt layouts, each with one change, for the tests.

A conversation's prompt is a head, the retrieved chunks, the history kept, and the user's
message. The head is the system prompt then the tools (``system-first``), the tools then
the system prompt (``tools-first``), or the tools alone (``no-system``). A variant changes
one thing: a per-request value (6 tokens) at the top of the system prompt (after the tools
when there is none), the tools in a new order on every request, a sliding window over the
history, retrieval re-run every turn, another chunk size, or a ``cache_salt`` per tenant
or per conversation. Token ids are seeded; each per-request value is new ids, so it
differs from every other request's.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

LAYOUTS = ("system-first", "tools-first", "no-system")
CONVERSATIONS = 8
TURNS = 5
SYSTEM = 64
TOOLS = 4
TOOL = 24
DOCUMENT = 384
STAMP = 6


@dataclass(frozen=True, slots=True)
class Variant:
    """What a candidate changes (the default is the cache-friendly baseline)."""

    stamp: bool = False
    shuffle_tools: bool = False
    window: int | None = None
    retrieval_per_turn: bool = False
    chunk: int = 64
    salt: str | None = None
    """``tenant``: one salt per tenant; ``conversation``: one per conversation, one tenant."""


def _words(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 60000) for _ in range(n)]


def stamp_position(layout: str) -> int:
    """The token where a variant's per-request value starts in every prompt."""
    return 0 if layout == "system-first" else TOOLS * TOOL


def _head(layout: str, system: list[int], tools: list[int], stamp: list[int]) -> list[int]:
    if layout == "system-first":
        return stamp + system + tools
    if layout == "tools-first":
        return tools + stamp + system
    return tools + stamp


def records(layout: str, variant: Variant, seed: int = 0) -> list[dict[str, Any]]:
    """The corpus's records, in replay order."""
    rng, change = random.Random(seed), random.Random(seed + 1)
    fresh = itertools.count(100)  # ids of per-request values: never the same twice
    system, tools = _words(rng, SYSTEM), [_words(rng, TOOL) for _ in range(TOOLS)]
    documents = [_words(rng, DOCUMENT) for _ in range(3)]
    out: list[dict[str, Any]] = []
    for conversation in range(CONVERSATIONS):
        doc = documents[rng.randrange(3)]
        chunks = [doc[i : i + variant.chunk] for i in range(0, len(doc), variant.chunk)]
        first, history = rng.sample(range(5), 2), []
        for turn in range(TURNS):
            user = _words(rng, rng.randrange(20, 40))
            order = list(range(TOOLS))
            if variant.shuffle_tools:
                change.shuffle(order)
            picks = change.sample(range(5), 2) if variant.retrieval_per_turn and turn else first
            stamp = [next(fresh) for _ in range(STAMP)] if variant.stamp else []
            kept = history if variant.window is None else history[-variant.window :]
            head = _head(layout, system, [t for k in order for t in tools[k]], stamp)
            retrieved = [t for k in picks for t in chunks[k]]
            prompt = head + retrieved + [t for message in kept for t in message] + user
            record: dict[str, Any] = {
                "conversation_id": f"c{conversation}",
                "turn": turn,
                "prompt_token_ids": prompt,
                "tenant": f"t{conversation}" if variant.salt != "conversation" else "acme",
            }
            if variant.salt is not None:
                record["cache_salt"] = f"s{conversation}"
            out.append(record)
            history += [user, _words(rng, rng.randrange(30, 60))]
    return out
