"""The gather layer's Prometheus half: engine signals over a window, as a frozen snapshot.

I/O lives here (HTTP to Prometheus); the result is a ``cachescale.snapshot.EngineSignals``
that the pure decision layer consumes. The flow of one evaluation, module by module:

- ``selector`` validates and escapes a policy's label matchers and decides the scope a
  batch reads under (``demand_scope`` confines a policy's own demand query to it);
- ``engine_series`` names each engine's series, ``detection`` tells the metric generation
  apart, ``promql`` builds the query text;
- ``prometheus`` talks to the server (``prometheus_errors``: how that fails; ``bounded``,
  ``deadline``, ``egress``: the limits on size, time and destination);
- ``signals`` turns results into known-or-unknown signals (``series_reader``,
  ``quantiles``, ``pod_signals``), and ``reading`` does the round trips of one policy;
- ``grouping`` plans which policies share one request, and ``grouped`` reads them so;
- ``report`` reads the same signals window by window over Prometheus' history.

The subcommands over this layer (``cachescale signals``, ``groups``, ``report``) live in
``cachescale.commands``.
"""
