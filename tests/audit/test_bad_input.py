"""Bad input: one line naming the line or the file, exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cachescale.audit.corpus import CorpusError, parse_corpus
from cachescale.audit.replay import replay
from cachescale.exit_codes import ExitCode
from tests.audit.helpers import cli

GOOD = '{"conversation_id": "c", "turn": 0, "prompt_token_ids": [1, 2, 3]}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON object"),
        ('{"conversation_id": "c", "turn": 1, "prompt": "hi"}', "give --tokenizer"),
        ('{"conversation_id": "c", "turn": 1, "messages": []}', "needs a chat template"),
        ('{"conversation_id": "c", "turn": 1}', "missing 'prompt_token_ids' (or 'prompt'"),
        ('{"conversation_id": "c", "turn": -1, "prompt_token_ids": [1]}', "'turn'"),
        ('{"conversation_id": "c", "turn": true, "prompt_token_ids": [1]}', "'turn'"),
        ('{"conversation_id": null, "turn": 1, "prompt_token_ids": [1]}', "'conversation_id'"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": []}', "non-empty"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [1.5]}', "integers"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [-1]}', "integers"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [2147483648]}', "integers"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [1, true]}', "integers"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [1, "2"]}', "integers"),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [1, 1e400]}', "integers"),
        (
            '{"conversation_id": "c", "turn": 1, "prompt_token_ids": [1, 99999999999999999999]}',
            "integers",
        ),
        ('{"conversation_id": "c", "turn": 1, "prompt_token_ids": [1], "tenant": 3}', "tenant"),
        ('{"conversation_id": "c", "turn": 0, "prompt_token_ids": [1]}', "replay order"),
    ],
)
def test_a_bad_record_names_its_line(line: str, message: str) -> None:
    with pytest.raises(CorpusError) as caught:
        parse_corpus(Path("corpus.jsonl"), f"{GOOD}\n\n{line}\n")
    assert str(caught.value).startswith("corpus.jsonl: line 3: ")
    assert message in str(caught.value)


def test_an_empty_corpus_is_an_error() -> None:
    with pytest.raises(CorpusError, match="empty"):
        parse_corpus(Path("corpus.jsonl"), "\n  \n")


def test_one_conversation_cannot_be_split_into_two_passes() -> None:
    with pytest.raises(CorpusError, match="at least 2"):
        replay(parse_corpus(Path("c.jsonl"), GOOD))


def _one_line_usage_error(done: subprocess.CompletedProcess[str], named: str) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert named in done.stderr


def test_cli_malformed_line_and_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text(f"{GOOD}\n{GOOD[:-1]}\n", encoding="utf-8")
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    done = cli("run", "bad.jsonl", "--out", "r.json", cwd=tmp_path)
    _one_line_usage_error(done, "bad.jsonl: line 2: not JSON")
    _one_line_usage_error(cli("run", "empty.jsonl", "--out", "r.json", cwd=tmp_path), "empty")
    _one_line_usage_error(cli("run", "none.jsonl", "--out", "r.json", cwd=tmp_path), "none")
    _one_line_usage_error(cli("run", "bad.jsonl", cwd=tmp_path), "--out")


def test_cli_refuses_results_that_are_not_comparable(tmp_path: Path) -> None:
    lines = [
        json.dumps({"conversation_id": c, "turn": 0, "prompt_token_ids": list(range(40))})
        for c in ("a", "b")
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(lines), encoding="utf-8")
    assert cli("run", "c.jsonl", "--out", "16.json", cwd=tmp_path).returncode == 0
    done = cli("run", "c.jsonl", "--out", "32.json", "--block-size", "32", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    _one_line_usage_error(cli("compare", "16.json", "32.json", cwd=tmp_path), "block_size")
    (tmp_path / "junk.json").write_text('{"format": "x"}', encoding="utf-8")
    _one_line_usage_error(cli("compare", "16.json", "junk.json", cwd=tmp_path), "junk.json")
    _one_line_usage_error(cli("compare", "16.json", "gone.json", cwd=tmp_path), "gone.json")
    same = cli("compare", "16.json", "16.json", cwd=tmp_path)
    assert same.returncode == ExitCode.OK, same.stderr
    assert same.stdout.startswith("PASS")


def test_cli_regression_exits_1(tmp_path: Path) -> None:
    done = cli("demo", "--case", "timestamp-top", "--out", "d", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("baseline", "candidate"):
        ran = cli("run", f"d/{name}.jsonl", "--out", f"{name}.json", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        assert "token hit rate" in ran.stdout
    done = cli("compare", "baseline.json", "candidate.json", "--format", "markdown", cwd=tmp_path)
    assert done.returncode == ExitCode.REGRESSION, done.stderr
    assert "a span that differs on every request" in done.stdout
    assert "Traceback" not in done.stderr
