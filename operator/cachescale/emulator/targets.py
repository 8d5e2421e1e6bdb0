"""Scrape targets for the emulated pods: Prometheus file_sd JSON and a scrape config.

In a cluster the engines never label their own series with ``pod`` or ``namespace``: the
scrape config (a PodMonitor, or ``kubernetes_sd_configs`` relabelling) adds them as target
labels. The emulator reproduces that split: its endpoints export engine labels only, and
the target list written here carries ``pod`` and ``namespace``. A ``file_sd`` file is the
dynamic form (Prometheus follows pods as they come and go); ``static_configs`` is the
fallback when no file is written, and only lists the pods alive when it is printed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from cachescale.emulator.files import write_atomically

JOB_NAME = "cachescale-emulator"
SCRAPE_INTERVAL = "1s"
"""The printed config's interval: an accelerated emulator moves fast, so scrape often."""


@dataclass(frozen=True, order=True)
class Target:
    """One emulated pod as Prometheus should scrape it."""

    namespace: str
    pod: str
    address: str
    """``host:port`` of the pod's ``/metrics`` endpoint."""

    @property
    def url(self) -> str:
        """The metrics URL, for people."""
        return f"http://{self.address}/metrics"

    def labels(self) -> dict[str, str]:
        """The target labels a cluster's scrape config would attach."""
        return {"namespace": self.namespace, "pod": self.pod}


def file_sd_groups(targets: Sequence[Target]) -> list[dict[str, object]]:
    """Prometheus file_sd target groups: one group per pod, sorted for stable output."""
    return [{"targets": [target.address], "labels": target.labels()} for target in sorted(targets)]


def write_file_sd(path: Path, targets: Sequence[Target]) -> None:
    """Atomically replace the file_sd file with ``targets``."""
    write_atomically(path, json.dumps(file_sd_groups(targets), indent=2) + "\n")


def scrape_config(file_sd: Path | None, targets: Sequence[Target]) -> dict[str, object]:
    """A ``scrape_configs`` document: file_sd when there is a file, else static targets."""
    job: dict[str, object] = {
        "job_name": JOB_NAME,
        "scrape_interval": SCRAPE_INTERVAL,
        "metrics_path": "/metrics",
    }
    if file_sd is not None:
        job["file_sd_configs"] = [{"files": [str(file_sd.resolve())]}]
    else:
        job["static_configs"] = file_sd_groups(targets)
    return {"scrape_configs": [job]}


def scrape_config_yaml(file_sd: Path | None, targets: Sequence[Target]) -> str:
    """:func:`scrape_config` as YAML, ready to paste under a Prometheus config."""
    return yaml.safe_dump(scrape_config(file_sd, targets), sort_keys=False)
