"""Text prompts through a pinned tokenizer: the same audit as their token ids, the
tokenizer's fingerprint in the result, and no comparison across tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from cachescale.audit.tokenizer import TokenizerError, load_tokenizer
from cachescale.exit_codes import ExitCode
from tests.audit.helpers import cli

REPO = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(64)]
SYSTEM = " ".join(WORDS[:40])
"""A shared system prompt of 40 tokens: two full blocks of 16 every conversation reuses."""


def write_tokenizer(path: Path, vocabulary: list[str]) -> Path:
    """A word-level tokenizer.json: one id per word, split on whitespace."""
    vocab = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(vocabulary)}}
    tokenizer = Tokenizer(WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(path))
    return path


def records(prompt_of: dict[str, list[str]]) -> list[dict[str, object]]:
    return [
        {"conversation_id": conversation, "turn": turn, "prompt": prompt}
        for conversation, prompts in prompt_of.items()
        for turn, prompt in enumerate(prompts)
    ]


CONVERSATIONS = {
    c: [f"{SYSTEM} {c}", f"{SYSTEM} {c} w50 w51", f"{SYSTEM} {c} w50 w51 w52 w53"]
    for c in ("w60", "w61", "w62", "w63")
}


def audit(tmp_path: Path, corpus: list[dict[str, object]], *flags: str) -> dict[str, object]:
    source = tmp_path / f"corpus-{len(list(tmp_path.iterdir()))}.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in corpus) + "\n", encoding="utf-8")
    out = source.with_suffix(".json")
    done = cli("run", str(source), "--out", str(out), *flags)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return result


def _without_text(causes: object) -> object:
    """The causes without the words and decoded text of each example."""
    assert isinstance(causes, dict)
    text = ("where", "text", "reference_text")
    return {
        name: [
            {
                **e,
                "examples": [{k: v for k, v in x.items() if k not in text} for x in e["examples"]],
            }
            for e in entries
        ]
        for name, entries in causes.items()
    }


def test_text_prompts_audit_exactly_as_their_token_ids(tmp_path: Path) -> None:
    path = write_tokenizer(tmp_path / "tokenizer.json", WORDS)
    pinned = load_tokenizer(path)
    text = records(CONVERSATIONS)
    ids = [
        {"conversation_id": r["conversation_id"], "turn": r["turn"],
         "prompt_token_ids": pinned.encode(str(r["prompt"]))}
        for r in text
    ]  # fmt: skip
    from_text = audit(tmp_path, text, "--tokenizer", str(path))
    from_ids = audit(tmp_path, ids)
    assert from_text["passes"] == from_ids["passes"]
    assert _without_text(from_text["causes"]) == _without_text(from_ids["causes"])
    # With the tokenizer the changed span is quoted as text too.
    example = from_text["causes"]["audit"][0]["examples"][0]  # type: ignore[index]
    assert (example["text"], example["reference_text"]) == ("w62", "w60")
    assert "[63] 'w62' where the cache has [61] 'w60'" in example["where"]
    assert from_ids["causes"]["audit"][0]["examples"][0]["text"] is None  # type: ignore[index]
    assert from_text["settings"]["tokenizer"] == pinned.sha256  # type: ignore[index]
    assert from_ids["settings"]["tokenizer"] is None  # type: ignore[index]
    # The shared system prompt hits: a cache that saw nothing would make this 0.
    assert from_text["passes"]["audit"]["token_hit_rate"] > 0.5  # type: ignore[index]


def test_results_from_two_tokenizers_are_not_compared(tmp_path: Path) -> None:
    first = write_tokenizer(tmp_path / "a.json", WORDS)
    second = write_tokenizer(tmp_path / "b.json", list(reversed(WORDS)))
    text = records(CONVERSATIONS)
    audit(tmp_path, text, "--tokenizer", str(first))
    audit(tmp_path, text, "--tokenizer", str(second))
    results = sorted(tmp_path.glob("corpus-*.json"))
    done = cli("compare", str(results[0]), str(results[1]))
    assert done.returncode == ExitCode.USAGE, done.stdout
    assert done.stderr.count("\n") == 1
    assert "tokenizer differs" in done.stderr


def test_a_missing_or_broken_tokenizer_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="cannot read"):
        load_tokenizer(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{}", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"not a tokenizer\.json"):
        load_tokenizer(broken)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(records(CONVERSATIONS)[0]) + "\n", encoding="utf-8")
    done = cli("run", str(corpus), "--out", str(tmp_path / "r.json"), "--tokenizer", str(broken))
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.count("\n") == 1
    assert "--tokenizer" in done.stderr
    assert "Traceback" not in done.stderr
