"""Checks on command-line values that every subcommand shares, in one wording.

argparse turns an ``ArgumentTypeError`` into exit 2 with the flag's name
(``exit_codes.py``), so a value is refused before any work starts; and an ``--out``
folder is checked before a long run, not after it. Each kind of mistake is worded once
here, whichever subcommand meets it.
"""

from __future__ import annotations

import argparse
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from cachescale.api.durations import parse_duration_seconds


def positive_number(text: str) -> float:
    """A finite number above 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def at_least_one(text: str) -> int:
    """A whole number, 1 or more (a count, a size in bytes, a block size)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1")
    return value


def non_negative_number(text: str) -> float:
    """A finite number, 0 or more."""
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def duration_seconds(text: str) -> float:
    """A duration such as ``30s``, ``5m`` or ``1h30m``, in seconds."""
    try:
        return parse_duration_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def output_folder(out: str) -> str | None:
    """Make ``--out``'s folder now, before the work; why not, when it cannot be used."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        return f"--out {out}: exists and is not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"--out {out}: cannot create the folder: {error.strerror}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--out {out}: the folder is not writable"
    return None


def evaluation_time(text: str) -> datetime:
    """A moment (``--at``, ``--around``): ISO 8601 (UTC when no zone is given) or Unix seconds."""
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ISO 8601 nor Unix seconds"
        ) from error
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def check_url(url: str) -> None:
    """``ValueError`` in a user's words when ``--prometheus`` is not an http(s) URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError as error:
        raise ValueError(f"--prometheus {url!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--prometheus {url!r} is not an http:// or https:// URL; write the scheme and "
            "host, e.g. http://prometheus.monitoring:9090"
        )


def prometheus_url(text: str) -> str:
    """An argparse type for a ``--prometheus`` flag: an http(s) URL, or exit 2 saying so."""
    try:
        check_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--prometheus ")) from None
    return text
