"""An import-linter contract type: only the named modules may use a package's private API.

The kopf fence (``[tool.importlinter]`` in pyproject.toml) is one of these: only
``cachescale.controller.runtime.kopf_startup`` may import ``kopf._cogs…`` or ``kopf._core…``,
so the code that depends on kopf's internals, and must be re-checked when kopf changes, is
one module. import-linter squashes an external package into one node (``kopf``), so a
``forbidden`` contract cannot tell ``import kopf`` from ``from kopf._cogs… import …``. This
contract asks the graph which modules import the package at all, then reads each of them:
a private name is any dotted part after the package that starts with ``_`` (dunders such as
``__version__`` excepted), whether imported (``import kopf._core``, ``from kopf._cogs.x
import y``, ``from kopf import _cogs``, ``from kopf.x import _y``) or reached as an
attribute of the imported package (``kopf._core``).

Options: ``package`` (the external package, e.g. ``kopf``) and ``allowed_importers`` (the
modules that may). ``tests/controller/runtime/test_kopf_fence.py`` checks the contract
breaks on a violation.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import grimp
from importlinter import Contract, ContractCheck, fields, output


@dataclass(frozen=True)
class PrivateUse:
    """One use of the package's private API: where, and the statement's text."""

    module: str
    line: int
    text: str


class PrivateImportsContract(Contract):
    """Only ``allowed_importers`` may use ``package``'s private modules or names."""

    type_name = "private_imports"

    package = fields.StringField()
    allowed_importers = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        """Kept when no module outside ``allowed_importers`` uses a private name."""
        package = str(self.package)
        allowed = {module.name for module in self.allowed_importers}
        importers = graph.find_modules_that_directly_import(package) - allowed
        found = [
            use
            for importer in sorted(importers)
            for use in private_uses(importer, source_of(importer), package)
        ]
        output.verbose_print(verbose, f"{len(importers)} other modules import {package}")
        return ContractCheck(kept=not found, metadata={"uses": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        """One line per private use: module, line and statement."""
        output.print_error(
            f"Only {', '.join(m.name for m in self.allowed_importers)} may use "
            f"{self.package}'s private API:",
            bold=False,
        )
        output.new_line()
        for use in check.metadata["uses"]:
            output.print_error(f"- {use.module} (l.{use.line}): {use.text}", bold=False)
        output.new_line()


def source_of(module: str) -> Path:
    """The file of ``module``, found from its top package's location without importing
    the module itself."""
    root, *rest = module.split(".")
    spec = importlib.util.find_spec(root)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{root} is not a package on sys.path")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def private_uses(module: str, path: Path, package: str) -> list[PrivateUse]:
    """Every import of a private name under ``package`` in the file, and every private
    attribute of a name bound to the package itself (``import kopf``, ``import kopf as k``)."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    bound = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == package
    }
    lines = source.splitlines()
    return [
        PrivateUse(module, node.lineno, lines[node.lineno - 1].strip())
        for node in ast.walk(tree)
        if _is_private_use(node, package, bound)
    ]


def _is_private_use(node: ast.AST, package: str, bound: set[str]) -> bool:
    if isinstance(node, ast.Import):
        return any(_private_path(alias.name, package) for alias in node.names)
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
        if _private_path(node.module, package):
            return True
        return _under(node.module, package) and any(_private(a.name) for a in node.names)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id in bound and _private(node.attr)
    return False


def _under(dotted: str, package: str) -> bool:
    return dotted == package or dotted.startswith(f"{package}.")


def _private_path(dotted: str, package: str) -> bool:
    """Whether ``dotted`` is under ``package`` and names a private part after it."""
    if not dotted.startswith(f"{package}."):
        return False
    return any(map(_private, dotted[len(package) + 1 :].split(".")))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
