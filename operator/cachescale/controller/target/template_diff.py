"""How a pod template's change is said without quoting it: images named, flags named
with a short keyed hash of each value, other arguments numbered, env only said to have
changed. Any argument, command or env value may be a credential (``--db-url=…``), and
what this module returns goes into a policy's status, its Events and the logs, so no value
ever leaves it as itself (``docs/security.md``, section 5)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

MAX_DIFF_CHARS = 240
"""A pod-template difference longer than this is cut (a long args list)."""
HASH_CHARS = 8
"""Hex digits of a value's keyed hash: enough to tell values apart, nothing to read back."""
_HASH_KEY = secrets.token_bytes(32)
"""Per operator process: the hash of a low-entropy value (a password) cannot be looked up
in a precomputed table; within a process the same value hashes the same."""
_FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
"""What is named as a flag; any other argument is named only by its position."""


def _containers(rs: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    spec = ((rs.get("spec") or {}).get("template") or {}).get("spec") or {}
    return {str(c.get("name")): c for c in spec.get("containers") or []}


def template_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """``image rag-api:1.8.2 → 1.8.3; args: --chunk changed (value 1f2e3d4c → 5a6b7c8d)``,
    naming the container when the pod has several; ``pod template changed`` when nothing
    of that differs. Invariant: no argument, command or env value is quoted (any may be a
    credential): flags are named, other arguments numbered, values only hashed
    (``argument_changes``), env only said to have changed."""
    before, after = _containers(old), _containers(new)
    several = len(after) > 1
    parts = []
    for name, container in after.items():
        prior = before.get(name)
        where = f" of container {name}" if several else ""
        if prior is None:
            parts.append(f"container {name} added")
            continue
        image, prior_image = str(container.get("image", "")), str(prior.get("image", ""))
        if image != prior_image:
            parts.append(f"image{where} {_image_change(prior_image, image)}")
        for key in ("command", "args"):
            old_list, new_list = list(prior.get(key) or []), list(container.get(key) or [])
            if old_list != new_list:
                said = argument_changes(old_list, new_list)
                parts.append(f"{key}{where}: {', '.join(said)}")
        if list(prior.get("env") or []) != list(container.get("env") or []):
            parts.append(f"env{where} changed")
    text = "; ".join(parts) or "pod template changed"
    return text if len(text) <= MAX_DIFF_CHARS else text[: MAX_DIFF_CHARS - 1] + "…"


def value_hash(value: str) -> str:
    """A short keyed hash of ``value``: the same value gives the same digits within the
    operator process, and the digits tell nothing about the value."""
    return hmac.new(_HASH_KEY, value.encode(), hashlib.sha256).hexdigest()[:HASH_CHARS]


def _arguments(tokens: Sequence[Any]) -> dict[str, list[str]]:
    """Each flag's values (``--a=1``, or ``--a 1``: a flag's next argument when it is no
    flag), each other argument under ``argument N`` (its 1-based position); a flag with
    no value has the value ""."""
    items: dict[str, list[str]] = {}
    texts = [str(t) for t in tokens]
    position = 0
    while position < len(texts):
        text = texts[position]
        name, sep, value = text.partition("=")
        if _FLAG.fullmatch(name):
            if not sep and position + 1 < len(texts) and not texts[position + 1].startswith("-"):
                position += 1
                value = texts[position]
            items.setdefault(name, []).append(value)
        else:
            items.setdefault(f"argument {position + 1}", []).append(text)
        position += 1
    return items


def argument_changes(old: Sequence[Any], new: Sequence[Any]) -> list[str]:
    """``--db-url changed (value 1f2e3d4c → 5a6b7c8d)``, ``--verbose added``,
    ``argument 3 changed (…)``: what differs between two argument lists, every value as
    its hash (``value_hash``), never as itself; ``reordered`` when only the order moved."""
    before, after = _arguments(old), _arguments(new)
    said = []
    for name, values in after.items():
        if name not in before:
            said.append(f"{name} added")
        elif before[name] != values:
            prior, now = value_hash("\x00".join(before[name])), value_hash("\x00".join(values))
            said.append(f"{name} changed (value {prior} → {now})")
    said.extend(f"{name} removed" for name in before if name not in after)
    return said or ["reordered"]


def _image_change(old: str, new: str) -> str:
    """``rag-api:1.8.2 → 1.8.3`` when only the tag moved, else both in full."""
    old_repo, _, _ = old.rpartition(":")
    new_repo, _, new_tag = new.rpartition(":")
    if old_repo and old_repo == new_repo and "/" not in new_tag:
        return f"{old} → {new_tag}"
    return f"{old} → {new}"
