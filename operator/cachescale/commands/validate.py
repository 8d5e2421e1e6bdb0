"""``cachescale validate``: check policy files as strictly as the API server does.

Each FILE argument is a YAML file or a folder of them (every ``.yaml``/``.yml`` below it,
hidden ones left out, in a stable order). Every document is checked by
``api/validation.py``; each problem is one line on stderr (``FILE: document N (name):
field.path: message``), each document of another kind a note on stdout, so a whole GitOps
folder can be checked. A FILE or folder that holds no policy at all is an error, and so is
a file that is not UTF-8 or cannot be read. Exit 0 when every policy is valid, 1 on any
problem.

``cachescale groups`` reads its FILE arguments the same way (``read_policy_files``), so
its refusals are validate's lines.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from cachescale.api.policy import API_VERSION, KIND
from cachescale.exit_codes import ExitCode

if TYPE_CHECKING:
    from cachescale.api.validation import Checked


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cachescale validate``."""
    validate = commands.add_parser(
        "validate",
        help="check CacheScalingPolicy YAML files and explain every problem",
        description=(
            "Validate policy files (multi-document YAML) against the API, as strictly as "
            "the API server does. Prints each problem as FILE: document N (name): "
            "field.path: message. Documents of other kinds are skipped with a note, so a "
            "whole GitOps folder can be checked; a FILE or folder with no policy at all is "
            "an error. Exit 1 on any problem."
        ),
    )
    validate.add_argument(
        "files", nargs="+", metavar="FILE", help="policy YAML file, or a folder of them"
    )
    validate.set_defaults(handler=run)


def _policy_files(argument: Path) -> list[Path]:
    """The YAML files an argument names: itself, or every ``.yaml``/``.yml`` under a folder
    (hidden files and folders left out, in a stable order)."""
    if not argument.is_dir():
        return [argument]
    return sorted(
        path
        for path in argument.rglob("*")
        if path.suffix in (".yaml", ".yml")
        and path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(argument).parts)
    )


def _check_argument(
    argument: str, valid: Callable[[Path, str], None], notes: TextIO | None = None
) -> bool:
    """Check one FILE or folder argument, print what was found (problems on stderr,
    skipped documents on ``notes``, default stdout) and hand each valid file with a
    policy to ``valid(path, text)``; True when all is well."""
    from cachescale.api.validation import check_text, decode

    files = _policy_files(Path(argument))
    if not files:
        print(f"{argument}: no .yaml or .yml files in this folder", file=sys.stderr)
        return False
    read: list[Checked] = []
    ok = True
    for path in files:
        try:
            text = decode(path.read_bytes())
            checked = check_text(text)
        except OSError as error:
            print(f"{path}: cannot read: {error.strerror}", file=sys.stderr)
            ok = False
            continue
        except ValueError as error:  # not UTF-8
            print(f"{path}: {error}", file=sys.stderr)
            ok = False
            continue
        read.append(checked)
        for note in checked.skipped:
            print(note.render(str(path)), file=notes or sys.stdout)
        for problem in checked.problems:
            print(problem.render(str(path)), file=sys.stderr)
        ok = ok and not checked.problems
        if checked.policies and not checked.problems:
            valid(path, text)
    if read and not any(one.policies or one.problems for one in read):
        print(f"{argument}: {no_policy_message(read)}", file=sys.stderr)
        ok = False
    return ok


def _print_valid(path: Path, _text: str) -> None:
    print(f"{path}: valid")


def read_policy_files(arguments: Sequence[str]) -> list[tuple[Path, str]] | None:
    """The texts of the policy files ``arguments`` name (files or folders), checked as
    ``cachescale validate`` checks them; None, with every problem printed on stderr as
    validate prints it, when any is not valid. Skipped documents are noted on stderr."""
    found: list[tuple[Path, str]] = []
    results = [
        _check_argument(argument, lambda path, text: found.append((path, text)), sys.stderr)
        for argument in arguments
    ]
    return found if all(results) else None


def run(args: argparse.Namespace) -> int:
    """Handle ``cachescale validate``; return the exit code."""
    results = [_check_argument(argument, _print_valid) for argument in args.files]
    return ExitCode.OK if all(results) else ExitCode.INVALID


def no_policy_message(checked: list[Checked]) -> str:
    """Why a file (or a folder of files) that holds no policy is refused."""
    found = sorted({note.found for one in checked for note in one.skipped})
    if found:
        return f"no {KIND} found (expected {API_VERSION} {KIND}, found {', '.join(found)})"
    return f"no {KIND} found: no YAML documents (empty, only comments, or only --- separators)"
