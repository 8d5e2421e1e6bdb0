"""The checks: each measurement a diagnosis is named from, written once.

Several diagnoses can hold at once (a collapse usually puts the SLO at risk too); each
comes with its evidence in words and numbers (``Finding``), and ``PRECEDENCE`` picks the
one that leads the state shown by ``kubectl get`` (``docs/decisions.md``, "Diagnoses").
``diagnosis.py`` runs these checks once per evaluation and chains them into findings:

- a *collapse* is the warm-pod token hit rate under ``threshold`` (a relative and an
  absolute drop from the baseline, both required) for ``collapseWindows`` consecutive
  evaluations, without the signature of eviction pressure. Pods younger than
  ``podWarmupSeconds`` never count: a cold pod is expected to miss.
- *eviction pressure* is preemptions (≥ 1 per 100 requests) or a full KV pool (≥ 95%)
  while the running batch is near or above the cache-friendly ceiling B_max.
- the collapse's clearing threshold sits halfway back to the baseline, so a hit rate
  hovering at the threshold cannot raise and clear the alert on alternate evaluations.
- the budget's allowance (``budget_replicas``) is the most replicas the GPU-s/1k budget
  pays for at the demand, never derived from an unknown or zero request rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec, CacheSpec
from cachescale.capacity import (
    GIB,
    cache_friendly_batch_ceiling,
    free_kv_bytes,
    kv_bytes_per_token,
)
from cachescale.decide import words
from cachescale.decide.demand import SERVED_ONLY, demand
from cachescale.decide.learned import LearnedBaseline, LearnedState
from cachescale.decide.thresholds import (
    BATCH_NEAR_CEILING,
    FLAT_DEMAND,
    KV_USAGE_FULL,
    PREEMPTIONS_PER_REQUEST_PRESSURE,
    PREFILL_UP_FACTOR,
    QUEUED_PER_POD,
)
from cachescale.snapshot import Measured, Snapshot

PRECEDENCE = tuple(Diagnosis)
"""Which diagnosis leads when several hold: ``Diagnosis``'s declaration order. Missing
data first (nothing else can be trusted), then the cache failures this operator exists
for, then the SLO and the budget, then the expected or benign states."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis and the evidence for it, in words a human can act on."""

    diagnosis: Diagnosis
    evidence: str


@dataclass(frozen=True, slots=True)
class CollapseCheck:
    """The warm-pod hit rate against the baseline's collapse and clearing thresholds."""

    warm_hit_rate: Measured
    warm_pods: int
    baseline: float | None
    threshold: float | None
    clear_threshold: float | None

    @property
    def below(self) -> bool:
        """Under the collapse threshold (False when anything is unknown)."""
        value = self.warm_hit_rate.value
        return value is not None and self.threshold is not None and value < self.threshold

    @property
    def recovered(self) -> bool:
        """Back above the clearing threshold (False when anything is unknown)."""
        value = self.warm_hit_rate.value
        return (
            value is not None and self.clear_threshold is not None and value >= self.clear_threshold
        )


def collapse_thresholds(cache: CacheSpec, baseline: float) -> tuple[float, float]:
    """``(collapse, clear)`` hit-rate thresholds for a baseline hit rate.

    Both drops must be exceeded, so the collapse threshold is the lower of the two.
    """
    threshold = min(
        baseline * (1 - cache.collapse_relative_drop), baseline - cache.collapse_absolute_drop
    )
    return threshold, (threshold + baseline) / 2


def check_collapse(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, learned: LearnedState
) -> CollapseCheck:
    """Compare the warm pods' pooled hit rate with the learned baseline."""
    warmup = float(spec.cache.pod_warmup_seconds)
    warm = snapshot.signals.warm_token_hit_rate(warmup)
    baseline = learned.baseline.token_hit_rate
    threshold = clear = None
    if baseline is not None:
        threshold, clear = collapse_thresholds(spec.cache, baseline)
    return CollapseCheck(
        warm_hit_rate=warm,
        warm_pods=snapshot.workload.warm_replicas(warmup),
        baseline=baseline,
        threshold=threshold,
        clear_threshold=clear,
    )


