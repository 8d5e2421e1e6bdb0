"""The exit codes of every ``cachescale`` subcommand, in one place.

They are part of the command-line interface: scripts and CI branch on them, so each value
is fixed and shared by the CLI, ``cachescale emulate``, ``cachescale signals`` and
``cachescale run``. It lives in the API layer because every layer may import it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """A subcommand's exit status."""

    OK = 0
    """Success; also when the reader of stdout stopped early (``| head -1``)."""
    INVALID = 1
    """Invalid input: a bad policy or scenario, an unreadable file, a port already taken."""
    USAGE = 2
    """A usage error, reported by argparse itself (its own convention)."""
    PROMETHEUS_UNAVAILABLE = 3
    """``cachescale signals`` could not read Prometheus: distinct from 1 and 2 so scripts
    can tell "Prometheus down" apart."""
