"""Corpora built in memory, and the audit command run as a user runs it, for the tests."""

from __future__ import annotations

import json
import os
import shutil
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


def two_requests(tmp_path: Path) -> Path:
    """A corpus of two one-turn conversations with the same 40 tokens, in ``tmp_path``."""
    source = tmp_path / "c.jsonl"
    source.write_text(
        "\n".join(
            json.dumps({"conversation_id": c, "turn": 0, "prompt_token_ids": list(range(40))})
            for c in ("a", "b")
        ),
        encoding="utf-8",
    )
    return source


def results_by_setting(
    tmp_path: Path, flag: str, values: tuple[str, ...]
) -> tuple[Path, list[str]]:
    """Audit one small corpus once per value of ``--FLAG``, checking that each result
    records its value under ``settings``: the corpus and the results' paths."""
    source = two_requests(tmp_path)
    outs = []
    for value in values:
        out = tmp_path / f"{value}.json"
        done = cli("run", str(source), "--out", str(out), f"--{flag}", value)
        assert done.returncode == 0, done.stderr
        settings = json.loads(out.read_text(encoding="utf-8"))["settings"]
        assert settings[flag.replace("-", "_")] == value
        outs.append(str(out))
    return source, outs


#: The CI example scripts a scratch repository gets (``examples/ci/``).
SCRIPTS = ("build-corpus.sh", "audit-gate.sh")


def _git(cwd: Path, *args: str) -> None:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)


def gate_fixture(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A scratch app repository for the CI gate, and the environment to run it in.

    ``main`` holds the example scripts; the checked-out branch ``change`` puts a timestamp
    at the top of its prompts (its corpus builder writes the ``timestamp-top`` demo's
    candidate corpus there, the baseline on main). ``cachescale`` on ``PATH`` runs this
    checkout; ``OUT_DIR`` is a scratch folder.
    """
    repo = tmp_path / "app"
    (repo / "examples" / "ci").mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy2(REPO / "examples" / "ci" / name, repo / "examples" / "ci" / name)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "gate")
    _git(repo, "checkout", "-qb", "change")
    builder = repo / "examples" / "ci" / "build-corpus.sh"
    text = builder.read_text(encoding="utf-8").replace(
        'cp "$scratch/baseline.jsonl"',
        'side=baseline; [ -e CHANGED ] && side=candidate\ncp "$scratch/$side.jsonl"',
    )
    builder.write_text(text, encoding="utf-8")
    (repo / "CHANGED").write_text("", encoding="utf-8")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "change")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cachescale").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -m cachescale.commands.main "$@"\n', encoding="utf-8"
    )
    (bin_dir / "cachescale").chmod(0o755)
    env = os.environ | {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "operator"),
        "OUT_DIR": str(tmp_path / "out"),
    }
    return repo, env
