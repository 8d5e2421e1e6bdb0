"""The source layout: operator/ is a source root and must never shadow the stdlib; the
package has no import cycle, and no module is over its size line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.import_cycles import cycles, import_cycles
from tests.import_probe import OPERATOR_EXTRA, heavy_modules_imported

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "operator" / "cachescale"
MOST_LINES = 500
"""No module of the package is longer; split by concern before it gets there."""
MOST_LINES_BY_PACKAGE = {"decide": 400}
"""Tighter lines where the rules live: the decision math reads as a whole."""


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


def test_cycles_finds_a_cycle_and_only_the_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"a", "e"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_packages_modules() -> None:
    """``scripts/import_cycles.py`` prints the same (grimp's graph, as import-linter's)."""
    assert import_cycles() == []


def test_no_module_is_over_its_size_line() -> None:
    over = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        inside = path.relative_to(PACKAGE)
        most = MOST_LINES_BY_PACKAGE.get(inside.parts[0], MOST_LINES)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > most:
            over[str(inside)] = f"{lines} lines (at most {most})"
    assert over == {}
