"""Shared test setup: lets tests import helpers that sit beside them (tests/api/...,
tests/gather/... for the fake Prometheus the controller tests also use)."""

from __future__ import annotations

import sys
from pathlib import Path

for helper_dir in (
    Path(__file__).parent / "api",
    Path(__file__).parent / "gather",
    Path(__file__).parent / "decide",
):
    sys.path.insert(0, str(helper_dir))
