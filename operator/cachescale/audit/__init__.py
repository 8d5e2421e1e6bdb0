"""``cachescale audit``: the pre-merge prefix-cache regression gate.

It replays a prompt corpus through the simulator's vLLM block hashing and block pool
(``sim/hashing.py``, ``sim/replica.py``), reports hit rates and recomputed tokens, says in
words why prompts miss, and compares a candidate's result against a baseline's. Offline:
no engine, no network, nothing beyond the core install. Live mode (``live``) sends the
same corpus to a running engine and reads its prefix-cache counters instead, with the
standard library's HTTP client. The subcommand's flags, files and exit codes are
``cachescale.commands.audit``'s.
"""
