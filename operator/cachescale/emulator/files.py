"""Atomic file replacement for the files other processes watch (file_sd, ground truth).

Prometheus re-reads a file_sd file when it changes, and tests poll the ground-truth file:
neither may ever see a half-written file, so both are written beside their destination
and renamed over it (``os.replace`` is atomic on one filesystem). The file is made
world-readable, as a plain write would be, so a Prometheus running as another user (the
Debian service does) can read it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

READABLE = 0o644


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (readers see the old or the new file)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, READABLE)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
