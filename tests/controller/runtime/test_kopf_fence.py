"""The kopf fence: the code that depends on kopf's internals is one module, and a kopf
release that changes those internals fails here before it reaches the operator.

Three parts: pyproject.toml bounds kopf's version; an import-linter contract
(``tests/controller/private_imports.py``) lets only ``controller/runtime/kopf_startup.py``
import ``kopf._*``, checked here on the package and on a package that breaks it; and the
kopf methods and functions the operator replaces (``ToggleSet.make_toggle``,
``drop_toggle``), builds on (``NoDiffBaseStorage`` on kopf's diff base interface and cause
detection, ``bounded_session`` as kopf's ``APIContext`` builds its session) or reaches into
are compared, signature and source, with the kopf the bound was last checked against.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import grimp
import kopf
import pytest
from packaging.requirements import Requirement

from tests.controller.private_imports import PrivateImportsContract, private_uses, source_of

ROOT = Path(__file__).resolve().parents[3]
FENCED = "cachescale.controller.runtime.kopf_startup"


def fence(root: str, allowed: str) -> PrivateImportsContract:
    return PrivateImportsContract(
        name="kopf fence",
        session_options={"root_packages": [root]},
        contract_options={"package": "kopf", "allowed_importers": [allowed]},
    )


def graph_of(root: str) -> grimp.ImportGraph:
    return grimp.build_graph(root, include_external_packages=True, cache_dir=None)


def test_only_kopf_startup_uses_kopfs_private_api() -> None:
    check = fence("cachescale", FENCED).check(graph_of("cachescale"), verbose=False)
    assert check.kept, check.metadata["uses"]
    assert private_uses(FENCED, source_of(FENCED), "kopf"), "the fenced module uses none"


VIOLATIONS = """\
import kopf
import kopf._core.engines.peering
from kopf._cogs.aiokits.aiotoggles import ToggleSet
from kopf import _cogs
from kopf.on import _private
import kopf as k

KOPF_API = (kopf.on.startup, kopf.__version__, k.Body)
WAKER = k._cogs


def later() -> object:
    from kopf._core.actions import execution

    return execution
