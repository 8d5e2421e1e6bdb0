"""End-to-end tests run against the cluster KUBECONFIG points at, and skip cleanly otherwise.

Run them with `make e2e`. They create and delete real objects, so they never run by
default in `make test`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# The e2e suite reuses the test suite's real-component fixtures (Prometheus, emulator,
# the operator process) and the controller test's collapse scenario.
_TESTS = Path(__file__).resolve().parents[1] / "tests"
for _helpers in (_TESTS, _TESTS / "controller", _TESTS / "gather", _TESTS / "api"):
    sys.path.insert(0, str(_helpers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every e2e test, with the reason, when there is no cluster to talk to."""
    reason = None
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig or not Path(kubeconfig).exists():
        reason = "KUBECONFIG is not set to an existing file: no cluster to test against"
    elif shutil.which("kubectl") is None:
        reason = "kubectl is not on PATH"
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))
