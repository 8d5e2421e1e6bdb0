"""Shared test setup: lets tests import helpers that sit beside them (tests/api/...)."""

from __future__ import annotations

import sys
from pathlib import Path

for helper_dir in (Path(__file__).parent / "api",):
    sys.path.insert(0, str(helper_dir))
