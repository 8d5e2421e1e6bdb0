"""The ``cachescale`` command: the parser, the dispatch, and what every subcommand shares.

Each subcommand lives in a module of its own in this package, which registers its flags
(``add_parser``) and handles them (``run``): ``validate``, ``simulate``, ``emulate``,
``signals``, ``groups``, ``report``, ``run``, ``init`` and ``audit``; ``crd``, which prints
the generated CRD, is the one line here. ``flags`` holds the value checks they share.

Exit codes are part of the interface (scripts and CI rely on them); every subcommand
returns one of ``cachescale.exit_codes.ExitCode``: 0 success, 1 invalid input (a bad
policy, a bad scenario, an unusable output path), 2 usage error (the command line itself:
a flag that is unknown, missing, malformed or out of range), 3 Prometheus or the API
server could not be read (``cachescale signals``, ``cachescale report``, ``cachescale
init``), 130 interrupted. Flag values are checked by argparse types, so a bad one is a
one-line usage error before anything runs. Each handler parses nothing itself and returns
its exit code. Building the parser imports nothing of the ``operator`` extra (kopf, the
Kubernetes client, the HTTP stack): a subcommand that needs it imports it when it runs, so
``pip install .`` alone runs ``validate``, ``simulate`` and ``emulate``, and one that
needs a missing extra says which in one line (``cachescale.extras``).

Standard output is handled here, once, for every subcommand run as a process
(:class:`_Stdout`), so nothing below has to know about pipes or full disks:

- a reader that stops early (``cachescale validate a.yaml b.yaml | head -1``) is not an
  error of the command: its further output is dropped and it runs to its end, exiting
  with the status it would have had (1 when a file was invalid, so ``set -o pipefail``
  sees it); a command that stops *because* its reader left (``emulate``) exits 0;
- a closed stdout (``>&-``) is /dev/null: the command runs, its status is its own, and a
  line on stderr says the output went nowhere;
- a stdout that cannot be written (``> /dev/full``) stops the command with one line on
  stderr and exit 1 (or the command's own failure, when it had one).

None of them prints a traceback. ``cachescale --version`` prints the installed package's
version (``pyproject.toml``'s when the package runs from a clone without being installed).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from cachescale.exit_codes import ExitCode

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

PROG = "cachescale"
STDOUT = 1
"""Standard output's file descriptor."""
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
"""The clone's ``pyproject.toml``: the version of a package run without being installed."""


def _cmd_crd(_args: argparse.Namespace) -> int:
    from cachescale.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return ExitCode.OK


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (``PROG: message (see PROG --help)``)
    instead of a usage block, like every other error of the CLI."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def package_version() -> str:
    """The installed package's version; ``pyproject.toml``'s when it is not installed."""
    try:
        return metadata.version("cachescale")
    except metadata.PackageNotFoundError:
        pass
    try:
        with PYPROJECT.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "unknown (not installed, and no pyproject.toml beside the package)"


class _Version(argparse.Action):
    """``--version``: ``cachescale VERSION`` on stdout, exit 0 (looked up only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> NoReturn:
        sys.stdout.write(f"{PROG} {package_version()}\n")
        parser.exit(ExitCode.OK)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser: argparse.ArgumentParser = _Parser(
        prog=PROG,
        description=(
            "Prefix-cache-aware autoscaling for vLLM and SGLang on Kubernetes. "
            "Exit codes: 0 ok, 1 invalid input, 2 usage error, 3 Prometheus unreadable, "
            "130 interrupted."
        ),
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crd = commands.add_parser(
        "crd",
        help="print the CacheScalingPolicy CRD generated from the API models",
        description="Print the apiextensions.k8s.io/v1 CRD YAML (what crds/ holds).",
    )
    crd.set_defaults(handler=_cmd_crd)

    from cachescale.commands.validate import add_parser as add_validate_parser

    add_validate_parser(commands)

    from cachescale.commands.simulate import add_parser as add_simulate_parser

    add_simulate_parser(commands)

    from cachescale.commands.emulate import add_parser as add_emulate_parser

    add_emulate_parser(commands)

    from cachescale.commands.signals import add_parser as add_signals_parser

    add_signals_parser(commands)

    from cachescale.commands.groups import add_parser as add_groups_parser

    add_groups_parser(commands)

    from cachescale.commands.report import add_parser as add_report_parser

    add_report_parser(commands)

    from cachescale.commands.run import add_parser as add_run_parser

    add_run_parser(commands)

    from cachescale.commands.init import add_parser as add_init_parser

    add_init_parser(commands)

    from cachescale.commands.audit import add_parser as add_audit_parser

    add_audit_parser(commands)
    return parser


class _StdoutUnwritableError(Exception):
    """Standard output cannot be written (not a reader that left): a full disk, an I/O
    error. Not an ``OSError``, so no subcommand's own ``except OSError`` takes it for one of
    its files."""


class _Stdout(io.RawIOBase):
    """Descriptor 1 for the CLI: a reader that left (``EPIPE``) makes the rest of the
    output vanish instead of raising; any other failure is raised once as
    :class:`_StdoutUnwritableError`, and the output vanishes from then on too."""

    def __init__(self) -> None:
        super().__init__()
        self._dropping = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return STDOUT

    def isatty(self) -> bool:
        return os.isatty(STDOUT)

    def write(self, data: ReadableBuffer) -> int | None:
        if self._dropping:
            return memoryview(data).nbytes
        try:
            return os.write(STDOUT, data)
        except BlockingIOError:  # a non-blocking stdout that is full: as FileIO does
            return None
        except BrokenPipeError:  # the reader went away, e.g. `| head -1`
            self._dropping = True
            return memoryview(data).nbytes
        except OSError as error:
            self._dropping = True
            raise _StdoutUnwritableError(error.strerror or str(error)) from None


def _reopen_if_closed() -> None:
    """Point descriptor 1 at /dev/null when it is closed (``>&-``), so no file the command
    opens can take its place; say so on stderr."""
    try:
        os.fstat(STDOUT)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != STDOUT:
            os.dup2(devnull, STDOUT)
            os.close(devnull)
        if sys.stderr is not None:
            print(f"{PROG}: stdout is closed; the output is discarded", file=sys.stderr)


@contextmanager
def _guarded_stdout() -> Iterator[None]:
    """``sys.stdout`` on :class:`_Stdout` while the command runs, when it is the process's
    own stdout (or there is none); a stdout a caller put in its place (a test capturing it)
    is left alone."""
    original = sys.stdout
    if original is not None and original is not sys.__stdout__:
        yield
        return
    _reopen_if_closed()
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_Stdout()),
        encoding=original.encoding if original is not None else "utf-8",
        errors=original.errors if original is not None else "strict",
        line_buffering=original.line_buffering if original is not None else False,
    )
    try:
        yield
    finally:
        sys.stdout = original


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    with _guarded_stdout():
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    status: int | None = None
    try:
        try:
            args = build_parser().parse_args(argv)
            handler: Callable[[argparse.Namespace], int] = args.handler
            status = handler(args)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:  # the reader of stdout went away, and the command stopped
        return ExitCode.OK if status is None else status
    except _StdoutUnwritableError as error:
        print(f"{PROG}: cannot write stdout: {error}", file=sys.stderr)
        return status or ExitCode.INVALID
    except KeyboardInterrupt:  # Ctrl-C: the user knows; a stack trace tells them nothing
        print("\ncachescale: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    return status


if __name__ == "__main__":
    sys.exit(main())
