"""Fixtures for the operator tests: a fake cluster, a fake Prometheus, a settable clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cachescale.controller.reconcile.context import Operator
from tests.controller.cluster import Clock, FakeCluster, fake_cluster
from tests.controller.engine_fake import EngineFake
from tests.gather.gather_fakes import FakePrometheus, fake_prometheus


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with fake_cluster() as running:
        yield running


@pytest.fixture
def engines() -> EngineFake:
    return EngineFake()


@pytest.fixture
def prometheus(engines: EngineFake) -> Iterator[FakePrometheus]:
    with fake_prometheus() as fake:
        fake.respond = engines
        yield fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def operator(cluster: FakeCluster, clock: Clock) -> Operator:
    return Operator(cluster.api, clock=clock)
