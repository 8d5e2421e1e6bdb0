"""OpenAI-style messages through a chat template: Hugging Face's rendering convention, the
template's fingerprint in the result, and a tools-order shuffle named as such."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from cachescale.audit.chat import ChatTemplateError, load_chat_template
from cachescale.exit_codes import ExitCode
from tests.audit.helpers import cli

FIXTURE = Path(__file__).parent / "fixtures" / "chat_template.jinja"
SYSTEM = " ".join(f"s{i}" for i in range(40))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": " ".join(f"{name}{i}" for i in range(12)),
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
    for name in ("search", "fetch", "summarise")
]


def config(path: Path, template: str) -> Path:
    """A tokenizer_config.json as Hugging Face writes it (special tokens as AddedTokens)."""
    path.write_text(
        json.dumps(
            {
                "bos_token": {"content": "<s>", "lstrip": False, "special": True},
                "eos_token": "</s>",
                "chat_template": template,
            }
        ),
        encoding="utf-8",
    )
    return path


def test_the_hugging_face_convention_renders_as_an_engine_would(tmp_path: Path) -> None:
    template_text = FIXTURE.read_text(encoding="utf-8")
    template = load_chat_template(None, config(tmp_path / "tokenizer_config.json", template_text))
    messages = [
        {"role": "system", "content": "be <brief>"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and?"},
    ]
    tools = [{"name": "zeta", "arguments": {"b": 1, "a": "é"}}]
    assert template.render(messages, tools) == (
        "<s><system> be <brief> </system>\n"  # bos_token from the config; no HTML escaping
        "<tools>\n"
        '{"name": "zeta", "arguments": {"b": 1, "a": "é"}}\n'  # key order kept, not ASCII
        "</tools>\n"
        "<user> hi </user>\n"
        "<assistant> hello </assistant>\n"  # the {% generation %} tag renders its body
        "<user> and? </user>\n"
        "<assistant>"  # add_generation_prompt=True
    )
    # The fingerprint is the template text's: the same from the file and from the config.
    from_file = load_chat_template(FIXTURE, None)
    assert from_file.sha256 == template.sha256 == hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    assert from_file.render([{"role": "user", "content": "x"}], None) == (
        "<user> x </user>\n<assistant>"  # no config: no bos_token
    )
    with pytest.raises(ChatTemplateError, match="roles must be user or assistant"):
        template.render([{"role": "tool", "content": "x"}], None)


def test_broken_templates_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="cannot read"):
        load_chat_template(tmp_path / "absent.jinja", None)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for x in %}", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match=r"not a Jinja template: .* \(line 1\)"):
        load_chat_template(broken, None)
    no_template = tmp_path / "tokenizer_config.json"
    no_template.write_text('{"bos_token": "<s>"}', encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="no 'chat_template'"):
        load_chat_template(None, no_template)
    # A config without a template still gives the special tokens to a template file.
    with_tokens = load_chat_template(FIXTURE, no_template)
    assert with_tokens.render([{"role": "user", "content": "x"}], None).startswith("<s><user>")
    # The sandbox refuses to reach into Python objects.
    unsafe = tmp_path / "unsafe.jinja"
    unsafe.write_text("{{ messages.__class__.__mro__ }}", encoding="utf-8")
    with pytest.raises(ChatTemplateError):
        load_chat_template(unsafe, None).render([{"role": "user", "content": "x"}], None)


def chats(shuffle: bool) -> list[dict[str, object]]:
    """8 conversations of 3 turns; with ``shuffle`` the tools come in a new order on every
    request (the order rotates with the request's number)."""
    records: list[dict[str, object]] = []
    for c in range(8):
        history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(3):
            words = " ".join(f"c{c}t{turn}w{k}" for k in range(20))
            history.append({"role": "user", "content": words})
            shift = len(records) % len(TOOLS) if shuffle else 0
            records.append(
                {
                    "conversation_id": f"c{c}",
                    "turn": turn,
                    "messages": list(history),
                    "tools": TOOLS[shift:] + TOOLS[:shift],
                }
            )
            history.append({"role": "assistant", "content": words.replace("w", "a")})
    return records


def tokenizer_for(path: Path, texts: list[str]) -> Path:
    """A word-level tokenizer.json whose vocabulary holds every piece of ``texts``."""
    split = Whitespace()
    pieces = {piece for text in texts for piece, _ in split.pre_tokenize_str(text)}
    vocab = {"[UNK]": 0, **{piece: i + 1 for i, piece in enumerate(sorted(pieces))}}
    tokenizer = Tokenizer(WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = split
    tokenizer.save(str(path))
    return path


def run(tmp_path: Path, name: str, records: list[dict[str, object]], *flags: str) -> Path:
    corpus = tmp_path / f"{name}.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    out = tmp_path / f"{name}.json"
    done = cli("run", str(corpus), "--out", str(out), *flags)
    assert done.returncode == ExitCode.OK, done.stderr
    return out


def test_a_tools_order_shuffle_through_messages_is_unstable_ordering(tmp_path: Path) -> None:
    template = load_chat_template(FIXTURE, None)
    texts = [
        template.render(r["messages"], r["tools"])  # type: ignore[arg-type]
        for r in chats(False) + chats(True)
    ]
    tokenizer = str(tokenizer_for(tmp_path / "tok.json", texts))
    flags = ("--tokenizer", tokenizer, "--chat-template", str(FIXTURE))
    baseline = run(tmp_path, "baseline", chats(False), *flags)
    candidate = run(tmp_path, "candidate", chats(True), *flags)
    result = json.loads(candidate.read_text(encoding="utf-8"))
    assert result["settings"]["chat_template"] == template.sha256
    assert json.loads(baseline.read_text(encoding="utf-8"))["causes"]["audit"] == []
    assert result["causes"]["audit"][0]["cause"] == "unstable-ordering"
    done = cli("compare", str(baseline), str(candidate), "--format", "json")
    assert done.returncode == ExitCode.REGRESSION, done.stdout
    assert json.loads(done.stdout)["cause"] == "unstable-ordering"


def test_templates_must_match_and_be_given(tmp_path: Path) -> None:
    records = chats(False)
    template = load_chat_template(FIXTURE, None)
    texts = [template.render(r["messages"], r["tools"]) for r in records]  # type: ignore[arg-type]
    tokenizer = str(tokenizer_for(tmp_path / "tok.json", texts))
    other = tmp_path / "other.jinja"
    other.write_text(FIXTURE.read_text(encoding="utf-8").replace("<tools>", "<tools> "), "utf-8")
    first = run(tmp_path, "a", records, "--tokenizer", tokenizer, "--chat-template", str(FIXTURE))
    second = run(tmp_path, "b", records, "--tokenizer", tokenizer, "--chat-template", str(other))
    done = cli("compare", str(first), str(second))
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.count("\n") == 1
    assert "chat_template differs" in done.stderr

    corpus = tmp_path / "a.jsonl"
    out = str(tmp_path / "r.json")
    for flags, says in [
        (("--tokenizer", tokenizer), "needs a chat template"),
        (("--chat-template", str(FIXTURE)), "needs --tokenizer"),
        (("--tokenizer", tokenizer, "--chat-template", str(tmp_path / "no.jinja")), "cannot read"),
    ]:
        done = cli("run", str(corpus), "--out", out, *flags)
        assert done.returncode == ExitCode.USAGE, flags
        assert done.stderr.count("\n") == 1, done.stderr
        assert says in done.stderr
        assert "Traceback" not in done.stderr
