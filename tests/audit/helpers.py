"""Corpora built in memory for the audit tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cachescale.audit.corpus import Corpus, parse_corpus


def corpus(*records: dict[str, Any]) -> Corpus:
    return parse_corpus(Path("test.jsonl"), "\n".join(json.dumps(r) for r in records))


def two_conversations(warm: list[list[int]], audited: list[list[int]], **fields: Any) -> Corpus:
    """Conversation "w" (the warm-up pass) then conversation "a" (the audit pass)."""
    records = [
        {"conversation_id": "w", "turn": turn, "prompt_token_ids": tokens}
        for turn, tokens in enumerate(warm)
    ] + [
        {"conversation_id": "a", "turn": turn, "prompt_token_ids": tokens, **fields}
        for turn, tokens in enumerate(audited)
    ]
    return corpus(*records)
