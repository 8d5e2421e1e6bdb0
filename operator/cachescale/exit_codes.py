"""The exit codes of every ``cachescale`` subcommand, in one place.

They are part of the command-line interface: scripts and CI branch on them, so each value
is fixed and shared by every subcommand (``cachescale.commands``) and by ``python -m
cachescale.emulator``. It sits in the lowest layer, beside the API, so any layer may name
one. The table is documented for users in README.md ("Exit codes"); a test runs every
subcommand against a matrix of bad inputs and checks each one lands in its row.

The line between 2 and 1: anything wrong with the command line itself, decidable without
opening a file or a connection, is a usage error (2); anything wrong with what the command
line points at (a file's contents, an output path, a port, a kubeconfig) is invalid input
(1).

``cachescale audit`` is a CI gate with its own contract: 0 pass, 1 regression
(:attr:`ExitCode.REGRESSION`, the same value as ``INVALID``), 2 usage *or* input error. A
CI step must tell "the change broke the cache" from "the audit could not run", so audit
reports a bad corpus or result file as 2, never as 1, and an engine it cannot reach in
live mode as 3 (:attr:`ExitCode.UNAVAILABLE`).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """A subcommand's exit status."""

    OK = 0
    """Success. A reader of stdout that stops early (``| head -1``) changes no code: the
    command's further output is dropped, it runs to its end and exits with the code it
    would have had (``validate bad.yaml good.yaml | head -1`` exits 1, so ``set -o
    pipefail`` sees it); a command that stops *because* its reader left (``emulate``)
    exits 0. A closed stdout (``>&-``) is /dev/null: the command's own code."""
    INVALID = 1
    """Invalid input: a bad policy or scenario file, an unreadable file, an ``--out`` that
    cannot be written, a stdout that cannot be written (``> /dev/full``; a command that
    already failed keeps its own code), a port already taken, an unusable kubeconfig."""
    REGRESSION = 1
    """``cachescale audit compare``: the candidate regressed the prefix cache (an alias of
    ``INVALID``; audit reports invalid input as ``USAGE``)."""
    USAGE = 2
    """A usage error: an unknown subcommand or flag, a missing flag, a malformed or
    out-of-range flag value (``--seed -1``, ``--duration soon``, a URL without a scheme,
    an unknown scenario name), or flags that need each other."""
    UNAVAILABLE = 3
    """What the command reads did not answer: Prometheus (``signals``, ``report``), the
    API server (``init``, ``report --around policy/NAME``), or the engine and its
    ``/metrics`` (``audit run --endpoint``). Distinct from 1 and 2 so scripts can tell "a
    service is down" from "my input is bad"."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (SIGINT) before finishing, as shells report it (128 + 2)."""
