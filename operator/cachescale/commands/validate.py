"""``cachescale validate``: check policy files as strictly as the API server does.

Each FILE argument is a YAML file, a folder of them (every ``.yaml``/``.yml`` below it,
hidden ones left out, in a stable order), or ``-``: standard input, named ``<stdin>`` in
messages. Every document is checked by ``api/validation.py``; each problem is one line on
stderr (``FILE: document N (name): field.path: message``), each document of another kind
a note on stdout, so a whole GitOps folder can be checked. A ``v1`` ``List`` (what
``kubectl get csp -o yaml`` writes) is read item by item, each as if it were a document
of its own: a problem names ``items[I].field.path``, an item of another kind gets the
same note. A FILE or folder that holds no policy at all is an error, and so is a file
that is not UTF-8 or cannot be read. Exit 0 when every policy is valid, 1 on any problem.

``cachescale groups`` reads its FILE arguments the same way (``read_policy_files``), so
its refusals are validate's lines.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from cachescale.api.policy import API_VERSION, KIND
from cachescale.exit_codes import ExitCode

LIST = ("v1", "List")
"""The ``apiVersion`` and ``kind`` of a list of objects, as ``kubectl get -o yaml`` writes it."""
STDIN = "-"
"""The FILE argument that means standard input."""
STDIN_NAME = "<stdin>"
"""Standard input's name in messages."""

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
            "whole GitOps folder can be checked; a v1 List (kubectl get csp -o yaml) is "
            "checked item by item. A FILE or folder with no policy at all is an error. "
            "Exit 1 on any problem."
        ),
    )
    validate.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="policy YAML file, a folder of them, or - to read standard input",
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


def _read_stdin() -> bytes:
    if sys.stdin is None:  # closed (`<&-`)
        raise OSError(errno.EBADF, "standard input is closed")
    return sys.stdin.buffer.read()


def _sources(argument: str) -> list[tuple[Path, Callable[[], bytes]]]:
    """Each file an argument names, with how to read it (``-``: standard input)."""
    if argument == STDIN:
        return [(Path(STDIN_NAME), _read_stdin)]
    return [(path, path.read_bytes) for path in _policy_files(Path(argument))]


def _has_aliases(text: str, document: int) -> bool:
    """Whether the ``document``-th document of ``text`` (which has parsed) has an alias."""
    index = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            index += 1
        elif index == document and isinstance(event, yaml.AliasEvent):
            return True
    return False


def _check_items(checked: Checked, document: int, items: list[Any]) -> None:
    """Check each item of the ``List`` that is ``document`` as a document of its own, into
    ``checked``: a problem's path and a note name ``items[I]``."""
    from cachescale.api.validation import Problem, Skipped, check_text

    for position, item in enumerate(items):
        where = f"items[{position}]"
        one = check_text(yaml.safe_dump(item, sort_keys=False))
        checked.policies += one.policies
        checked.problems.extend(
            Problem(document, problem.name, _under(where, problem.path), problem.message)
            for problem in one.problems
        )
        checked.skipped.extend(Skipped(document, f"{note.found} ({where})") for note in one.skipped)


def _under(where: str, path: str) -> str:
    return where if path == "-" else f"{where}.{path}"


def _check(text: str) -> Checked:
    """``check_text``, with each ``v1`` ``List`` document read item by item (an anchor or
    alias in a List is refused, as in a policy)."""
    from cachescale.api.validation import Problem, check_text, load_documents

    checked = check_text(text)
    lists = {note.document for note in checked.skipped if note.found == "/".join(LIST)}
    if not lists:  # the common case: the text is parsed once
        return checked
    documents = load_documents(text)  # it parsed: check_text found documents in it
    for index in sorted(lists):
        document = documents[index - 1]
        if not (isinstance(document.get("items"), list) and document["items"]):
            continue  # an empty List keeps its note
        checked.skipped = [note for note in checked.skipped if note.document != index]
        if _has_aliases(text, index):
            message = "YAML anchors and aliases are not accepted in a List; write the values out"
            checked.problems.append(Problem(index, None, "items", message))
            checked.policies += 1
        else:
            _check_items(checked, index, document["items"])
    checked.skipped.sort(key=lambda note: note.document)
    checked.problems.sort(key=lambda problem: problem.document)
    return checked


def _check_argument(
    argument: str, valid: Callable[[Path, str], None], notes: TextIO | None = None
) -> bool:
    """Check one FILE or folder argument, print what was found (problems on stderr,
    skipped documents on ``notes``, default stdout) and hand each valid file with a
    policy to ``valid(path, text)``; True when all is well."""
    from cachescale.api.validation import decode

    files = _sources(argument)
    if not files:
        print(f"{argument}: no .yaml or .yml files in this folder", file=sys.stderr)
        return False
    read: list[Checked] = []
    ok = True
    for path, read_bytes in files:
        try:
            text = decode(read_bytes())
            checked = _check(text)
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
