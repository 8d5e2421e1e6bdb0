"""Scrape targets: the file_sd file Prometheus watches and the printed scrape config."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cachescale.emulator.targets import JOB_NAME, Target, scrape_config_yaml, write_file_sd

TARGETS = [
    Target("llm", "vllm-engine-1", "127.0.0.1:9001"),
    Target("llm", "vllm-engine-0", "127.0.0.1:9000"),
]


def test_file_sd_lists_each_pod_with_its_pod_and_namespace_labels(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    write_file_sd(path, TARGETS)
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9000"], "labels": {"namespace": "llm", "pod": "vllm-engine-0"}},
        {"targets": ["127.0.0.1:9001"], "labels": {"namespace": "llm", "pod": "vllm-engine-1"}},
    ]


def test_file_sd_is_replaced_whole_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    write_file_sd(path, TARGETS)
    write_file_sd(path, TARGETS[:1])
    assert [group["labels"]["pod"] for group in json.loads(path.read_text())] == ["vllm-engine-1"]
    write_file_sd(path, [])
    assert json.loads(path.read_text()) == []
    assert [entry.name for entry in tmp_path.iterdir()] == ["targets.json"]
    assert path.stat().st_mode & 0o044 == 0o044  # readable by a Prometheus of another user


def test_scrape_config_uses_the_file_sd_file_when_there_is_one(tmp_path: Path) -> None:
    config = yaml.safe_load(scrape_config_yaml(tmp_path / "t.json", TARGETS))
    (job,) = config["scrape_configs"]
    assert job["job_name"] == JOB_NAME
    assert job["file_sd_configs"] == [{"files": [str((tmp_path / "t.json").resolve())]}]
    assert "static_configs" not in job


def test_scrape_config_falls_back_to_static_targets() -> None:
    (job,) = yaml.safe_load(scrape_config_yaml(None, TARGETS))["scrape_configs"]
    assert "file_sd_configs" not in job
    assert [group["targets"] for group in job["static_configs"]] == [
        ["127.0.0.1:9000"],
        ["127.0.0.1:9001"],
    ]
    assert job["static_configs"][0]["labels"] == {"namespace": "llm", "pod": "vllm-engine-0"}