def batch_ceiling(spec: CacheScalingPolicySpec, snapshot: Snapshot) -> int | None:
    """B_max from the spec's model and GPU shape and the observed context length."""
    batching = spec.batching
    context = snapshot.signals.context_tokens_per_request.value
    if batching.model is None or batching.gpu is None or not context:
        return None
    model, gpu = batching.model, batching.gpu
    free = free_kv_bytes(
        max(1, _bytes(gpu.memory_gib)), gpu.gpu_memory_utilization, _bytes(model.weights_gib)
    )
    per_token = kv_bytes_per_token(
        model.layers, model.kv_heads, model.head_dim, model.kv_dtype_bytes
    )
    return cache_friendly_batch_ceiling(
        free, _bytes(batching.cache_reserve_gib), context, per_token
    )


def _bytes(gib: float) -> int:
    """A spec's GiB (at most ``api.spec.MAX_GIB``) as whole bytes; the smallest floats the
    spec admits round to 0 (a GPU's memory is then taken as 1 byte: positive, as the KV
    arithmetic requires)."""
    return int(gib * GIB)


@dataclass(frozen=True, slots=True)
class EvictionCheck:
    """Preemptions and KV usage against the batch ceiling."""

    held: bool
    evidence: str


def check_eviction(snapshot: Snapshot, ceiling: int | None) -> EvictionCheck:
    """Pressure = (preemptions ≥ 1/100 requests or KV ≥ 95%) with the batch near the
    ceiling (B_max when known, else the engine's own ``--max-num-seqs``)."""
    signals = snapshot.signals
    preemptions = signals.preemptions_per_second.value
    rps = signals.requests_per_second.value
    kv = signals.kv_cache_usage_ratio.value
    running = signals.running_requests_per_pod.value
    limit = ceiling if ceiling is not None else snapshot.workload.max_num_seqs
    preempting = (
        preemptions is not None
        and rps is not None
        and rps > 0
        and preemptions / rps >= PREEMPTIONS_PER_REQUEST_PRESSURE
    )
    full = kv is not None and kv >= KV_USAGE_FULL
    near = running is not None and limit is not None and running >= BATCH_NEAR_CEILING * limit
    if not ((preempting or full) and near):
        return EvictionCheck(False, "")
    assert running is not None
    assert limit is not None
    parts = []
    if preempting:
        assert preemptions is not None
        assert rps is not None
        parts.append(f"{preemptions:.2g} preemptions/s ({preemptions / rps:.1%} of requests)")
    if full:
        assert kv is not None
        parts.append(f"KV cache {kv:.0%} full")
    name = "cache-friendly ceiling B_max" if ceiling is not None else "--max-num-seqs"
    parts.append(f"running batch {running:.1f}/pod against a {name} of {limit}")
    return EvictionCheck(True, ", ".join(parts))


def budget_replicas(
    spec: CacheScalingPolicySpec, snapshot: Snapshot, requests_got_dearer: bool = False
) -> int | None:
    """Most replicas the GPU-s/1k budget allows at the demand (``decide.demand``).

    ``budget × req/s / (1000 × GPUs per pod)``, floored; None when the request rate is
    unknown or zero (no cost per request can be computed, so no cap is derived from it).
    With the arrival rate known, that is the whole rule: arrivals are the demand even
    while requests queue.

    Without it, while requests queue (``QUEUED_PER_POD`` or more waiting per pod) the
    finished-request rate is what the fleet manages to serve, not the demand, so the
    formula would cap the fleet at what it already serves. Two cases: the cost per served
    request is over budget (every request got more expensive, e.g. a collapse): the cap
    stays at the current replicas — adding replicas cannot make requests cheaper, and
    removing saturated ones would only serve fewer. Within budget (demand grew at a steady cost):
    the cap is the budget's ``maxReplicas`` — the HPA scales for the demand inside the
    budget's range (``DemandGrowth`` in ``docs/decisions.md``). ``requests_got_dearer``
    (the cache fell, or prefill per request rose) overrules a windowed cost that has not
    caught up yet: then the fleet is held at its replicas too.
    """
    signals = snapshot.signals
    need = demand(snapshot)
    rps = need.per_second
    gpus = snapshot.workload.gpus_per_pod
    if rps is None or rps <= 0 or gpus <= 0:
        return None
    budget = spec.budget.gpu_seconds_per_1k_requests
    cap = math.floor(budget * rps / (1000 * gpus) + 1e-9)
    if need.arrivals:
        return cap
    waiting = signals.waiting_requests_per_pod.value
    if waiting is None or waiting >= QUEUED_PER_POD:
        cost = signals.gpu_seconds_per_1k_requests.value
        if cost is not None and cost <= budget and not requests_got_dearer:
            return spec.budget.max_replicas
        cap = max(cap, snapshot.workload.replicas)
    return cap


