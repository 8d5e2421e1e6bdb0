"""The source layout: operator/ is a source root and must never shadow the stdlib."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_operator_is_a_source_root_not_a_package() -> None:
    assert not (REPO / "operator" / "__init__.py").exists()
    assert (REPO / "operator" / "cachescale" / "__init__.py").exists()


def test_stdlib_operator_not_shadowed_from_repo_root() -> None:
    for flags in ([], ["-S"]):
        result = subprocess.run(
            [sys.executable, *flags, "-c", "import operator; print(operator.add(1, 2))"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.stdout.strip() == "3", result.stderr


def test_package_importable_from_repo_root() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import cachescale, operator; print(cachescale.__name__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.strip() == "cachescale", result.stderr
