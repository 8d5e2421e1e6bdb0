"""Tests of the command line: a file per subcommand module of ``cachescale.commands``
(``cachescale audit``'s flags and exit codes are tested beside the audit, in ``tests/audit``)."""