def collapse_evidence(
    check: CollapseCheck, snapshot: Snapshot, learned: LearnedState, windows: int
) -> str:
    """The collapse message's evidence: hit rate, demand, prefill, preemptions, cause."""
    baseline = learned.baseline
    signals = snapshot.signals
    assert check.warm_hit_rate.value is not None
    assert check.baseline is not None
    evidence = learned.collapse_evidence
    span = (
        f"over {windows} windows"
        if windows
        else f"since {evidence.started_at:%H:%M}"
        if evidence is not None
        else "since the collapse"
    )
    text = (
        f"token hit rate {words.ratio(check.baseline)} → {words.ratio(check.warm_hit_rate.value)}"
        f" {span} on {check.warm_pods} warm pods"
    )
    clauses = [_demand_clause(snapshot, learned, baseline)]
    prefill = signals.prefill_tokens_per_request.value
    if prefill is not None and baseline.prefill_tokens_per_request is not None:
        verb = "rose" if prefill > baseline.prefill_tokens_per_request else "went"
        clauses.append(
            f"prefill tokens per request {verb} {words.tokens(baseline.prefill_tokens_per_request)}"
            f" → {words.tokens(prefill)}"
        )
    preemptions = signals.preemptions_per_second.value
    if preemptions is not None:
        clauses.append(f"preemptions stayed at {preemptions:.2g}/s")
    return text + " while " + " and ".join(c for c in clauses if c)


def _demand_clause(snapshot: Snapshot, learned: LearnedState, baseline: LearnedBaseline) -> str:
    evidence = learned.collapse_evidence
    need = demand(snapshot)
    rps = need.per_second
    if rps is None:
        return ""
    low = high = rps
    if evidence is not None and evidence.requests_per_second_min is not None:
        low = min(low, evidence.requests_per_second_min)
        high = max(high, evidence.requests_per_second_max or rps)
    base = baseline.requests_per_second
    served = "" if need.arrivals else SERVED_ONLY
    if base is not None and base > 0 and abs(rps / base - 1) > FLAT_DEMAND:
        return f"req/s moved {words.rate(base)} → {words.rate(rps)}{served}"
    return f"req/s stayed {words.spread(low, high)}{served}"


def prefill_grew(snapshot: Snapshot, baseline: LearnedBaseline, factor: float) -> bool:
    """Prefill tokens per request are at least ``factor`` × the baseline's (False when
    either is unknown)."""
    prefill = snapshot.signals.prefill_tokens_per_request.value
    base = baseline.prefill_tokens_per_request
    return prefill is not None and base is not None and prefill >= factor * base


def likely_cause(snapshot: Snapshot, baseline: LearnedBaseline) -> str:
    """What to check, named from the evidence (prefill up with flat demand: the prompt)."""
    if prefill_grew(snapshot, baseline, PREFILL_UP_FACTOR):
        return (
            "the prompts' shared prefixes changed: check recent prompt layout, chunking, "
            "retrieval or template changes (anything that moves variable text ahead of "
            "shared text)"
        )
    return (
        "requests stopped sharing prefixes without more prefill per request: check routing "
        "(a router that no longer keeps sessions on their pod) and cache_salt settings"
    )
