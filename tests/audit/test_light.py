"""The audit runs on the core install: no operator extra, no plotting library."""

from __future__ import annotations

from pathlib import Path

from tests.import_probe import OPERATOR_EXTRA, heavy_modules_imported


def test_audit_imports_none_of_the_operator_extra(tmp_path: Path) -> None:
    demo = ["audit", "demo", "--case", "timestamp-top", "--out", str(tmp_path)]
    run = ["audit", "run", str(tmp_path / "baseline.jsonl"), "--out", str(tmp_path / "r.json")]
    assert heavy_modules_imported([demo, run], (*OPERATOR_EXTRA, "matplotlib")) == []
