"""What ``cachescale run`` and the running operator share before kopf starts: the name
messages carry, the peering priorities a replica may take, and the one-line refusal.

It imports nothing from the ``operator`` extra, so ``cachescale run`` can say what is
missing when that extra is not installed.
"""

from __future__ import annotations

import sys

from cachescale.exit_codes import ExitCode

PROG = "cachescale run"
PRIORITIES = (1, 32_767)
"""The peering priorities a replica may have (``--priority``; random when not given)."""


def refused(message: str) -> int:
    """Say what is wrong in one line, as ``cachescale run``, and return exit code 1."""
    print(f"{PROG}: {message}", file=sys.stderr)
    return ExitCode.INVALID
