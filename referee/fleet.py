"""A small fleet of real vLLM servers: started at once, scraped as pods, loaded together.

- ``run_fleet`` starts ``size`` servers (``referee.vllm.run_vllm``) at the same time, each
  limited to ``omp_threads`` OpenMP threads (unbound, ``VLLM_CPU_OMP_THREADS_BIND=nobind``)
  so that two share the machine's two cores instead of each taking both; it returns once
  every one is healthy and stops them all on the way out, whichever failed.
- ``scrape_as_pods`` starts a real Prometheus scraping server N as pod N of a namespace,
  the labels a Kubernetes pod scrape adds, so a selector written for the real pods of a
  Deployment (e2e/serving.py makes them on the API server) finds vLLM's own series.
- ``fleet_load`` drives ``referee.load`` chat load against every server in the background,
  one seeded load each (a session stays on its server, as with session affinity), with
  one ``stamp`` for the whole fleet: a template change rolls out to every client at once.
- ``in_background`` enters a context manager in a thread while the caller goes on: the
  fleet starts while the envtest control plane, which must start in the main thread,
  comes up beside it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from referee.load import ChatLoad, LoadRun, drive
from referee.vllm import EngineSettings, VllmServer, run_vllm
from tests.prometheus_fixture import PrometheusServer, run_prometheus

T = TypeVar("T")

FOREVER_S = 24 * 3600.0
"""The deadline of a background load: it ends when its ``stop`` is set."""


@contextmanager
def run_fleet(
    workdir: Path, settings: EngineSettings, size: int, omp_threads: int = 1
) -> Iterator[list[VllmServer]]:
    """``size`` vLLM servers with ``settings``, started together; every one healthy."""
    each = replace(settings, threads=omp_threads)
    managers = [run_vllm(workdir, each) for _ in range(size)]
    with ExitStack() as stack:
        with ThreadPoolExecutor(size) as pool:
            starting = [pool.submit(manager.__enter__) for manager in managers]
            servers, errors = [], []
            for manager, future in zip(managers, starting, strict=True):
                try:
                    servers.append(future.result())
                except Exception as error:  # one failed: stop the others on the way out
                    errors.append(error)
                else:
                    stack.push(manager.__exit__)
        if errors:
            raise errors[0]
        yield servers


def _file_sd(namespace: str, servers: Sequence[VllmServer], pods: Sequence[str]) -> str:
    groups = [
        {"targets": [server.address], "labels": {"namespace": namespace, "pod": pod}}
        for server, pod in zip(servers, pods, strict=True)
    ]
    return json.dumps(groups)


@contextmanager
def scrape_as_pods(
    workdir: Path,
    servers: Sequence[VllmServer],
    namespace: str,
    pods: Sequence[str],
    scrape_s: float,
) -> Iterator[PrometheusServer]:
    """A real Prometheus scraping server N as ``pods[N]`` in ``namespace`` every
    ``scrape_s`` seconds (and within it), once every pod's first scrape is up."""
    file_sd = workdir / "pods.json"
    file_sd.write_text(_file_sd(namespace, servers, pods), encoding="utf-8")
    with run_prometheus(workdir, file_sd, scrape_s) as prometheus:
        prometheus.wait_for_targets_up(set(pods), timeout_s=30.0)
        yield prometheus


@dataclass
class FleetLoad:
    """Chat load running against every server of a fleet, and its two switches."""

    stamp: threading.Event = field(default_factory=threading.Event)
    """Set: every client's prompts carry the time at the top from its next request on."""
    stop: threading.Event = field(default_factory=threading.Event)
    runs: list[LoadRun] = field(default_factory=list)
    """Each server's record, once the load has stopped."""


@contextmanager
def fleet_load(servers: Sequence[VllmServer], load: ChatLoad) -> Iterator[FleetLoad]:
    """``load`` against each server (seeds ``load.seed``, ``load.seed + 1``, ...) until
    the context ends; then every client's last answer is awaited and the runs kept."""
    switches = FleetLoad()
    with ThreadPoolExecutor(len(servers), thread_name_prefix="fleet-load") as pool:
        running: list[Future[LoadRun]] = [
            pool.submit(
                drive,
                server,
                replace(load, seed=load.seed + index),
                until=time.time() + FOREVER_S,
                stamp=switches.stamp,
                stop=switches.stop,
            )
            for index, server in enumerate(servers)
        ]
        try:
            yield switches
        finally:
            switches.stop.set()
            switches.runs = [future.result() for future in running]


@contextmanager
def in_background(manager: AbstractContextManager[T]) -> Iterator[Future[T]]:
    """Enter ``manager`` in a thread while the caller goes on (what it yields is the
    future's result); on the way out, wait for that entry and exit it if it succeeded.
    For managers whose processes may outlive the thread that started them (vLLM, not
    the envtest control plane: its binaries die with the thread that forked them)."""
    with ThreadPoolExecutor(1, thread_name_prefix="in-background") as pool:
        entering = pool.submit(manager.__enter__)
        try:
            yield entering
        finally:
            if entering.exception() is None:
                manager.__exit__(None, None, None)
