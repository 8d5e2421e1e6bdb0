"""The syntax of a Kubernetes label selector, checked before anything is sent.

Two label selectors reach the API server: a policy's ``cache.promptSources[].labelSelector``
(the spec refuses one that does not parse) and ``cachescale run --policy-selector``, which
filters the watch of CacheScalingPolicies (``controller/runtime/serve.py``). A typo would
otherwise surface only once the selector is used, as a 400 (for the watch, retried in
kopf's logs, with the shard serving nothing). So a selector is parsed here with the grammar
the API server uses
(``k8s.io/apimachinery/pkg/labels``): comma-separated requirements, each one of

- ``key`` / ``!key`` (the label is present / absent);
- ``key=value``, ``key==value``, ``key!=value`` (a value may be empty);
- ``key in (a,b)``, ``key notin (a,b)`` (``()`` is the empty value, as there);
- ``key>N``, ``key<N`` (N an integer);

where a key is a qualified name (an optional DNS-subdomain prefix and ``/``, then a name
of at most 63 characters) and a value a label value. A malformed selector is refused
naming the offending part: a validation error in a policy, a usage error (exit 2) on the
command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_SPECIAL: Final = frozenset("!=<>(),")
_TWO_CHAR: Final = ("!=", "==")
_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER: Final = re.compile(r"[-+]?[0-9]+")
_SET_OPERATORS: Final = ("in", "notin")
_VALUE_OPERATORS: Final = ("=", "==", "!=")
_NUMBER_OPERATORS: Final = (">", "<")


@dataclass(frozen=True)
class Requirement:
    """One requirement of a selector: ``key``, an operator and its values."""

    key: str
    operator: str
    """``exists``, ``!``, one of ``= == != > <``, or ``in`` / ``notin``."""
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator in _SET_OPERATORS:
            return f"{self.key} {self.operator} ({','.join(self.values)})"
        return f"{self.key}{self.operator}{self.values[0]}"


def _tokens(text: str) -> list[str]:
    """Split as the API server's lexer does: the special symbols, and runs of anything
    else up to whitespace or a special symbol."""
    tokens: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif text[i : i + 2] in _TWO_CHAR:
            tokens.append(text[i : i + 2])
            i += 2
        elif char in _SPECIAL:
            tokens.append(char)
            i += 1
        else:
            start = i
            while i < len(text) and not text[i].isspace() and text[i] not in _SPECIAL:
                i += 1
            tokens.append(text[start:i])
    return tokens


def _is_word(token: str | None) -> bool:
    return token is not None and token[0] not in _SPECIAL


def _check_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(
            f"label key {key!r}: the prefix before '/' must be a DNS subdomain "
            "(lowercase letters, digits, '-' and '.', at most 253)"
        )
    if not (len(name) <= 63 and _NAME.fullmatch(name)):
        raise ValueError(
            f"label key {key!r}: the name must be at most 63 letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit"
        )
    return key


def _check_value(key: str, value: str) -> str:
    if value and not (len(value) <= 63 and _NAME.fullmatch(value)):
        raise ValueError(
            f"label value {value!r} (of {key}): at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return value


class _Parser:
    """A recursive-descent parser over the tokens of one selector."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.at += 1
        return token

    def selector(self) -> tuple[Requirement, ...]:
        requirements = [self.requirement()]
        while self.peek() is not None:
            if self.take() != ",":
                raise ValueError(
                    f"expected ',' between requirements, found {self.tokens[self.at - 1]!r}"
                )
            requirements.append(self.requirement())
        return tuple(requirements)

    def requirement(self) -> Requirement:
        token = self.take()
        if token == "!":
            key = self.take()
            if not _is_word(key):
                raise ValueError("'!' must be followed by a label key")
            assert key is not None
            return Requirement(_check_key(key), "!")
        if not _is_word(token) or token in _SET_OPERATORS:
            found = "the end" if token is None else repr(token)
            raise ValueError(f"expected a label key, found {found}")
        assert token is not None
        key = _check_key(token)
        operator = self.peek()
        if operator in (None, ","):
            return Requirement(key, "exists")
        self.take()
        assert operator is not None
        if operator in _SET_OPERATORS:
            return Requirement(key, operator, self.value_set(key, operator))
        if operator in _VALUE_OPERATORS:
            value = self.take() if _is_word(self.peek()) else ""
            assert value is not None
            return Requirement(key, operator, (_check_value(key, value),))
        if operator in _NUMBER_OPERATORS:
            number = self.take()
            if number is None or not _INTEGER.fullmatch(number):
                raise ValueError(f"{key}{operator}: '{operator}' needs an integer value")
            return Requirement(key, operator, (number,))
        raise ValueError(
            f"after label key {key!r}: expected one of = == != in notin > < "
            f"(or ',' or the end), found {operator!r}"
        )

    def value_set(self, key: str, operator: str) -> tuple[str, ...]:
        if self.take() != "(":
            raise ValueError(f"{key} {operator}: the values must be in parentheses: (a,b)")
        values: list[str] = []
        while True:
            value = self.take() if _is_word(self.peek()) else ""
            assert value is not None
            values.append(_check_value(key, value))
            closing = self.take()
            if closing == ")":
                break
            if closing != ",":
                raise ValueError(f"{key} {operator} (...): expected ',' or ')'")
        return tuple(values)


@dataclass(frozen=True)
class LabelSelector:
    """A parsed selector, as the API server will filter by it."""

    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """ValueError saying what is wrong when the API server would not accept ``text``
        (an empty selector included: it would select everything)."""
        if not text.strip():
            raise ValueError("empty: give at least one requirement, e.g. team=search")
        return cls(_Parser(text).selector())

    def __str__(self) -> str:
        """The selector as sent to the API server (one spelling, whatever the spacing)."""
        return ",".join(str(requirement) for requirement in self.requirements)
