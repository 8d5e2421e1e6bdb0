"""OpenAI-style ``messages`` (+ ``tools``) rendered by the model's own chat template.

An app under test usually sends chat requests: the engine renders them with the model's
Hugging Face chat template (Jinja) and tokenizes the text. The audit must see those same
token ids, so it renders them the same way: the Hugging Face ``chat_template`` convention
(``messages``, ``tools``, ``add_generation_prompt=True``, ``bos_token``/``eos_token`` from
the model's ``tokenizer_config.json``), in a sandboxed Jinja environment set up as
Hugging Face sets it up (blocks trimmed, ``loopcontrols``, a ``tojson`` that keeps key
order and does not escape HTML, ``raise_exception``, the ``{% generation %}`` tag). The
template comes from a local file (nothing is downloaded), and its sha256 goes into the
result's settings next to the tokenizer's, so ``compare`` refuses two results rendered by
different templates.

A template's clock (``strftime_now``) reads a fixed instant, :data:`FIXED_NOW`: a
baseline and a candidate rendered on different days must still see the same prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachescale.extras import install_hint

if TYPE_CHECKING:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

#: The instant a template's ``strftime_now`` formats.
FIXED_NOW = datetime(2025, 1, 1, tzinfo=UTC)

RenderChat = Callable[[list[Any], list[Any] | None], str]
"""A record's ``messages`` and ``tools`` to the prompt text the engine would tokenize."""


class ChatTemplateError(ValueError):
    """A chat template that cannot be read or rendered; the message says why, one line."""


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled template, its renderer and the sha256 of its source text."""

    render: RenderChat
    sha256: str


def _special_token(config: dict[str, Any], name: str) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken."""
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _from_config(path: Path) -> tuple[str | None, dict[str, str]]:
    """The template text (None when it has none) and the special tokens of a
    ``tokenizer_config.json``."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ChatTemplateError(f"{path}: cannot read: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ChatTemplateError(f"{path}: not a JSON tokenizer config ({error})") from None
    if not isinstance(config, dict):
        raise ChatTemplateError(f"{path}: not a JSON tokenizer config (not an object)")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one renders chats
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    tokens = {
        name: token
        for name in ("bos_token", "eos_token")
        if (token := _special_token(config, name)) is not None
    }
    return (template if isinstance(template, str) and template else None), tokens


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ChatTemplateError(f"{path}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ChatTemplateError(f"{path}: not UTF-8 text") from None


def _environment() -> ImmutableSandboxedEnvironment:
    """A sandboxed Jinja environment configured as Hugging Face's ``apply_chat_template``."""
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.parser import Parser
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}…{% endgeneration %}``: marks assistant text; renders as is."""

        tags = {"generation"}  # noqa: RUF012 (jinja reads a class attribute)

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = FIXED_NOW.strftime
    return environment


def load_chat_template(template_file: Path | None, config_file: Path | None) -> ChatTemplate:
    """The template of ``template_file`` (a Jinja file) or of ``config_file`` (a
    ``tokenizer_config.json``); the special tokens come from ``config_file`` when given."""
    try:
        from jinja2.exceptions import TemplateError, TemplateSyntaxError
    except ImportError:
        raise ChatTemplateError(
            f"'messages' needs the jinja2 package: {install_hint('audit')}"
        ) from None
    tokens: dict[str, str] = {}
    text: str | None = None
    if config_file is not None:
        text, tokens = _from_config(config_file)
    if template_file is not None:
        text = _read_template(template_file)
    if text is None:
        raise ChatTemplateError(
            f"{config_file}: no 'chat_template' string (give the template file with "
            "--chat-template)"
        )
    source = template_file or config_file
    try:
        template = _environment().from_string(text)
    except TemplateSyntaxError as error:
        raise ChatTemplateError(
            f"{source}: not a Jinja template: {error.message} (line {error.lineno})"
        ) from None

    def render(messages: list[Any], tools: list[Any] | None) -> str:
        try:
            rendered: str = template.render(
                messages=messages, tools=tools, add_generation_prompt=True, **tokens
            )
        except TemplateError as error:
            raise ChatTemplateError(f"the chat template failed: {error}") from None
        except (TypeError, ValueError, LookupError, AttributeError) as error:
            raise ChatTemplateError(f"the chat template failed: {error!r}") from None
        return rendered

    return ChatTemplate(render=render, sha256=hashlib.sha256(text.encode()).hexdigest())
