"""Fixtures shared by the gather tests: a real Prometheus over synthetic engine series."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gather.gather_dataset import dataset
from tests.gather.gather_tsdb import backfilled_prometheus, prometheus_available
from tests.tools import require_tool


@pytest.fixture(scope="session")
def synthetic_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a Prometheus serving ``gather_dataset.dataset()``; without the binaries
    it skips locally and fails under CI (as ``prometheus_fixture`` does)."""
    require_tool(
        prometheus_available(),
        "this needs the prometheus and promtool binaries (apt-get install -y prometheus)",
    )
    with backfilled_prometheus(dataset(), tmp_path_factory.mktemp("tsdb")) as url:
        yield url
