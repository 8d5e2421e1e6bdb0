"""The decision's tuning thresholds, each with the reason for its value.

Every number the decision compares a signal against, and that a policy does not set, lives
here, so tuning one means reading one file. ``docs/decisions.md`` explains the rules that
use them; the policy's own settings (``collapseWindows``, ``podWarmupSeconds``, the SLO and
the budget) come from the spec instead.
"""

from __future__ import annotations

# --- diagnosis --------------------------------------------------------------------------

PREEMPTIONS_PER_REQUEST_PRESSURE = 0.01
"""Preemptions per finished request that count as sustained pressure (1 in 100)."""
KV_USAGE_FULL = 0.95
"""KV usage at which the pool is full: every admission evicts a cached block."""
BATCH_NEAR_CEILING = 0.9
"""A running batch at this share of the ceiling counts as near it."""
LOW_HIT_RATE = 0.2
"""Below this token hit rate the cache is not worth protecting (docs/decisions.md,
"``--max-num-seqs``": the batch ceiling is raised to buy throughput instead)."""
DEMAND_GROWTH_FACTOR = 1.2
"""Request rate this far above baseline is demand growth..."""
COST_STEADY_FACTOR = 1.15
"""...when the cost per request stays within this factor of its baseline."""
FLAT_DEMAND = 0.2
"""A request rate within ±20% of baseline is called flat in a collapse message."""
QUEUED_PER_POD = 1.0
"""Mean waiting requests per pod at which the fleet counts as saturated."""
PREFILL_UP_FACTOR = 1.5
"""Prefill tokens per request this far above baseline point at a prompt change."""
DEARER_PREFILL_FACTOR = 1.25
"""Prefill tokens per request this far above baseline: requests got dearer, so a queue
is not read as demand (lower than the collapse message's PREFILL_UP_FACTOR: it must
react within a window, before the windowed cost shows it)."""
DEGRADED_HIT_DROP = 0.1
"""A warm hit rate held more than this many points under its baseline (and not under the
collapse threshold) is a degraded cache when it costs enough (``CacheDegraded``): 0.84 →
0.74 is a tenth of the lookups recomputed; a healthy warm rate stays within a few points
of its baseline (``AT_BASELINE_SHARE``)."""
DEGRADED_COST_SHARE = 0.1
"""...and costs at least this share of the baseline GPU-s per 1k requests over it (a
tenth: smaller drifts are noise in the windowed cost and not worth a page)."""
DEGRADED_CLEAR_SHARE = 0.5
"""A raised ``CacheDegraded`` stays while the warm rate is more than this share of
``DEGRADED_HIT_DROP`` under the baseline (halfway back, as a collapse clears), so a rate
hovering at the raise level cannot raise and clear on alternate evaluations."""
DILUTION_WINDOWS = 2
"""A pod that became ready within ``podWarmupSeconds`` plus this many metrics windows has
joined the fleet recently enough to explain a lower hit rate (``CacheDiluted``): its
cache fills during the warm-up, its windowed rate covers warm time only one window
later, and the baseline is re-learned for the grown fleet within the next window."""

# --- alerts and memory ------------------------------------------------------------------

SHORT_GAP_SHARE = 0.5
"""Data missing for at most this share of ``metrics.window`` (counted from the last
evaluation with data to the first one with data again) does not restart the full-window
wait: the window still holds at least half its span of samples, and a windowed rate or
mean over them reads the same traffic. One timed-out read is such a gap, and Prometheus
kept the samples meanwhile; a longer outage waits a whole window as before."""

READ_FAILURES_TO_FREEZE = 2
"""Failed reads in a row (Prometheus unreachable, timed out, or an unusable answer)
before an evaluation freezes on them and raises ``MetricsUnavailable``; the first ends
the evaluation with nothing decided, changed or written, and the read is retried at the
next interval (``engine.read_retried``), as KEDA's ``fallback.failureThreshold``. One
slow answer is not an outage, and at thousands of policies an alert raised and cleared
for each one is a status write and two Events apiece, which load the API server and the
operator while Prometheus catches up. The price: an outage is named one interval later,
and for that interval the envelope stays as the last evaluation set it."""

RECOVERY_EVALUATIONS = 2
"""Evaluations above the clearing threshold before a collapse alert clears."""
AT_BASELINE_SHARE = 0.9
"""A warm hit rate at 90% of baseline or more still marks the pre-collapse replica level."""
TREND_POINTS = 0.05
"""The hit-rate trend of an active collapse (``decide.healing``): *recovering* once the
warm rate is this many points above its lowest since the onset, *falling* while it is
this many below where it was ``TREND_SECONDS`` ago (or at the onset, for a younger
collapse), else *flat*. Five points is a tenth of the smallest possible collapse (both
drops, 0.5 relative and 0.2 absolute, must be exceeded) and several times the
evaluation-to-evaluation wobble of a windowed rate on a steady fleet."""
TREND_SECONDS = 300.0
"""How far back *falling* looks: the default ``metrics.window``, so a windowed rate still
taking in a step change reads falling, and one that settled reads flat."""
BASELINE_TIME_CONSTANT_S = 3600.0
"""How fast the baseline follows a healthy workload: a one-hour exponential average (a
plain mean over the first hour). Slow on purpose: a hit rate that drifts down over tens
of minutes must not become the new normal before it crosses the collapse threshold."""

