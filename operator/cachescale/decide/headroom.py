"""Room for rising demand: how far over the current replicas maxReplicas stays open.

The budget's allowance reads demand over a window, so on a rising rate it trails what the
HPA's own metric already sees, and a cap at it makes the HPA late to every step; so do the
windowed gauges cachescale reads, so no sign of the rise can be waited for. While each
request costs what it did, a rise in the HPA's metric can only be demand, and the budget
has nothing to hold: the envelope keeps room over the current replicas instead
(``docs/decisions.md``, "Room for rising demand").
"""

from __future__ import annotations

import math

from cachescale.api.spec import CacheScalingPolicySpec, CollapseAction
from cachescale.decide.hpa_metric import hpa_wanted_replicas
from cachescale.decide.thresholds import DEMAND_HEADROOM_SHARE
from cachescale.snapshot import Snapshot


def demand_headroom(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, *, steady_cost: bool
) -> int | None:
    """The maxReplicas that leaves the HPA room to follow rising demand, or None where the
    budget should bind.

    With ``steady_cost`` (no collapse, requests no dearer, the cost per request within the
    budget) and the cost per request known: ``DEMAND_HEADROOM_SHARE`` (at least one pod)
    over the current replicas, and at least what the HPA's metric asks for
    (``hpa_wanted_replicas``), so the HPA's next step is never held for an evaluation. The
    HPA adds no pod its metric does not ask for, so the fleet is never larger than the HPA
    alone's. ``onCollapse: CapAtBudget`` keeps the budget binding: cost over latency is the
    user's choice. An unknown cost: None (a rise is not known to be demand)."""
    if spec.cache.on_collapse is CollapseAction.CAP_AT_BUDGET or not steady_cost:
        return None
    if snapshot.signals.gpu_seconds_per_1k_requests.value is None:
        return None
    current = snapshot.workload.replicas
    room = current + max(1, math.ceil(DEMAND_HEADROOM_SHARE * current - 1e-9))
    asked = hpa_wanted_replicas(snapshot, snapshot.workload.hpa.target_average_value)
    return max(room, asked or 0)
