"""A real Prometheus over synthetic engine series, for testing the PromQL itself.

The series are written as OpenMetrics text with timestamps, turned into TSDB blocks by
``promtool tsdb create-blocks-from openmetrics`` and served by a ``prometheus`` process on
a free loopback port. Counters are linear in time (so every rate, and every quantile of
linear buckets, has an exact expected value) and can reset mid-window. This checks what
the fake HTTP server cannot: that the queries parse, select, join and aggregate as meant.
"""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

STEP_S = 15
"""Sample spacing, as a 15 s scrape interval."""

Labels = Mapping[str, str]


def sample_times(start: float, end: float) -> list[float]:
    """Every ``STEP_S`` from ``start`` to ``end`` inclusive."""
    return [start + i * STEP_S for i in range(int((end - start) // STEP_S) + 1)]


def _render_labels(labels: Labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


@dataclass
class Series:
    """Synthetic samples, collected per metric name."""

    lines: dict[str, list[str]] = field(default_factory=dict)

    def add(self, name: str, labels: Labels, points: Sequence[tuple[float, float]]) -> None:
        """Samples of one series (name, labels) at (time, value) points."""
        rendered = _render_labels(labels)
        out = self.lines.setdefault(name, [])
        for t, value in points:
            text = "NaN" if math.isnan(value) else repr(float(value))
            out.append(f"{name}{{{rendered}}} {text} {int(t)}")

    def gauge(self, name: str, labels: Labels, value: float, times: Sequence[float]) -> None:
        """A constant gauge."""
        self.add(name, labels, [(t, value) for t in times])

    def counter(
        self,
        name: str,
        labels: Labels,
        per_second: float,
        times: Sequence[float],
        reset_at: float | None = None,
    ) -> None:
        """A counter rising at ``per_second`` from the first sample; restarting from 0 at
        ``reset_at`` as a restarted process does."""
        start = times[0]
        points = []
        for t in times:
            origin = reset_at if reset_at is not None and t >= reset_at else start
            points.append((t, per_second * (t - origin)))
        self.add(name, labels, points)

    def histogram(
        self,
        name: str,
        labels: Labels,
        bucket_per_second: Mapping[str, float],
        sum_per_second: float,
        times: Sequence[float],
    ) -> None:
        """A histogram whose cumulative buckets rise linearly (``+Inf`` is the count)."""
        for le, rate in bucket_per_second.items():
            self.counter(name + "_bucket", {**labels, "le": le}, rate, times)
        self.counter(name + "_count", labels, bucket_per_second["+Inf"], times)
        self.counter(name + "_sum", labels, sum_per_second, times)

    def openmetrics(self) -> str:
        """Every sample, grouped by metric and series, in time order, ending with EOF."""
        ordered = [line for name in sorted(self.lines) for line in self.lines[name]]
        return "\n".join([*ordered, "# EOF"]) + "\n"


def prometheus_available() -> bool:
    """Whether the ``prometheus`` and ``promtool`` binaries are installed."""
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}")
        try:
            with urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except (URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"prometheus at {url} not ready after {timeout_s}s")


@contextmanager
def backfilled_prometheus(series: Series, workdir: Path) -> Iterator[str]:
    """Serve ``series`` from a real Prometheus; yields its base URL."""
    data, tsdb = workdir / "series.om", workdir / "tsdb"
    data.write_text(series.openmetrics(), encoding="utf-8")
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(data), str(tsdb)],
        check=True,
        capture_output=True,
    )
    config = workdir / "prometheus.yml"
    config.write_text("global: {}\n", encoding="utf-8")
    url = f"http://127.0.0.1:{_free_port()}"
    command = [
        "prometheus",
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address={url.removeprefix('http://')}",
        "--log.level=error",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
