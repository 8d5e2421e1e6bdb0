"""``python -m cachescale.emulator [FLAGS]``: ``cachescale emulate`` without the full CLI.

Tests and scripts start the emulator as a subprocess; this entry point builds no parser but
the subcommand's own (``commands/emulate.py``), and takes the same flags as ``cachescale
emulate`` and exits as it does: Ctrl-C is 130 here too, also before the emulator serves.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from cachescale.commands.emulate import PROG, add_parser
from cachescale.exit_codes import ExitCode


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` as ``emulate``'s flags and run it; return the exit code."""
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_parser(subparsers)
    subparsers.choices["emulate"].prog = "python -m cachescale.emulator"  # no "emulate" to type
    args = parser.parse_args(["emulate", *(sys.argv[1:] if argv is None else argv)])
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:  # Ctrl-C before the emulator's own handler is in place
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
