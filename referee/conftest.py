"""Fixtures of the referee suite: a real vLLM, a real Prometheus scraping it, chat load.

Each is module-scoped, so a test module starts one vLLM server and the next module's
starts only after it has stopped: never two at once on a machine whose two cores one
server fills. A module that needs other engine settings overrides ``engine_settings``.

- ``vllm_server``: ``referee.vllm.run_vllm`` with the module's ``engine_settings``.
- ``prometheus``: ``tests.prometheus_fixture.run_prometheus`` scraping the server through
  file_sd, with the ``namespace`` and ``pod`` labels a Kubernetes pod scrape adds (vLLM's
  own series carry ``model_name`` and ``engine``).
- ``chat_window``: ``referee.load`` chat load driven through a window of ``WINDOW_S``
  seconds that ends at a whole Unix second ``at`` (the evaluation time every query of the
  module shares), after a lead-in so the window holds no start-up; the load runs a little
  past ``at`` so the window's last scrapes see it, and the fixture returns once
  Prometheus holds a scrape at or after ``at``.

Without the vLLM venv or Prometheus the tests skip locally and fail under ``CI``
(``tests.tools.require_tool``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from referee.load import ChatLoad, LoadRun, drive
from referee.vllm import EngineSettings, VllmServer, run_vllm
from tests.polling import wait_for
from tests.prometheus_fixture import PrometheusServer, run_prometheus

NAMESPACE = "referee"
POD = "vllm-0"
SCRAPE_S = 2.0
"""Scrape interval (and timeout): vLLM answers /metrics slower while it serves on both
cores, and a 60 s window holds about 30 samples at this interval."""
WINDOW_S = 60
LEAD_S = 5.0
"""Load before the window opens."""
TAIL_S = 2.0
"""Load after the evaluation time, so the window's last scrape is taken under load."""


@pytest.fixture(scope="module")
def engine_settings() -> EngineSettings:
    """The engine the module's server runs (override in a module for other settings)."""
    return EngineSettings()


@pytest.fixture(scope="module")
def vllm_server(
    tmp_path_factory: pytest.TempPathFactory, engine_settings: EngineSettings
) -> Iterator[VllmServer]:
    """One real vLLM server for the module, healthy."""
    with run_vllm(tmp_path_factory.mktemp("vllm"), engine_settings) as server:
        yield server


def scrape_target(server: VllmServer, pod: str = POD) -> dict[str, object]:
    """A file_sd group for ``server`` with the labels a Kubernetes pod scrape adds."""
    return {"targets": [server.address], "labels": {"namespace": NAMESPACE, "pod": pod}}


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer
) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping the module's server, once its first scrape is up."""
    workdir = tmp_path_factory.mktemp("prometheus")
    file_sd = workdir / "targets.json"
    file_sd.write_text(json.dumps([scrape_target(vllm_server)]), encoding="utf-8")
    with run_prometheus(workdir, file_sd, SCRAPE_S) as server:
        server.wait_for_targets_up({POD}, timeout_s=30.0)
        yield server


@dataclass(frozen=True)
class ChatWindow:
    """A window of chat load: its end ``at`` (Unix seconds), its length and the run."""

    at: float
    seconds: int
    run: LoadRun

    @property
    def window(self) -> str:
        """The window as PromQL writes it."""
        return f"{self.seconds}s"


@pytest.fixture(scope="module")
def chat_window(vllm_server: VllmServer, prometheus: PrometheusServer) -> ChatWindow:
    """Chat load through a ``WINDOW_S`` window ending at ``at``, scraped past ``at``."""
    at = float(math.ceil(time.time() + LEAD_S + WINDOW_S))
    run = drive(vllm_server, ChatLoad(), until=at + TAIL_S)
    wait_for(
        lambda: _scraped_since(prometheus, at), 30.0, f"a scrape of {POD} at or after {at:.0f}"
    )
    return ChatWindow(at, WINDOW_S, run)


def _scraped_since(prometheus: PrometheusServer, at: float) -> bool | None:
    """Whether Prometheus holds a sample of the server taken at or after ``at``."""
    latest = prometheus.query(f'timestamp(up{{pod="{POD}"}})')
    return True if latest and float(latest[0]["value"][1]) >= at else None
