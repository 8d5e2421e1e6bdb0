"""A test's script run by a fresh interpreter: where a test must fork (a pytest worker runs
other threads, and forking beside them is unsafe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def in_fresh_interpreter(code: str) -> Any:
    """What ``code`` prints as its last line (JSON), run by a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
