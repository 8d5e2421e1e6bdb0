"""The audit runs on the core install: no operator extra, no plotting library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_audit_imports_none_of_the_operator_extra(tmp_path: Path) -> None:
    probe = (
        "import sys; from cachescale.cli import main; "
        f"main(['audit', 'demo', '--case', 'timestamp-top', '--out', {str(tmp_path)!r}]); "
        f"main(['audit', 'run', {str(tmp_path / 'baseline.jsonl')!r}, "
        f"'--out', {str(tmp_path / 'r.json')!r}]); "
        "print(sorted(m for m in ('kopf', 'kubernetes', 'aiohttp', 'prometheus_api_client', "
        "'requests', 'urllib3', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
