"""Reading and rewriting the engine's batch-ceiling flag in a container spec.

vLLM takes ``--max-num-seqs``, SGLang ``--max-running-requests``; both accept
``--flag N`` and ``--flag=N``, and users put them in ``args`` or in ``command`` (a
``command: [vllm, serve, ...]`` with no args is common). The rewrite touches only the
flag's value and keeps every other token, its position and the form the user chose.
Pure functions: the Deployment patch is built from their result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cachescale.api.spec import Engine

FLAGS = {Engine.VLLM: "--max-num-seqs", Engine.SGLANG: "--max-running-requests"}
"""The batch-ceiling flag of each engine."""


@dataclass(frozen=True, slots=True)
class FlagLocation:
    """Where the flag's value sits: ``field`` (args or command) and token index."""

    field: str
    index: int
    value: int
    inline: bool
    """``--flag=N`` (True) or ``--flag N`` (False)."""


class FlagError(ValueError):
    """The flag is present but unusable (no value, not an integer, given twice)."""


def find_flag(
    engine: Engine, command: Sequence[str] | None, args: Sequence[str] | None
) -> FlagLocation | None:
    """The flag's location in ``args`` (searched first) or ``command``; None when absent."""
    flag = FLAGS[engine]
    found = [
        location
        for field, tokens in (("args", args or ()), ("command", command or ()))
        for location in _locations(flag, field, tokens)
    ]
    if len(found) > 1:
        raise FlagError(f"{flag} is given {len(found)} times; set it once")
    return found[0] if found else None


def _locations(flag: str, field: str, tokens: Sequence[str]) -> list[FlagLocation]:
    out = []
    for index, token in enumerate(tokens):
        if token == flag:
            if index + 1 >= len(tokens):
                raise FlagError(f"{flag} has no value in {field}")
            out.append(FlagLocation(field, index + 1, _integer(flag, tokens[index + 1]), False))
        elif token.startswith(flag + "="):
            out.append(FlagLocation(field, index, _integer(flag, token.partition("=")[2]), True))
    return out


def _integer(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise FlagError(f"{flag} value {text!r} is not an integer") from None
    if value < 1:
        raise FlagError(f"{flag} value {value} must be at least 1")
    return value


def rewritten(
    tokens: Sequence[str], location: FlagLocation, engine: Engine, value: int
) -> list[str]:
    """``tokens`` with the flag at ``location`` set to ``value``, in the same form."""
    out = list(tokens)
    out[location.index] = f"{FLAGS[engine]}={value}" if location.inline else str(value)
    return out
