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
``pip install cachescale`` alone runs ``validate``, ``simulate`` and ``emulate``.

A reader that stops early (``cachescale signals ... | head -1``) is handled here, once, for
every subcommand: the closed pipe is not an error of the command, so it exits 0 with no
traceback, and nothing below has to know about pipes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from cachescale.exit_codes import ExitCode


def _cmd_crd(_args: argparse.Namespace) -> int:
    from cachescale.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return ExitCode.OK


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (``PROG: message (see PROG --help)``)
    instead of a usage block, like every other error of the CLI."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser: argparse.ArgumentParser = _Parser(
        prog="cachescale",
        description=(
            "Prefix-cache-aware autoscaling for vLLM and SGLang on Kubernetes. "
            "Exit codes: 0 ok, 1 invalid input, 2 usage error, 3 Prometheus unreadable, "
            "130 interrupted."
        ),
    )
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


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush has no closed pipe to
    fail on (it would print "Exception ignored" and exit 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    try:
        args = build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        status = handler(args)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of stdout went away, e.g. `| head -1`
        _discard_stdout()
        return ExitCode.OK
    except KeyboardInterrupt:  # Ctrl-C: the user knows; a stack trace tells them nothing
        print("\ncachescale: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    return status


if __name__ == "__main__":
    sys.exit(main())
