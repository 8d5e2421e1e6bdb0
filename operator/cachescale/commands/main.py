"""The ``cachescale`` command: one entry point, one subcommand per job.

Exit codes are part of the interface (scripts and CI rely on them); every subcommand
returns one of ``api.exit_codes.ExitCode``: 0 success, 1 invalid input (a bad policy, a bad
scenario, an unusable output path), 2 usage error (the command line itself: a flag that is
unknown, missing, malformed or out of range), 3 Prometheus or the API server could not be
read (``cachescale signals``, ``cachescale report``, ``cachescale init``), 130
interrupted. Flag values are checked by argparse types, so a bad one is a one-line usage
error before anything runs. Each subcommand is a small function that parses nothing
itself and returns its exit code.

A reader that stops early (``cachescale signals ... | head -1``) is handled here, once, for
every subcommand: the closed pipe is not an error of the command, so it exits 0 with no
traceback, and nothing below has to know about pipes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

from cachescale.commands.flags import output_folder
from cachescale.exit_codes import ExitCode


def _cmd_crd(_args: argparse.Namespace) -> int:
    from cachescale.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return ExitCode.OK


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
    from cachescale.api.validation import Checked, check_text, decode, no_policy_message

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


def _cmd_validate(args: argparse.Namespace) -> int:
    results = [_check_argument(argument, _print_valid) for argument in args.files]
    return ExitCode.OK if all(results) else ExitCode.INVALID


def _progress_bar() -> Callable[[float], None] | None:
    """A one-line progress bar on stderr, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(fraction: float) -> None:
        filled = int(40 * fraction)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (40 - filled)}] {fraction:4.0%}")
        if fraction >= 1:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def _cmd_simulate(args: argparse.Namespace) -> int:
    from cachescale.commands.simulate import SimulationRequest, simulate

    try:
        request = SimulationRequest.from_cli(
            scenario=args.scenario,
            scenario_file=args.scenario_file,
            autoscaler=args.autoscaler,
            seed=args.seed,
            duration_s=args.duration,
        )
    except ValueError as error:  # ScenarioError: one line per problem, naming the file
        print(f"cachescale simulate: {error}", file=sys.stderr)
        return ExitCode.INVALID
    if args.out is not None and (problem := output_folder(args.out)) is not None:
        print(f"cachescale simulate: {problem}", file=sys.stderr)
        return ExitCode.INVALID
    for warning in request.warnings:
        print(f"cachescale simulate: warning: {warning}", file=sys.stderr)
    outcome = simulate(request, progress=_progress_bar())
    if args.out is not None:
        outcome.write_artifacts(Path(args.out))
    if args.json:
        sys.stdout.write(outcome.to_json() + "\n")
    else:
        sys.stdout.write(outcome.to_text() + "\n")
    return ExitCode.OK


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (``PROG: message (see PROG --help)``)
    instead of a usage block, like every other error of the CLI."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    from cachescale.commands.simulate import duration_flag, scenario_flag, seed_flag

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
    validate.set_defaults(handler=_cmd_validate)

    simulate = commands.add_parser(
        "simulate",
        help="run the prefix-cache fleet simulator (default: the rag-rechunk incident)",
        description=(
            "Simulate a vLLM fleet with per-pod prefix caches under an autoscaler and print "
            "an on-call report. Without flags it runs the rag-rechunk incident scenario."
        ),
    )
    source = simulate.add_mutually_exclusive_group()
    source.add_argument(
        "--scenario", type=scenario_flag, metavar="NAME", help="built-in scenario name"
    )
    source.add_argument("--scenario-file", metavar="FILE", help="scenario YAML file")
    simulate.add_argument(
        "--autoscaler",
        choices=["hpa", "cachescale", "both"],  # sim.simulate.AUTOSCALER_CHOICES (tested)
        default="hpa",
        help="hpa: the scenario's autoscaler alone (an HPA, or KEDA's for a scenario with "
        "keda:); cachescale: the same one with cachescale reshaping its envelope and "
        "--max-num-seqs; both: the two runs side by side (same requests)",
    )
    simulate.add_argument(
        "--seed", type=seed_flag, metavar="N", help="override the scenario's seed (0 or more)"
    )
    simulate.add_argument(
        "--duration",
        type=duration_flag,
        metavar="D",
        help="override the duration, e.g. 30m, 2h (at most 168h)",
    )
    simulate.add_argument(
        "--out", metavar="DIR", help="write CSV time series and PNG plots into this folder"
    )
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.set_defaults(handler=_cmd_simulate)

    from cachescale.commands.emulate import add_parser as add_emulate_parser

    add_emulate_parser(commands)

    from cachescale.commands.signals import add_parser as add_signals_parser

    add_signals_parser(commands)

    from cachescale.commands.groups import add_parser as add_groups_parser

    add_groups_parser(commands, read_policy_files)

    from cachescale.commands.report import add_parser as add_report_parser
    from cachescale.commands.report_policy import read_policy

    add_report_parser(commands, read_policy)

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
