"""The source layout: operator/ is a source root and must never shadow the stdlib."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.import_probe import OPERATOR_EXTRA, heavy_modules_imported

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


def test_the_cli_without_the_operator_extra_imports_none_of_it() -> None:
    """``pip install cachescale`` (no extras) runs simulate, validate and emulate: building
    the parser and simulating must not import what only ``run`` and ``init`` need."""
    steady = ["simulate", "--scenario", "steady", "--duration", "2m", "--json"]
    assert heavy_modules_imported([steady], OPERATOR_EXTRA) == []
