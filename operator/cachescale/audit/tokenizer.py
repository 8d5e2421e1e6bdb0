"""A pinned tokenizer for text prompts: a local ``tokenizer.json`` and its fingerprint.

The audit must see the token ids the engine would see, and a baseline and a candidate are
comparable only when both were tokenized the same way. So the tokenizer is a file given on
the command line (Hugging Face ``tokenizers``' ``tokenizer.json``; nothing is downloaded),
its sha256 goes into the result's settings, and ``compare`` refuses two results whose
fingerprints differ. Prompts are encoded with the special tokens the tokenizer adds (a BOS
token, for most models), as vLLM's completions endpoint does with a text prompt; a chat
template's output is encoded without them (the template writes its own BOS), as vLLM's
chat endpoint does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cachescale.audit.corpus import Tokenize
from cachescale.extras import install_hint


class TokenizerError(ValueError):
    """A tokenizer that cannot be used; the message names the file and says why."""


@dataclass(frozen=True, slots=True)
class PinnedTokenizer:
    """The encoders and the sha256 of the file they came from."""

    encode: Tokenize
    """A text prompt's ids, with the special tokens the tokenizer adds."""
    encode_rendered: Tokenize
    """A rendered chat's ids, as they stand (the template wrote the special tokens)."""
    sha256: str
    decode: Callable[[list[int]], str]
    """Ids to their text, special tokens kept (to quote where prompts part)."""


def load_tokenizer(path: Path) -> PinnedTokenizer:
    """The tokenizer in ``path`` (a ``tokenizer.json``), with its file's sha256."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError(
            f"text prompts need the tokenizers package: {install_hint('audit')}"
        ) from None
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TokenizerError(f"{path}: cannot read: {error.strerror}") from None
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except (UnicodeDecodeError, Exception) as error:  # tokenizers raises plain Exception
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TokenizerError(f"{path}: not a tokenizer.json: {first}") from None

    def encode(prompt: str) -> list[int]:
        return list(tokenizer.encode(prompt, add_special_tokens=True).ids)

    def encode_rendered(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    return PinnedTokenizer(
        encode=encode,
        encode_rendered=encode_rendered,
        sha256=hashlib.sha256(data).hexdigest(),
        decode=decode,
    )
