"""What to install for an optional extra, worded once for every message that names one.

cachescale is not published on a package index, so installing it by name fails: it
installs from a clone of its repository, and a message that says what is missing names
that install, ``pip install '.[EXTRA]'`` in the clone. The extras are ``pyproject.toml``'s:
``operator`` (``run``, ``init``, ``signals``, ``report``), ``plots`` (``--out`` of
``simulate`` and ``report``) and ``audit`` (``audit run`` with text prompts, chat
templates or vLLM's byte-identical hashes). A command checks for what it needs before it
does any work and says so in one line, never with a traceback.
"""

from __future__ import annotations

import importlib.util


def install_hint(extra: str) -> str:
    """The one way to add ``extra`` that exists: ``pip install '.[EXTRA]'`` in a clone."""
    return f"pip install '.[{extra}]' in a clone of the cachescale repository"


def needs_extra(module: str, extra: str) -> str:
    """``needs MODULE: <install hint>``, the refusal when ``module`` is not installed."""
    return f"needs {module}: {install_hint(extra)}"


def missing_extra(module: str, extra: str) -> str | None:
    """The refusal (:func:`needs_extra`) when ``module`` (of ``extra``) is not installed, else
    None; checked without importing it."""
    return None if importlib.util.find_spec(module) is not None else needs_extra(module, extra)