# --- the HPA envelope -------------------------------------------------------------------

DEMAND_HEADROOM_SHARE = 0.5
"""Room over the current replicas that maxReplicas keeps while requests cost what they did
(``headroom.demand_headroom``): the HPA's first step on a demand rise, before the
windowed allowance has seen it. A running-batch HPA asks at most ``max-num-seqs /
target`` (32 / 24, a third more) per step, and a step it is denied costs a pod start
(its next ask counts the pods still starting as idle): a quarter held back the first
step of a +50% rise."""
STABILIZATION_SECONDS = 300.0
"""Window for lowering maxReplicas and for reversing a change (the HPA's default)."""
TARGET_STEP = 0.8
"""The SLO guard lowers the HPA target by this factor per step (raising: its inverse)."""
TARGET_FLOOR = 0.5
"""The target never goes below half of the user's original."""
SLO_BREACH_EVALUATIONS = 2
"""Breaching evaluations before the SLO guard lowers the target."""
BATCH_TARGET_SHARE = 0.75
"""Most of the batch ceiling a running-requests HPA target may ask for (24 of 32)."""
SLO_NEEDED_UTILISATION = 0.85
"""The SLO-needed replicas serve the arrivals with the pods this busy at most (15%
headroom): ``ceil(ready × max(arrivals / served, 1) / SLO_NEEDED_UTILISATION)``."""
DRAIN_SECONDS = 600.0
"""While TTFT breaches, a backlog the fleet would take longer than this to drain at its
current surplus (served − arriving) lets maxReplicas rise above the SLO estimate to what
drains it in this time (``slo_guard.drain_max_replicas``). The estimate's 15% headroom alone drains
3,000 queued requests at 3 req/s, in 17 minutes, every one of them over the SLO."""
MIN_RELEASE_STEP = 0.1
"""After a breach, minReplicas raised for the SLO comes down by this share per evaluation
(10 steps of 30 s take 20 replicas to 7): gentler than at once, which lets the HPA drop to
what its metric read on the oversized fleet, and about as fast as its own 300 s
scale-down window."""
SLO_COMFORTABLE_SHARE = 0.7
"""TTFT p95 under this share of the SLO is comfortable (lets the target relax)."""
SCALE_DOWN_FLOOR_HOLD_SECONDS = 3600.0
"""How long minReplicas stays one above the count the HPA scaled down to before TTFT
breached the SLO (``slo_floors.scale_down_floor``), counted from the last breaching
evaluation; then it comes down in steps like any SLO floor, and a breach after the next
scale-down learns it again. Learned again within this time of its release, it is held
twice as long as the last time, up to ``SCALE_DOWN_FLOOR_MAX_HOLD_SECONDS``."""
SCALE_DOWN_FLOOR_MAX_HOLD_SECONDS = 4 * 3600.0
"""The longest hold of a floor learned again and again (60, 120, then 240 min): a
workload that keeps breaking the SLO at the same count is held there for hours, not
released into a breach every hour, and a floor still comes down within a few hours of
a workload that changed (demand falling for the night)."""

# --- --max-num-seqs ---------------------------------------------------------------------

MAX_STEP = 0.25
"""Largest relative change of the ceiling in one decision."""
LOW_HIT_SECONDS = 600.0
"""How long the hit rate must stay low before the ceiling is raised."""
DEPRESSED_HIT_SHARE = AT_BASELINE_SHARE
"""A warm hit rate under this share of its baseline is depressed: with the SLO breached
and the batch above B_max, the ceiling keeps stepping down toward B_max. The same line
as ``AT_BASELINE_SHARE``, so a rate is either at its baseline or depressed, never
neither. A 10% fall is material in cost: on a 0.85 baseline, 0.765 misses 0.235 of the
prompt tokens instead of 0.15, 57% more prefill per request."""
NEAR_B_MAX_SHARE = 1.1
"""A ceiling within this factor of B_max (10% above it) is close enough: the follow-through
rule takes no further step. B_max moves with the windowed context length by about as much
between evaluations, so a step closer would chase noise, and each step restarts every pod."""
STEP_COST_SHARE = 0.05
"""A step toward B_max did not pay, whatever the hit rate gained, when the GPU-seconds per
1k requests under the new ceiling (the mean over the evaluations since its pods warmed) is
more than this share above the same mean under the old: a smaller batch per pod (and the
HPA's batch target lowered with it) bought the hit rate at a price the users pay, and the
follow-through stops there. Cost per request is the rule's referee, not the hit rate alone:
what users pay decides (``docs/decisions.md``, "Precedence")."""
STEP_GAIN_POINTS = 0.02
"""A step toward B_max paid when the warm hit rate under the new ceiling, averaged over the
evaluations since its pods warmed, is at least this many points above the same mean under
the old ceiling (or eviction pressure under the old one stopped): the next step is then
taken. Two points are 2% of the prompt tokens no longer recomputed. Means, not readings: one
windowed reading of a few warm pods can move by ten points or more between evaluations
(``docs/design/batching-ceiling.md``)."""
