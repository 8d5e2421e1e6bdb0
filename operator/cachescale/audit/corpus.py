"""The audit corpus: JSONL requests as the engine would see them, read and checked.

One record per line: ``conversation_id`` (string or integer), ``turn`` (integer >= 0),
``prompt_token_ids`` (non-empty list of integers in ``[0, 2**31)``), and optionally
``tenant`` and ``cache_salt`` (strings). Records are in replay order: a conversation's
turns rise from line to line. Every problem names its line, because a corpus is usually
written by a script and the line is what its author can find. A record may give
``prompt`` text instead of token ids when a pinned tokenizer is given
(``audit/tokenizer.py``), or OpenAI-style ``messages`` (and ``tools``) when a chat
template is given too (``audit/chat.py``); without them it is refused, never guessed at.

The fingerprint is a sha256 over what the replay reads (ids, turns, salts, tokens), so two
results can say whether they came from the same corpus.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cachescale.audit.chat import ChatTemplateError

#: Largest token id accepted (token ids travel as int32, as in ``sim/hashing.py``).
MAX_TOKEN_ID = 2**31 - 1

Tokenize = Callable[[str], list[int]]
"""A prompt's text to its token ids (``audit.tokenizer.PinnedTokenizer.encode``)."""

EncodeChat = Callable[[list[Any], list[Any] | None], list[int]]
"""A record's ``messages`` and ``tools`` to token ids: rendered by the chat template, then
encoded by the pinned tokenizer."""


class CorpusError(ValueError):
    """A corpus that cannot be audited; the message names the file and, if any, the line."""


@dataclass(frozen=True, slots=True)
class Record:
    """One request of the corpus."""

    line: int
    conversation_id: str
    turn: int
    tokens: npt.NDArray[np.int32]
    tenant: str | None
    cache_salt: str | None


@dataclass(frozen=True, slots=True)
class Corpus:
    """Every record, in replay order, and the corpus fingerprint."""

    records: tuple[Record, ...]
    sha256: str

    @property
    def conversations(self) -> list[str]:
        """Conversation ids in order of first appearance."""
        return list(dict.fromkeys(record.conversation_id for record in self.records))


def _field_error(path: Path, line: int, message: str) -> CorpusError:
    return CorpusError(f"{path}: line {line}: {message}")


def _chat_ids(
    path: Path, line: int, data: dict[str, object], encode_chat: EncodeChat | None
) -> list[int]:
    """The ids of a record's ``messages`` and ``tools`` through the chat template."""
    if encode_chat is None:
        raise _field_error(
            path,
            line,
            "'messages' needs a chat template: give --chat-template-config "
            "tokenizer_config.json or --chat-template FILE, with --tokenizer tokenizer.json",
        )
    messages, tools = data["messages"], data.get("tools")
    if not isinstance(messages, list) or not messages:
        raise _field_error(path, line, "'messages' must be a non-empty list")
    if not all(isinstance(message, dict) for message in messages):
        raise _field_error(path, line, "'messages' must hold JSON objects")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)
    ):
        raise _field_error(path, line, "'tools' must be a list of JSON objects")
    try:
        return encode_chat(messages, tools)
    except ChatTemplateError as error:
        raise _field_error(path, line, str(error)) from None


