"""Corpora built in memory, and the audit command run as a user runs it, for the tests."""

from __future__ import annotations

import json
import subprocess
import sys
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


REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``cachescale audit ARGS`` in a subprocess, from ``cwd`` (the repository root)."""
    return subprocess.run(
        [sys.executable, "-m", "cachescale.commands.main", "audit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def results_by_setting(
    tmp_path: Path, flag: str, values: tuple[str, ...]
) -> tuple[Path, list[str]]:
    """Audit one small corpus once per value of ``--FLAG``, checking that each result
    records its value under ``settings``: the corpus and the results' paths."""
    source = tmp_path / "c.jsonl"
    source.write_text(
        "\n".join(
            json.dumps({"conversation_id": c, "turn": 0, "prompt_token_ids": list(range(40))})
            for c in ("a", "b")
        ),
        encoding="utf-8",
    )
    outs = []
    for value in values:
        out = tmp_path / f"{value}.json"
        done = cli("run", str(source), "--out", str(out), f"--{flag}", value)
        assert done.returncode == 0, done.stderr
        settings = json.loads(out.read_text(encoding="utf-8"))["settings"]
        assert settings[flag.replace("-", "_")] == value
        outs.append(str(out))
    return source, outs
