"""The HPA's own metric: what it reads, and the replicas it asks for.

cachescale reshapes the envelope the HPA scales inside; the HPA still scales on its own
metric. Several rules depend on which metric that is (the running batch reads the load on
each pod; the queue, KEDA's usual trigger, reads only what waits) and on what it asks for
at a target, ``ceil(ready × average / target)``: the SLO guard, its floors, the batch
ceiling's bound on the target, and the messages that say what the HPA wanted.
"""

from __future__ import annotations

import math

from cachescale.snapshot import Snapshot


def on_running_batch(snapshot: Snapshot) -> bool:
    """The HPA scales on the requests each pod runs (vLLM's ``num_requests_running``)."""
    return "running" in (snapshot.workload.hpa.metric_name or "")


def hpa_wanted_replicas(snapshot: Snapshot, target: float | None) -> int | None:
    """The HPA's own replica count for its metric at ``target`` (ceil(ready × avg / target));
    None on a metric that is neither the running batch nor the queue, an unknown average,
    or no target."""
    name = snapshot.workload.hpa.metric_name or ""
    signals = snapshot.signals
    per_pod = (
        signals.running_requests_per_pod
        if on_running_batch(snapshot)
        else signals.waiting_requests_per_pod
        if "waiting" in name or "queue" in name
        else None
    )
    if per_pod is None or per_pod.value is None or not target:
        return None
    return math.ceil(snapshot.workload.ready_replicas * per_pod.value / target - 1e-9)