"""


def test_the_fence_breaks_on_each_way_of_reaching_kopfs_private_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imports of private modules or names, and private attributes of the package: every
    one reported with its line, the public API never, the allowed module never."""
    package = tmp_path / "fenced_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "allowed.py").write_text("from kopf._cogs.aiokits import aiotoggles\n")
    (package / "public.py").write_text("import kopf\n\nHANDLER = kopf.on.event\n")
    (package / "violating.py").write_text(VIOLATIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    check = fence("fenced_probe", "fenced_probe.allowed").check(
        graph_of("fenced_probe"), verbose=False
    )
    assert not check.kept
    assert {(use.module, use.line) for use in check.metadata["uses"]} == {
        ("fenced_probe.violating", line) for line in (2, 3, 4, 5, 9, 13)
    }


def test_kopf_is_bounded_and_the_fence_is_configured() -> None:
    """The installed kopf is within the bound, and the bound has a ceiling; lint-imports
    runs the contract with kopf_startup as the one allowed module."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [kopf_requirement] = [
        Requirement(line)
        for line in config["project"]["optional-dependencies"]["operator"]
        if Requirement(line).name == "kopf"
    ]
    assert any(spec.operator == "<" for spec in kopf_requirement.specifier)
    assert kopf_requirement.specifier.contains(version("kopf"))
    linter = config["tool"]["importlinter"]
    [contract] = [c for c in linter["contracts"] if c["type"] == "private_imports"]
    assert (contract["package"], contract["allowed_importers"]) == ("kopf", [FENCED])
    module, _, name = linter["contract_types"][0].partition(": ")[2].rpartition(".")
    assert getattr(importlib.import_module(module), name) is PrivateImportsContract


@dataclass(frozen=True)
class Internal:
    """A kopf method the operator depends on, as it was when the bound was last raised."""

    used_by: str
    signature: str
    sha256: str


TOGGLES = "kopf._cogs.aiokits.aiotoggles"
KOPF_INTERNALS = {
    f"{TOGGLES}:ToggleSet.make_toggle": Internal(
        "kopf_startup.py (replaced by _make_toggle)",
        "self, __val: bool=False, *, name: str | None=None",
        "5d8fef4324bb0148370ea189574a79ffa2a9bbd3210fe1fc2c7a7a9104e9abad",
    ),
    f"{TOGGLES}:ToggleSet.drop_toggle": Internal(
        "kopf_startup.py (replaced by _drop_toggle)",
        "self, toggle: Toggle",
        "da40e1ef2b204d82f0974e19d58e2db74691fc5d02ab1fed9502b11222fafc9c",
    ),
    f"{TOGGLES}:ToggleSet.__init__": Internal(
        "kopf_startup.py (its _condition and _toggles)",
        "self, fn: Callable[[Iterable[bool]], bool]",
        "4b3d3998336e9938e5d3fbb23639583b504ac2be35a05bc22a247ab63420771c",
    ),
    f"{TOGGLES}:ToggleSet.is_on": Internal(
        "kopf_startup.py (the set's state compared)",
        "self",
        "d9e6cb8b5bc3745f84b553fd4f7f1438fb1158ad971d1a242b767ad996e92a49",
    ),
    f"{TOGGLES}:Toggle.__init__": Internal(
        "kopf_startup.py (a toggle built as kopf builds it)",
        "self, __state: bool=False, *, name: str | None=None, "
        "condition: asyncio.Condition | None=None",
        "89b65a51638aa4c9a1c356568acc9adc61e3824245713d803403a6b5689a1d6e",
    ),
    "kopf._cogs.clients.auth:APIContext.__init__": Internal(
        "kopf_startup.py (bounded_session builds the session as this does)",
        "self, info: credentials.KubeContext",
        "6be4f9b9e1b2b854e765f61e9a0a2e03eec16059133d2442338d9f8106a8cc80",
    ),
    "kopf:DiffBaseStorage.fetch": Internal(
        "kopf_storage.py (NoDiffBaseStorage.fetch overrides it)",
        "self, *, body: bodies.Body",
        "4170fb6b3b4e4b3fa77d9ad7f36b72fe1e8bc913b474cedc7832d323a52c4df7",
    ),
    "kopf:DiffBaseStorage.store": Internal(
        "kopf_storage.py (NoDiffBaseStorage.store overrides it)",
        "self, *, body: bodies.Body, patch: patches.Patch, essence: bodies.BodyEssence",
        "677669feab6c8a7d2baac901261a5307e294f723a38532306a6bf74ce782c821",
    ),
    "kopf._core.reactor.processing:_detect_causes": Internal(
        "kopf_storage.py (fetch's essence compared with build's, no extra fields: no change)",
        "indexers: indexing.OperatorIndexers, registry: registries.OperatorRegistry, "
        "settings: configuration.OperatorSettings, resource: references.Resource, raw_event: "
        "bodies.RawEvent, body: bodies.Body, patch: patches.Patch, memory: "
        "inventory.ResourceMemory, local_logger: loggers.ObjectLogger, event_logger: "
        "loggers.ObjectLogger",
        "e147f418ca5039fbd59c25b6c7d65830ac48534e786cf037620f804a9fee47f9",
    ),
    "kopf._core.intents.causes:detect_changing_cause": Internal(
        "kopf_storage.py (a deletion before the diff base; no change a no-op or resume)",
        "*, finalizer: str, raw_event: bodies.RawEvent, body: bodies.Body, old: "
        "bodies.BodyEssence | None=None, new: bodies.BodyEssence | None=None, diff: "
        "diffs.Diff | None=None, initial: bool=False, **kwargs: Any",
        "7ade5f198f9f9434fef28d160a3dfdcfdc5783eba30928782f4794f21481c009",
    ),
}


def kopfs_own(name: str) -> tuple[str, str, str]:
    """Where ``module:Class.method`` or ``module:function`` is defined, its parameters and
    its source's digest, read from kopf's file (the operator replaces some of them on the
    live class)."""
    module_name, _, qualified = name.partition(":")
    owner_name, _, attribute = qualified.rpartition(".")
    module = importlib.import_module(module_name)
    if owner_name:
        owner = getattr(module, owner_name)
        definer = next(c for c in owner.__mro__ if attribute in vars(c))
        home, where = definer.__module__, f"{definer.__qualname__}.{attribute}"
    else:
        home, where = getattr(module, attribute).__module__, attribute
    source = inspect.getsource(sys.modules[home])
    scope = ast.parse(source).body
    if owner_name:
        [cls] = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == definer.__name__]
        scope = cls.body
    [function] = [
        n
        for n in scope
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == attribute
    ]
    text = ast.get_source_segment(source, function) or ""
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{home}.{where}", ast.unparse(function.args), digest


@pytest.mark.parametrize("name", sorted(KOPF_INTERNALS))
def test_the_kopf_internals_the_operator_depends_on_are_unchanged(name: str) -> None:
    recorded = KOPF_INTERNALS[name]
    where, signature, digest = kopfs_own(name)
    advice = (
        f"kopf {kopf.__version__} changed {where}, which "
        f"controller/runtime/{recorded.used_by} depends on: re-check that module against "
        "this kopf before raising the kopf bound in pyproject.toml, then record the new "
        "signature and digest in KOPF_INTERNALS"
    )
    assert signature == recorded.signature, advice
    assert digest == recorded.sha256, advice
