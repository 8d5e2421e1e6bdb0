"""Checks on command-line values that every subcommand shares, in one wording.

argparse turns an ``ArgumentTypeError`` into exit 2 with the flag's name
(``exit_codes.py``), so a value is refused before any work starts; and an ``--out``
folder is checked before a long run, not after it. Each kind of mistake is worded once
here, whichever subcommand meets it. It lives in the API layer because every layer's
command may import it.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from cachescale.api.durations import parse_duration_seconds


def positive_number(text: str) -> float:
    """A finite number above 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
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