def _prompt_ids(
    path: Path,
    line: int,
    data: dict[str, object],
    tokenize: Tokenize | None,
    encode_chat: EncodeChat | None,
) -> object:
    """The record's token ids: given, its ``prompt`` encoded by the pinned tokenizer, or
    its ``messages`` rendered by the chat template and encoded."""
    if "prompt_token_ids" in data:
        return data["prompt_token_ids"]
    if "messages" in data:
        return _chat_ids(path, line, data, encode_chat)
    if "prompt" not in data:
        raise _field_error(
            path, line, "missing 'prompt_token_ids' (or 'prompt' text, or 'messages')"
        )
    if tokenize is None:
        raise _field_error(
            path, line, "'prompt' is text: give --tokenizer tokenizer.json, or 'prompt_token_ids'"
        )
    prompt = data["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise _field_error(path, line, "'prompt' must be a non-empty string")
    return tokenize(prompt)


def _token_ids(ids: list[object]) -> npt.NDArray[np.int32] | None:
    """The ids as int32, or None unless every one is an integer (not a bool) in
    ``[0, MAX_TOKEN_ID]``: the types checked at C speed, the range in numpy."""
    if set(map(type, ids)) != {int}:
        return None
    try:
        wide = np.asarray(ids, dtype=np.int64)
    except OverflowError:
        return None
    if int(wide.min()) < 0 or int(wide.max()) > MAX_TOKEN_ID:
        return None
    return wide.astype(np.int32)


def _record(
    path: Path, line: int, text: str, tokenize: Tokenize | None, encode_chat: EncodeChat | None
) -> Record:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise _field_error(path, line, f"not JSON: {error.msg} (column {error.colno})") from None
    except RecursionError:
        raise _field_error(path, line, "not a record: nested too deeply") from None
    if not isinstance(data, dict):
        raise _field_error(path, line, "a record must be a JSON object")
    ids = _prompt_ids(path, line, data, tokenize, encode_chat)
    conversation = data.get("conversation_id")
    if isinstance(conversation, bool) or not isinstance(conversation, str | int):
        raise _field_error(path, line, "'conversation_id' must be a string or an integer")
    turn = data.get("turn")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise _field_error(path, line, "'turn' must be an integer >= 0")
    if not isinstance(ids, list) or not ids:
        raise _field_error(path, line, "'prompt_token_ids' must be a non-empty list")
    tokens = _token_ids(ids)
    if tokens is None:
        raise _field_error(
            path, line, f"'prompt_token_ids' must hold integers in [0, {MAX_TOKEN_ID}]"
        )
    optional: dict[str, str | None] = {}
    for name in ("tenant", "cache_salt"):
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise _field_error(path, line, f"'{name}' must be a string")
        optional[name] = value
    return Record(
        line=line,
        conversation_id=str(conversation),
        turn=turn,
        tokens=tokens,
        tenant=optional["tenant"],
        cache_salt=optional["cache_salt"],
    )


def parse_corpus(
    path: Path,
    text: str,
    tokenize: Tokenize | None = None,
    encode_chat: EncodeChat | None = None,
) -> Corpus:
    """Parse and check a corpus's text (``path`` only names it in messages; ``tokenize``
    encodes ``prompt`` text, ``encode_chat`` renders and encodes ``messages``)."""
    records: list[Record] = []
    last_turn: dict[str, tuple[int, int]] = {}
    digest = hashlib.sha256()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        record = _record(path, number, raw, tokenize, encode_chat)
        previous = last_turn.get(record.conversation_id)
        if previous is not None and record.turn <= previous[0]:
            raise _field_error(
                path,
                number,
                f"turn {record.turn} of conversation {record.conversation_id!r} comes after "
                f"its turn {previous[0]} (line {previous[1]}): records must be in replay "
                "order, each conversation's turns rising",
            )
        last_turn[record.conversation_id] = (record.turn, number)
        digest.update(
            json.dumps(
                [record.conversation_id, record.turn, record.cache_salt, record.tenant]
            ).encode()
        )
        digest.update(record.tokens.tobytes())
        records.append(record)
    if not records:
        raise CorpusError(f"{path}: the corpus is empty: no records to audit")
    return Corpus(records=tuple(records), sha256=digest.hexdigest())


def read_corpus(
    path: Path, tokenize: Tokenize | None = None, encode_chat: EncodeChat | None = None
) -> Corpus:
    """Read and check a corpus file."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CorpusError(f"{path}: cannot read: {error.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CorpusError(f"{path}: line {line}: not UTF-8") from None
    return parse_corpus(path, text, tokenize, encode_chat)
