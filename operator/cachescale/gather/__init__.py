"""The gather layer's Prometheus half: engine signals over a window, as a frozen snapshot.

I/O lives here (HTTP to Prometheus); the result is a ``cachescale.snapshot.EngineSignals``
that the pure decision layer consumes. ``selector`` validates and escapes a policy's label
matchers, ``promql`` builds the query text, ``prometheus`` talks to the server,
``signals`` turns results into known-or-unknown signals, ``grouped`` reads many policies
with one request per group (every signal's query in it), and ``command`` is
``cachescale signals``.
"""
