"""``cachescale emulate``: the simulator in real time, behind real ``/metrics`` endpoints.

The operator sees a fleet only through Prometheus. The emulator gives it (and its tests,
and a curious user) a fleet to look at without GPUs: it runs a simulator scenario on the
wall clock, optionally accelerated, and serves every simulated replica's metrics on its
own loopback port in the engine's real exposition format (vLLM or SGLang names, labels and
buckets). Pods come and go as the simulated fleet scales; a Prometheus ``file_sd`` file
follows them, with the ``pod``/``namespace`` labels a cluster's scrape config would add.
A ground-truth file records what the simulator knows, so what Prometheus reports can be
checked against it.

Each pod also answers a minimal ``POST /v1/completions`` through its simulated engine, so
a client (``cachescale audit run --endpoint``) can watch its own requests hit the cache.

Modules: ``runtime`` (the simulation behind a lock, pods' endpoints, the real-time loop),
``endpoints`` (one HTTP server per pod), ``completions`` (the completions handler),
``targets`` (file_sd and scrape config), ``truth`` (the ground-truth ledger), ``files``
(atomic rewrites), ``pods_of`` (real pods' names for the replicas, to stand in for a
Deployment). The subcommand is ``cachescale.commands.emulate``, which
``python -m cachescale.emulator`` runs alone.
"""
