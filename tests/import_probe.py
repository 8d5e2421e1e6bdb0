"""Which heavy modules a set of CLI calls imports, in a fresh interpreter.

The core install (no extras) must run simulate, validate, emulate and audit: a test names
the calls and the modules they must not pull in, and this runs them in a subprocess with
only the source root on the path, so nothing imported by pytest itself can hide one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPERATOR_EXTRA = ("kopf", "kubernetes", "aiohttp", "requests", "urllib3")
"""What only ``cachescale run`` and ``init`` need (the ``operator`` extra)."""


def heavy_modules_imported(calls: list[list[str]], watched: tuple[str, ...]) -> list[str]:
    """The ``watched`` modules in ``sys.modules`` after ``cachescale.commands.main.main(call)`` for
    every call, in order (each call must succeed)."""
    probe = "import json, sys; from cachescale.commands.main import main; " + "".join(
        f"main({call!r}); " for call in calls
    )
    probe += f"print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    found: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return found
