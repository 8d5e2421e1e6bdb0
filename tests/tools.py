"""The one rule for a test whose outside tool (prometheus, promtool, helm, openssl) is
missing: skip it locally, with the command that installs the tool, and fail it under CI
(``CI`` set to anything but empty, ``0`` or ``false``), where every tool must be there."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    """Whether the CI environment variable is set (then a missing tool fails, not skips)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def require_tool(available: bool, reason: str) -> None:
    """Go on when ``available``; else skip the test saying ``reason`` (which names the
    missing tool and how to install it), or fail it under CI with "CI is set and <reason>"."""
    if available:
        return
    if in_ci():
        pytest.fail(f"CI is set and {reason}")
    pytest.skip(reason)
