"""Invariants of ``decide`` over random evaluation sequences (hypothesis).

Each example drives a closed loop through up to 10 runs of 1–14 identical evaluations
(conditions persist, as they do in a fleet): random signals (any of them possibly
unknown), random replica counts inside the envelope the previous decision set, and the
batch ceiling the previous decision chose. Whatever happens:

- the envelope stays inside ``budget.minReplicas..maxReplicas``;
- maxReplicas is never raised above what the budget allows at the observed rate, nothing
  is lowered while data is missing, and the only raise then is back to the original
  envelope (fail open, see ``decide.envelope.open_envelope``);
- maxReplicas never reverses direction inside the stabilization window, except for a
  confirmed collapse hold and its release (immediate by design, see ``decide.envelope``),
  failing open on missing data and a raise to what the SLO needs;
- ``--max-num-seqs`` stays within the policy's bounds, moves at most 25% per change and
  at most once per cooldown;
- every number a message quotes (the applied cap, the budget's allowance, the demand, what
  the SLO needs, the cost over baseline) is the decision's own field;
- the memory survives a JSON round trip unchanged (what a restart does to it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachescale.api.reasons import Hold
from cachescale.api.status import ConditionType
from cachescale.decide import Decision, LearnedState, decide, words
from cachescale.decide.learned import LearnedBaseline
from cachescale.decide.thresholds import STABILIZATION_SECONDS
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import BATCHING, INTERVAL, T0, learned, signals, spec, workload

POLICY = spec(
    budget={"gpuSecondsPer1kRequests": 900, "minReplicas": 3, "maxReplicas": 30},
    batching={**BATCHING, "cooldown": "10m"},
)


@dataclass(frozen=True)
class Step:
    hit: float | None
    rps: float | None
    arrivals: float | None
    p95: float | None
    cost: float | None
    waiting: float
    running: float
    preemptions: float
    replicas_share: float
    cold: int


steps = st.builds(
    Step,
    hit=st.one_of(st.none(), st.sampled_from([0.04, 0.3, 0.5, 0.85]), st.floats(0, 1)),
    rps=st.one_of(st.none(), st.floats(0.0, 80.0)),
    arrivals=st.one_of(st.none(), st.floats(0.0, 80.0)),
    p95=st.one_of(st.none(), st.floats(0.01, 5.0)),
    cost=st.one_of(st.none(), st.floats(100.0, 3000.0)),
    waiting=st.floats(0.0, 6.0),
    running=st.floats(0.0, 130.0),
    preemptions=st.floats(0.0, 2.0),
    replicas_share=st.floats(0.0, 1.0),
    cold=st.integers(0, 3),
)


def snapshot_for(step: Step, previous: Decision | None, seqs: int) -> Snapshot:
    low, high, target = (
        (previous.envelope.min_replicas, previous.envelope.max_replicas, 24.0)
        if previous is not None
        else (3, 30, 24.0)
    )
    replicas = low + round(step.replicas_share * (high - low))
    engine = signals(
        hit=step.hit,
        warm_pods=max(0, replicas - step.cold),
        cold_pods=min(step.cold, replicas),
        requests_per_second=step.rps,
        arrivals_per_second=step.arrivals,
        ttft_p95_seconds=step.p95,
        gpu_seconds_per_1k_requests=step.cost,
        waiting_requests_per_pod=step.waiting,
        running_requests_per_pod=step.running,
        preemptions_per_second=step.preemptions,
    )
    fleet = workload(
        replicas=replicas,
        cold_pods=min(step.cold, replicas),
        hpa=(low, high, target),
        max_num_seqs=seqs,
    )
    return Snapshot(engine, fleet)


def frozen(snapshot: Snapshot) -> bool:
    values = snapshot.signals
    return not (
        values.requests_per_second.is_known
        and values.ttft_p95_seconds.is_known
        and values.token_hit_rate_local.is_known
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs=st.lists(st.tuples(steps, st.integers(1, 14)), min_size=1, max_size=10),
    start=st.sampled_from([learned(), LearnedState(), learned(baseline=LearnedBaseline())]),
    seqs=st.sampled_from([16, 48, 128, 256]),
)
def test_invariants_hold_on_any_sequence(
    runs: list[tuple[Step, int]], start: LearnedState, seqs: int
) -> None:
    sequence = [step for step, repeat in runs for _ in range(repeat)]
    memory, previous = start, None
    max_changes: list[tuple[float, int, bool]] = []
    seq_changes: list[float] = []
    for index, step in enumerate(sequence):
        now = T0 + index * INTERVAL
        snapshot = snapshot_for(step, previous, seqs)
        current = snapshot.workload.hpa
        decision = decide(POLICY, snapshot, memory, now)
        envelope = decision.envelope
        t = index * INTERVAL.total_seconds()

        assert 3 <= envelope.min_replicas <= envelope.max_replicas <= 30
        if frozen(snapshot):
            original = memory.original_envelope
            reopened = max(current.max_replicas, original.max_replicas if original else 0)
            assert current.max_replicas <= envelope.max_replicas <= min(30, reopened) or (
                envelope.max_replicas == current.max_replicas
            )
            assert envelope.min_replicas == current.min_replicas
            assert envelope.target_average_value == current.target_average_value
            assert decision.max_num_seqs == seqs
        elif decision.reason.startswith("WaitingFor"):
            assert envelope.max_replicas == current.max_replicas
            assert envelope.min_replicas == current.min_replicas
            assert decision.max_num_seqs == seqs
        elif envelope.max_replicas > current.max_replicas:
            # Above the budget's allowance only for what the SLO, a backlog's drain or the
            # demand alone needs, or room for rising demand at a steady cost.
            cap = decision.budget_max_replicas
            assert cap is not None
            floors = (
                decision.slo_needed_replicas or 0,
                decision.drain_replicas or 0,
                decision.demand_replicas or 0,
                decision.headroom_replicas or 0,
            )
            assert envelope.max_replicas <= max(3, cap, *floors)
        if envelope.max_replicas != current.max_replicas:
            direction = 1 if envelope.max_replicas > current.max_replicas else -1
            held = any(
                c.type is ConditionType.SCALING_HELD and c.reason == Hold.COLLAPSE
                for c in decision.conditions
            )
            if max_changes:
                last_t, last_direction, last_held = max_changes[-1]
                if direction == -last_direction and t - last_t < STABILIZATION_SECONDS:
                    # Only a collapse hold (down) and its release (up), failing open on
                    # missing data (up), a raise to what the SLO or a backlog's drain
                    # needs, or one with room for rising demand may reverse quickly.
                    opened = frozen(snapshot) and direction == 1
                    for_slo = direction == 1 and envelope.max_replicas in (
                        min(30, decision.slo_needed_replicas or 0),
                        decision.drain_replicas,
                    )
                    for_demand = direction == 1 and decision.headroom_replicas is not None
                    quick = opened or for_slo or for_demand
                    assert (held and direction == -1) or (last_held and direction == 1) or quick, (
                        max_changes,
                        t,
                        direction,
                    )
            max_changes.append((t, direction, held))

        assert decision.max_num_seqs is not None
        assert 16 <= decision.max_num_seqs <= 256 or decision.max_num_seqs == seqs
        if decision.max_num_seqs != seqs:
            if 16 <= seqs <= 256:
                assert 0.75 * seqs <= decision.max_num_seqs <= 1.25 * seqs
            if seq_changes:
                assert t - seq_changes[-1] >= POLICY.batching.cooldown_seconds
            seq_changes.append(t)
            seqs = decision.max_num_seqs

        assert_quotes_are_the_decision(decision, frozen(snapshot))

        restored = LearnedState.model_validate_json(decision.memory.model_dump_json())
        assert restored == decision.memory
        memory, previous = restored, decision


def assert_quotes_are_the_decision(decision: Decision, missing: bool) -> None:
    """Every number a message quotes is the number the decision used: the applied cap,
    the budget's allowance, the demand, what the SLO and a backlog's drain need and the
    cost over baseline
    (in the decision's message and the alerts it raised; a kept alert may still carry
    the words of the evaluation that last refreshed it)."""
    texts = [decision.message, *(change.message for change in decision.raised)]
    envelope = decision.envelope
    if missing:
        assert f"HPA may scale up to {envelope.max_replicas} " in decision.message
        return
    if not decision.reason.startswith("WaitingFor"):
        assert f"HPA envelope {envelope.min_replicas}..{envelope.max_replicas}" in (
            decision.message
        )
    for text in texts:
        for quoted in re.findall(r"budget allows (\d+)", text):
            assert int(quoted) == decision.budget_max_replicas, text
        for quoted in re.findall(r"the SLO needs (\d+)", text):
            assert int(quoted) == decision.slo_needed_replicas, text
        for quoted in re.findall(r"; (\d+) to drain ", text):
            assert int(quoted) == decision.drain_replicas, text
        for quoted in re.findall(r"minReplicas (\d+), ", text):
            assert int(quoted) == envelope.min_replicas, text
        for quoted in re.findall(r"req/s (?:moved|\d+(?:\.\d+)?) → (\S+)", text):
            assert decision.demand is not None
            assert decision.demand.per_second is not None
            assert quoted == words.rate(decision.demand.per_second), text
        if "over the baseline" in text:
            assert decision.extra_cost is not None
            assert decision.extra_cost.words() in text, text
        if "(served; arrivals unknown)" in text and text is decision.message:
            assert decision.demand is not None
            assert not decision.demand.arrivals
