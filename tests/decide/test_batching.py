"""The batch ceiling (``decide.batching``): ``--max-num-seqs`` lowered toward B_max under
eviction pressure or a breached SLO with a depressed cache, and onward while each step
pays, raised for throughput when the cache does not hit, once per cooldown, through
``decide`` and as a table of ``plan_max_num_seqs`` cases."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest

from cachescale.api.reasons import Action, Diagnosis
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.decide import LearnedState
from cachescale.decide.batching import BatchFacts, BatchPlan, plan_max_num_seqs, remember_change
from cachescale.decide.ceiling_step import CeilingStep, Mean
from cachescale.decide.follow_through import tally_step
from cachescale.decide.learned import LearnedBaseline, Streaks
from cachescale.snapshot import Snapshot
from tests.decide.decide_builders import (
    BATCHING,
    INTERVAL,
    T0,
    learned,
    run,
    signals,
    snapshot,
    spec,
    workload,
)


def pressured(seqs: int, running: float = 60.0) -> Snapshot:
    engine = signals(hit=0.3, preemptions_per_second=1.0, running_requests_per_pod=running)
    return snapshot(engine, workload(max_num_seqs=seqs))


def test_sustained_eviction_lowers_by_at_most_a_quarter() -> None:
    decisions = run(spec(batching=BATCHING), [pressured(128)] * 3)
    assert [d.max_num_seqs for d in decisions] == [128, 128, 96]
    assert decisions[-1].reason == Action.LOWERED_MAX_NUM_SEQS
    assert "--max-num-seqs 128 → 96" in decisions[-1].message


def test_never_below_b_max() -> None:
    decisions = run(spec(batching=BATCHING), [pressured(60)] * 3)
    assert decisions[-1].max_num_seqs == 50  # 25% would be 45; B_max is 50


def test_one_change_per_cooldown_even_across_a_restart() -> None:
    policy = spec(batching=BATCHING)
    first = run(policy, [pressured(128)] * 3)[-1]
    assert first.max_num_seqs == 96
    # The operator restarts: the memory comes back from its JSON form.
    restored = LearnedState.model_validate_json(first.memory.model_dump_json())
    later = run(policy, [pressured(96)] * 3, restored, start=T0 + 3 * INTERVAL)
    assert [d.max_num_seqs for d in later] == [96, 96, 96]
    assert "cooldown" in later[-1].notes[0]
    after = run(policy, [pressured(96)], later[-1].memory, start=T0 + timedelta(minutes=31))
    assert after[0].max_num_seqs == 72


def test_no_change_during_a_rollout() -> None:
    engine = signals(hit=0.3, preemptions_per_second=1.0, running_requests_per_pod=60)
    rolling = snapshot(engine, workload(max_num_seqs=128, rollout=True))
    decisions = run(spec(batching=BATCHING), [rolling] * 3)
    assert decisions[-1].max_num_seqs == 128
    assert decisions[-1].notes == ("a rollout is in progress",)


def test_a_cache_that_does_not_hit_buys_throughput() -> None:
    busy = snapshot(signals(hit=0.1, waiting_requests_per_pod=2.0), workload(max_num_seqs=32))
    memory = learned(baseline=LearnedBaseline(token_hit_rate=0.1, evaluations=100))
    decisions = run(spec(batching=BATCHING), [busy] * 21, memory)
    assert [d.max_num_seqs for d in decisions].index(40) == 19  # 20 evaluations = 10 min


@pytest.mark.parametrize(
    "engine",
    [signals(hit=0.25, waiting_requests_per_pod=2.0), signals(hit=0.1, running_requests_per_pod=5)],
)
def test_no_raise_when_the_cache_hits_or_the_batch_is_idle(engine: object) -> None:
    memory = learned(baseline=LearnedBaseline(token_hit_rate=0.1, evaluations=100))
    decisions = run(spec(batching=BATCHING), [snapshot(engine, workload())] * 25, memory)  # type: ignore[arg-type]
    assert {d.max_num_seqs for d in decisions} == {32}


def test_unmanaged_ceiling_is_never_changed_and_eviction_alerts_instead() -> None:
    decisions = run(spec(), [pressured(128, running=120)] * 3)
    assert {d.max_num_seqs for d in decisions} == {128}
    assert decisions[-1].alert_active(Diagnosis.EVICTION_PRESSURE)
    assert "not managed" in decisions[-1].alerts[-1].message


def test_out_of_bounds_ceiling_is_clamped() -> None:
    (decision,) = run(spec(batching=BATCHING), [snapshot(fleet=workload(max_num_seqs=512))])
    assert decision.max_num_seqs == 256
    assert decision.reason == Action.CLAMPED_MAX_NUM_SEQS


def slo_at_risk(seqs: int, hit: float = 0.6, **values: float | None) -> Snapshot:
    """TTFT p95 1.5 s against a 1 s SLO, no preemptions, the warm hit rate ``hit`` (the
    baseline is 0.85: 0.6 is depressed, not collapsed)."""
    engine = signals(hit=hit, ttft_p95_seconds=1.5, **values)
    return snapshot(engine, workload(max_num_seqs=seqs))


def test_a_breached_slo_with_a_depressed_cache_keeps_stepping_toward_b_max() -> None:
    decisions = run(spec(batching=BATCHING), [slo_at_risk(72)] * 3)
    assert [d.max_num_seqs for d in decisions] == [72, 72, 54]
    assert decisions[-1].reason == Action.LOWERED_MAX_NUM_SEQS
    assert (
        "--max-num-seqs 72 → 54: SLO at risk for 3 evaluations with the batch above the "
        "cache-friendly ceiling B_max 50 and the warm hit rate 0.60 under its baseline 0.85"
    ) in decisions[-1].message


def test_the_slo_rule_continues_where_eviction_pressure_stopped() -> None:
    policy = spec(batching=BATCHING)
    lowered = run(policy, [pressured(96)] * 3)[-1]
    assert lowered.max_num_seqs == 72
    # Preemptions stop; the SLO stays breached and the cache depressed. Without the step
    # in memory (a status written before it was kept): with it, the follow-through rule
    # takes this step at once, the preemptions having stopped.
    memory = lowered.memory.model_copy(update={"last_max_num_seqs_step": None})
    later = run(policy, [slo_at_risk(72)] * 3, memory, start=T0 + timedelta(minutes=31))
    assert [d.max_num_seqs for d in later] == [72, 72, 54]
    assert "SLO at risk for 3 evaluations" in later[-1].message


def test_the_slo_rule_stops_at_b_max() -> None:
    policy = spec(batching=BATCHING)
    assert run(policy, [slo_at_risk(60)] * 3)[-1].max_num_seqs == 50  # 25% would be 45
    at_b_max = run(policy, [slo_at_risk(50)] * 5)
    assert {d.max_num_seqs for d in at_b_max} == {50}
    assert "--max-num-seqs" not in at_b_max[-1].message


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (
            slo_at_risk(72, hit=0.8),
            "--max-num-seqs stays 72: the warm hit rate 0.80 is within 10% of its baseline "
            "0.85, so the batch is not what costs the cache",
        ),
        (
            slo_at_risk(72, hit=0.04),
            "--max-num-seqs stays 72: a prefix collapse is active: the prompts emptied the "
            "cache, not the batch",
        ),
        (
            slo_at_risk(72, context_tokens_per_request=None),
            "SLO at risk for 3 evaluations; --max-num-seqs stays 72: B_max is unknown "
            "(no context length)",
        ),
    ],
    ids=["cache-healthy", "collapse-active", "b-max-unknown"],
)
def test_the_slo_rule_says_why_it_does_not_step(state: object, why: str) -> None:
    decisions = run(spec(batching=BATCHING), [state] * 3)  # type: ignore[list-item]
    assert {d.max_num_seqs for d in decisions} == {72}
    assert decisions[-1].reason != Action.LOWERED_MAX_NUM_SEQS
    assert why in decisions[-1].message


def test_no_slo_step_while_the_slo_is_met() -> None:
    met = snapshot(signals(hit=0.6), workload(max_num_seqs=72))
    decisions = run(spec(batching=BATCHING), [met] * 5)
    assert {d.max_num_seqs for d in decisions} == {72}
    assert "SLO at risk" not in decisions[-1].message


def test_a_blocked_slo_step_names_the_cooldown() -> None:
    memory = learned(last_max_num_seqs_change_at=T0 - timedelta(minutes=5))
    decisions = run(spec(batching=BATCHING), [slo_at_risk(72)] * 3, memory)
    assert decisions[-1].max_num_seqs == 72
    assert decisions[-1].notes == (
        "cooldown: the last change was 6 min ago; next possible in 24 min",
    )
    assert "under its baseline 0.85; --max-num-seqs stays 72: cooldown" in decisions[-1].message


def test_a_raise_for_throughput_stops_at_b_max_while_the_slo_rule_holds() -> None:
    # Baseline 0.3, warm rate 0.15: under LOW_HIT_RATE, depressed, not collapsed (0.1).
    memory = learned(baseline=LearnedBaseline(token_hit_rate=0.3, evaluations=100))
    busy = slo_at_risk(44, hit=0.15, waiting_requests_per_pod=2.0)
    decisions = run(spec(batching=BATCHING), [busy] * 21, memory)
    assert max(d.max_num_seqs or 0 for d in decisions) == 50  # 25% more would be 55
    raised = next(d for d in decisions if d.reason == Action.RAISED_MAX_NUM_SEQS)
    assert "--max-num-seqs 44 → 50" in raised.message
    assert "up to B_max 50" in raised.message


def test_the_ceiling_follows_through_to_b_max_while_each_step_pays() -> None:
    # Eviction pressure lowers 128 → 96 and stops; a cooldown later, with no pressure and
    # the SLO met, each step that raised the warm hit rate is followed by the next one,
    # until the ceiling is within 10% of B_max (50). The memory goes through its JSON
    # form between the steps, as a restarted operator reads it from the status.
    policy = spec(batching=BATCHING)
    first = run(policy, [pressured(128, running=60.0)] * 3)
    memory = first[-1].memory
    assert memory.last_max_num_seqs_step is not None
    assert memory.last_max_num_seqs_step.warm_hit_rate == 0.3
    seqs, start, hits = 96, T0 + timedelta(minutes=31), iter((0.5, 0.7, 0.8))
    path = [128, 96]
    for _ in range(4):
        memory = LearnedState.model_validate(memory.model_dump(mode="json", by_alias=True))
        calm = snapshot(signals(hit=next(hits, 0.85)), workload(max_num_seqs=seqs))
        (decision,) = run(policy, [calm], memory, start=start)
        memory, start = decision.memory, start + timedelta(minutes=31)
        if decision.max_num_seqs != seqs:
            seqs = decision.max_num_seqs or 0
            path.append(seqs)
    assert path == [128, 96, 72, 54]
    assert "--max-num-seqs 54 is within 10% of B_max 50: no further step" in decision.message


def test_a_step_without_gain_stops_the_follow_through_and_says_so() -> None:
    policy = spec(batching=BATCHING)
    memory = run(policy, [slo_at_risk(96)] * 3)[-1].memory  # 96 → 72 at a warm rate 0.60
    flat = snapshot(signals(hit=0.61), workload(max_num_seqs=72))
    (decision,) = run(policy, [flat], memory, start=T0 + timedelta(minutes=31))
    assert decision.max_num_seqs == 72
    assert (
        "--max-num-seqs stays 72, above B_max 50: the last step (96 → 72) brought no gain "
        "(the warm hit rate 0.60 → 0.61, less than the 0.02 points a gain needs)"
    ) in decision.message


def test_an_eviction_alert_never_says_not_lowered_when_it_was() -> None:
    policy = spec(batching=BATCHING)
    decisions = run(policy, [pressured(128)] * 3 + [pressured(96)])
    assert decisions[2].max_num_seqs == 96
    assert not decisions[2].alert_active(Diagnosis.EVICTION_PRESSURE)  # lowered instead
    alert = next(a for a in decisions[3].alerts if a.reason == Diagnosis.EVICTION_PRESSURE)
    assert alert.message.endswith(
        "ceiling not lowered now: cooldown: the last change (128 → 96) was under a minute "
        "ago; next possible in 30 min"
    )
    # The pressure holds a cooldown later: the active alert says what this evaluation did.
    (later,) = run(policy, [pressured(96)], decisions[-1].memory, start=T0 + timedelta(minutes=31))
    assert later.max_num_seqs == 72
    alert = next(a for a in later.alerts if a.reason == Diagnosis.EVICTION_PRESSURE)
    assert "; --max-num-seqs 96 → 72: sustained eviction pressure" in alert.message
    assert "not lowered" not in alert.message
    assert "B_max 50" in alert.message
    assert "against a cache-friendly ceiling B_max of 50" in alert.message


def test_a_step_is_judged_on_means_over_warm_evaluations() -> None:
    # One reading of a few warm pods wobbles by several points: the step is judged on the
    # mean since the new ceiling's pods warmed, and that mean is the next step's "before".
    memory = stepped(96, 72, ago=timedelta(minutes=5), since=(None, None))
    warmup = 600.0
    calm = snapshot(signals(), workload(max_num_seqs=72))
    assert tally_step(memory, calm, 0.9, T0, warmup) == memory  # still warming up
    later = T0 + timedelta(minutes=6)
    rolling = snapshot(signals(), workload(max_num_seqs=72, rollout=True))
    assert tally_step(memory, rolling, 0.9, later, warmup) == memory
    elsewhere = snapshot(signals(), workload(max_num_seqs=80))
    assert tally_step(memory, elsewhere, 0.9, later, warmup) == memory
    for hit in (0.7, 0.8, None):  # an unknown rate is left out of the mean
        memory = tally_step(memory, calm, hit, later, warmup)
    step = memory.last_max_num_seqs_step
    assert step is not None
    assert step.hit_rate_since.value == pytest.approx(0.75)
    assert step.preemptions_since.value == 0.0
    lowered = BatchPlan(54, Action.LOWERED_MAX_NUM_SEQS, "--max-num-seqs 72 → 54")
    facts = found(warm_hit_rate=0.95)
    after = remember_change(memory, calm, facts, lowered, later).last_max_num_seqs_step
    assert after is not None
    assert (after.before, after.after, after.at) == (72, 54, later)
    assert after.warm_hit_rate == pytest.approx(0.75)  # the mean, not the 0.95 read now
    assert after.hit_rate_since.samples == 0


# --- plan_max_num_seqs, case by case ----------------------------------------------------
#
# ``BATCHING``: --max-num-seqs managed within 16..256, a 30 min cooldown, evaluations every
# 30 s; B_max is 50 unless a case says otherwise. A lowering steps to
# max(minNumSeqs, B_max, ceil(current × 0.75)); a raise to min(maxNumSeqs,
# floor(current × 1.25)), after LOW_HIT_SECONDS / 30 s = 20 low-hit evaluations with
# requests queueing (≥ 1 per pod) or the batch at 90% of the ceiling or more. A warm hit
# rate under 0.9 × its baseline is depressed.

STEP_TO_B_MAX = "sustained eviction pressure with the batch above the cache-friendly ceiling B_max"
SLO_AT_RISK = "SLO at risk for 3 evaluations with the batch above the cache-friendly ceiling"
LOW_HIT = "token hit rate under 0.20 for 10 min"
DEPRESSED = "with the SLO at risk and the warm hit rate under its baseline"


def ceiling_at(
    seqs: int | None, *, waiting: float = 0.0, running: float = 20.0, rollout: bool = False
) -> Snapshot:
    """The fleet running with ``--max-num-seqs`` ``seqs``."""
    engine = signals(waiting_requests_per_pod=waiting, running_requests_per_pod=running)
    return snapshot(engine, workload(max_num_seqs=seqs, rollout=rollout))


def found(**overrides: object) -> BatchFacts:
    """Nothing wrong, B_max 50, the warm hit rate at its 0.85 baseline; ``overrides`` by
    field name."""
    facts = BatchFacts(
        ceiling=50,
        eviction_sustained=False,
        collapse_active=False,
        slo_at_risk_sustained=False,
        warm_hit_rate=0.85,
        baseline_hit_rate=0.85,
    )
    return replace(facts, **overrides)  # type: ignore[arg-type]


EVICTING = {"eviction_sustained": True}
SLO_DEPRESSED = {"slo_at_risk_sustained": True, "warm_hit_rate": 0.6}
LOW_HIT_DEPRESSED = {"slo_at_risk_sustained": True, "warm_hit_rate": 0.15, "baseline_hit_rate": 0.3}


@dataclass(frozen=True)
class BatchCase:
    """One evaluation's inputs to ``plan_max_num_seqs`` and the plan it must return."""

    name: str
    state: Snapshot
    facts: BatchFacts
    plan: BatchPlan
    memory: LearnedState = field(default_factory=learned)
    policy: CacheScalingPolicySpec = field(default_factory=lambda: spec(batching=BATCHING))


def after(
    slo_breach: int = 0, low_hit: int = 0, changed_ago: timedelta | None = None
) -> LearnedState:
    """The learned state with these streaks, the last ceiling change ``changed_ago``."""
    changed = T0 - changed_ago if changed_ago is not None else None
    return learned(
        streaks=Streaks(slo_breach=slo_breach, low_hit=low_hit),
        last_max_num_seqs_change_at=changed,
    )


def stepped(
    before: int = 96,
    after: int = 72,
    *,
    hit: float | None = 0.8,
    share: float | None = 0.0,
    since: tuple[float | None, float | None] = (0.85, 0.0),
    ago: timedelta = timedelta(minutes=30),
    reason: Action = Action.LOWERED_MAX_NUM_SEQS,
    streaks: Streaks | None = None,
    changed_ago: timedelta | None = None,
    costs: tuple[float | None, float | None] = (None, None),
) -> LearnedState:
    """The memory of a change ``before`` → ``after`` made ``ago``: the warm hit rate
    ``hit`` and preemptions per request ``share`` under the old ceiling; the mean warm hit
    rate and preemption share ``since`` under the new one; ``changed_ago``:
    the last change recorded elsewhere (a lost status); ``costs``: GPU-s per 1k requests
    under the old ceiling and since."""
    at = T0 - ago
    hit_since, share_since = since
    step = CeilingStep(
        at=at,
        before=before,
        after=after,
        reason=reason,
        warm_hit_rate=hit,
        preemption_share=share,
        hit_rate_since=Mean().add(hit_since).add(hit_since),
        preemptions_since=Mean().add(share_since).add(share_since),
        cost=costs[0],
        cost_since=Mean().add(costs[1]).add(costs[1]),
    )
    return learned(
        streaks=streaks or Streaks(),
        last_max_num_seqs_change_at=T0 - changed_ago if changed_ago is not None else at,
        last_max_num_seqs_step=step,
    )


PAID = "and the batch is still above the cache-friendly ceiling B_max 50"

BATCH_CASES = [
    BatchCase(
        "an unmanaged ceiling is left alone",
        ceiling_at(128),
        found(**EVICTING),
        BatchPlan(128, None, ""),
        policy=spec(),
    ),
    BatchCase(
        "an unknown ceiling is left alone", ceiling_at(None), found(), BatchPlan(None, None, "")
    ),
    BatchCase(
        "above the policy's range: clamped down",
        ceiling_at(512),
        found(),
        BatchPlan(
            256,
            Action.CLAMPED_MAX_NUM_SEQS,
            "--max-num-seqs 512 → 256: outside the policy's 16..256",
        ),
    ),
    BatchCase(
        "below the policy's range: clamped up",
        ceiling_at(8),
        found(),
        BatchPlan(
            16, Action.CLAMPED_MAX_NUM_SEQS, "--max-num-seqs 8 → 16: outside the policy's 16..256"
        ),
    ),
    BatchCase(
        "sustained eviction: a quarter down at most",
        # max(16, 50, ceil(96)) = 96.
        ceiling_at(128),
        found(**EVICTING),
        BatchPlan(96, Action.LOWERED_MAX_NUM_SEQS, f"--max-num-seqs 128 → 96: {STEP_TO_B_MAX} 50"),
    ),
    BatchCase(
        "sustained eviction: never below B_max",
        # max(16, 50, ceil(45)) = 50.
        ceiling_at(60),
        found(**EVICTING),
        BatchPlan(50, Action.LOWERED_MAX_NUM_SEQS, f"--max-num-seqs 60 → 50: {STEP_TO_B_MAX} 50"),
    ),
    BatchCase(
        "sustained eviction: never below minNumSeqs",
        # max(16, 10, ceil(15)) = 16.
        ceiling_at(20),
        found(ceiling=10, **EVICTING),
        BatchPlan(16, Action.LOWERED_MAX_NUM_SEQS, f"--max-num-seqs 20 → 16: {STEP_TO_B_MAX} 10"),
    ),
    BatchCase(
        "sustained eviction with B_max unknown",
        ceiling_at(128),
        found(ceiling=None, **EVICTING),
        BatchPlan(128, None, "eviction pressure, but B_max is unknown (no context length)"),
    ),
    BatchCase(
        "sustained eviction with the batch at B_max",
        ceiling_at(50),
        found(**EVICTING),
        BatchPlan(50, None, "eviction pressure although the ceiling is at B_max 50"),
    ),
    BatchCase(
        "a breached SLO with a depressed cache steps toward B_max",
        # 0.60 < 0.9 × 0.85: max(16, 50, ceil(54)) = 54.
        ceiling_at(72),
        found(**SLO_DEPRESSED),
        BatchPlan(
            54,
            Action.LOWERED_MAX_NUM_SEQS,
            f"--max-num-seqs 72 → 54: {SLO_AT_RISK} B_max 50 and the warm hit rate 0.60 under "
            "its baseline 0.85",
        ),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a breached SLO with the cache at its baseline says why not",
        # 0.80 ≥ 0.9 × 0.85 = 0.765.
        ceiling_at(72),
        found(slo_at_risk_sustained=True, warm_hit_rate=0.8),
        BatchPlan(
            72,
            None,
            f"{SLO_AT_RISK} B_max 50; --max-num-seqs stays 72: the warm hit rate 0.80 is within "
            "10% of its baseline 0.85, so the batch is not what costs the cache",
        ),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a breached SLO during a collapse says why not",
        ceiling_at(72),
        found(collapse_active=True, **SLO_DEPRESSED),
        BatchPlan(
            72,
            None,
            f"{SLO_AT_RISK} B_max 50; --max-num-seqs stays 72: a prefix collapse is active: the "
            "prompts emptied the cache, not the batch",
        ),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a breached SLO with the warm rate unknown says why not",
        ceiling_at(72),
        found(slo_at_risk_sustained=True, warm_hit_rate=None),
        BatchPlan(
            72,
            None,
            f"{SLO_AT_RISK} B_max 50; --max-num-seqs stays 72: the warm pods' hit rate is unknown",
        ),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a breached SLO without a baseline says why not",
        ceiling_at(72),
        found(slo_at_risk_sustained=True, warm_hit_rate=0.6, baseline_hit_rate=None),
        BatchPlan(
            72,
            None,
            f"{SLO_AT_RISK} B_max 50; --max-num-seqs stays 72: no hit-rate baseline learned yet "
            "to call the cache depressed",
        ),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a breached SLO with B_max unknown says why not",
        ceiling_at(72),
        found(ceiling=None, **SLO_DEPRESSED),
        BatchPlan(
            72,
            None,
            "SLO at risk for 3 evaluations; --max-num-seqs stays 72: B_max is unknown (no "
            "context length)",
        ),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a breached SLO with the batch within B_max: nothing to say",
        ceiling_at(50),
        found(**SLO_DEPRESSED),
        BatchPlan(50, None, ""),
        memory=after(slo_breach=3),
    ),
    BatchCase(
        "a cache that does not hit buys throughput while requests queue",
        # floor(32 × 1.25) = 40.
        ceiling_at(32, waiting=1.0),
        found(),
        BatchPlan(
            40,
            Action.RAISED_MAX_NUM_SEQS,
            f"--max-num-seqs 32 → 40: {LOW_HIT}: nothing to protect, so the batch buys throughput",
        ),
        memory=after(low_hit=20),
    ),
    BatchCase(
        "...or while the batch is nearly full",
        # 29 ≥ 0.9 × 32 = 28.8.
        ceiling_at(32, running=29.0),
        found(),
        BatchPlan(
            40,
            Action.RAISED_MAX_NUM_SEQS,
            f"--max-num-seqs 32 → 40: {LOW_HIT}: nothing to protect, so the batch buys throughput",
        ),
        memory=after(low_hit=20),
    ),
    BatchCase(
        "...not while the batch has room",
        ceiling_at(32, running=28.0),
        found(),
        BatchPlan(32, None, ""),
        memory=after(low_hit=20),
    ),
    BatchCase(
        "...not before the hit rate has been low for LOW_HIT_SECONDS",
        ceiling_at(32, waiting=1.0),
        found(),
        BatchPlan(32, None, ""),
        memory=after(low_hit=19),
    ),
    BatchCase(
        "...not during a collapse",
        ceiling_at(32, waiting=2.0),
        found(collapse_active=True),
        BatchPlan(32, None, ""),
        memory=after(low_hit=20),
    ),
    BatchCase(
        "...and never above maxNumSeqs",
        # min(256, floor(300)) = 256.
        ceiling_at(240, waiting=2.0),
        found(),
        BatchPlan(
            256,
            Action.RAISED_MAX_NUM_SEQS,
            f"--max-num-seqs 240 → 256: {LOW_HIT}: nothing to protect, so the batch buys "
            "throughput",
        ),
        memory=after(low_hit=20),
    ),
    BatchCase(
        "a raise stops at B_max while the SLO rule holds",
        # 0.15 < 0.9 × 0.3: min(floor(55), 50) = 50.
        ceiling_at(44, waiting=2.0),
        found(**LOW_HIT_DEPRESSED),
        BatchPlan(
            50,
            Action.RAISED_MAX_NUM_SEQS,
            f"--max-num-seqs 44 → 50: {LOW_HIT}: the batch buys throughput up to B_max 50, "
            f"{DEPRESSED}",
        ),
        memory=after(slo_breach=3, low_hit=20),
    ),
    BatchCase(
        "no raise at B_max while the SLO rule holds, and it says why",
        ceiling_at(50, waiting=2.0),
        found(**LOW_HIT_DEPRESSED),
        BatchPlan(
            50,
            None,
            f"{LOW_HIT}, but --max-num-seqs stays 50, within B_max 50, {DEPRESSED}",
        ),
        memory=after(slo_breach=3, low_hit=20),
    ),
    BatchCase(
        "one change per cooldown",
        ceiling_at(128),
        found(**EVICTING),
        BatchPlan(
            128,
            None,
            f"{STEP_TO_B_MAX} 50; --max-num-seqs stays 128: cooldown: the last change was 5 min "
            "ago; next possible in 25 min",
            "cooldown: the last change was 5 min ago; next possible in 25 min",
        ),
        memory=after(changed_ago=timedelta(minutes=5)),
    ),
    BatchCase(
        "a whole cooldown later the change is made",
        ceiling_at(128),
        found(**EVICTING),
        BatchPlan(96, Action.LOWERED_MAX_NUM_SEQS, f"--max-num-seqs 128 → 96: {STEP_TO_B_MAX} 50"),
        memory=after(changed_ago=timedelta(minutes=30)),
    ),
    BatchCase(
        "a blocked step names the change it waits after",
        ceiling_at(96),
        found(**EVICTING),
        BatchPlan(
            96,
            None,
            f"{STEP_TO_B_MAX} 50; --max-num-seqs stays 96: cooldown: the last change "
            "(128 → 96) was under a minute ago; next possible in 30 min",
            "cooldown: the last change (128 → 96) was under a minute ago; next possible in 30 min",
        ),
        memory=stepped(128, 96, ago=timedelta(seconds=30)),
    ),
    BatchCase(
        "follow-through: a step that raised the warm hit rate is followed by the next",
        # 0.85 ≥ 0.80 + 0.02; 72 > 1.1 × 50: max(16, 50, ceil(54)) = 54.
        ceiling_at(72),
        found(),
        BatchPlan(
            54,
            Action.LOWERED_MAX_NUM_SEQS,
            f"--max-num-seqs 72 → 54: the last step (96 → 72) paid (the warm hit rate 0.80 → "
            f"0.85) {PAID}",
        ),
        memory=stepped(),
    ),
    BatchCase(
        "...or one that ended the preemptions",
        ceiling_at(72),
        found(),
        BatchPlan(
            54,
            Action.LOWERED_MAX_NUM_SEQS,
            f"--max-num-seqs 72 → 54: the last step (96 → 72) paid (preemptions 5.0% → 0.0% "
            f"of requests) {PAID}",
        ),
        memory=stepped(hit=0.85, share=0.05, since=(0.85, 0.0)),
    ),
    BatchCase(
        "...never below B_max",
        # max(16, 50, ceil(45)) = 50.
        ceiling_at(60),
        found(),
        BatchPlan(
            50,
            Action.LOWERED_MAX_NUM_SEQS,
            f"--max-num-seqs 60 → 50: the last step (80 → 60) paid (the warm hit rate 0.80 → "
            f"0.85) {PAID}",
        ),
        memory=stepped(80, 60),
    ),
    BatchCase(
        "...stops at a step without gain, and says so",
        ceiling_at(72),
        found(),
        BatchPlan(
            72,
            None,
            "--max-num-seqs stays 72, above B_max 50: the last step (96 → 72) brought no gain "
            "(the warm hit rate 0.84 → 0.85, less than the 0.02 points a gain needs)",
        ),
        memory=stepped(hit=0.84),
    ),
    BatchCase(
        "...stops at a step that made requests dearer, whatever the hit rate gained",
        # 0.80 → 0.85 would pay; 700 → 740 GPU-s/1k is 5.7% dearer (over 5%).
        ceiling_at(72),
        found(),
        BatchPlan(
            72,
            None,
            "--max-num-seqs stays 72, above B_max 50: the last step (96 → 72) brought no gain "
            "(GPU-s per 1k requests 700 → 740: the smaller batch costs more than the cache "
            "saves)",
        ),
        memory=stepped(costs=(700.0, 740.0)),
    ),
    BatchCase(
        "...a step costing no more than 5% over the old ceiling's still pays",
        ceiling_at(72),
        found(),
        BatchPlan(
            54,
            Action.LOWERED_MAX_NUM_SEQS,
            f"--max-num-seqs 72 → 54: the last step (96 → 72) paid (the warm hit rate 0.80 → "
            f"0.85) {PAID}",
        ),
        memory=stepped(costs=(700.0, 735.0)),
    ),
    BatchCase(
        "...stops when the rates to judge by are unknown",
        ceiling_at(72),
        found(),
        BatchPlan(
            72,
            None,
            "--max-num-seqs stays 72, above B_max 50: the last step (96 → 72) brought no gain "
            "(the warm hit rate before or since it is unknown)",
        ),
        memory=stepped(since=(None, None)),
    ),
    BatchCase(
        "...stops within 10% of B_max",
        # 55 ≤ 1.1 × 50.
        ceiling_at(55),
        found(),
        BatchPlan(55, None, "--max-num-seqs 55 is within 10% of B_max 50: no further step"),
        memory=stepped(73, 55),
    ),
    BatchCase(
        "...waits while the SLO is at risk",
        ceiling_at(72),
        found(slo_at_risk_sustained=True),
        BatchPlan(
            72,
            None,
            f"{SLO_AT_RISK} B_max 50; --max-num-seqs stays 72: the warm hit rate 0.85 is within "
            "10% of its baseline 0.85, so the batch is not what costs the cache; "
            "--max-num-seqs stays 72, above B_max 50: the SLO is at risk, and a step restarts "
            "pods the breach needs",
        ),
        memory=stepped(streaks=Streaks(slo_breach=3)),
    ),
    BatchCase(
        "...waits while a pod is still warming",
        ceiling_at(72),
        found(warming=True),
        BatchPlan(
            72,
            None,
            "--max-num-seqs stays 72, above B_max 50: pods are still warming, and a step "
            "restarts every pod",
        ),
        memory=stepped(),
    ),
    BatchCase(
        "...waits out the cooldown silently (the restarted caches are still filling)",
        ceiling_at(72),
        found(),
        BatchPlan(72, None, ""),
        memory=stepped(ago=timedelta(minutes=29)),
    ),
    BatchCase(
        "...never after a raise",
        ceiling_at(72),
        found(),
        BatchPlan(72, None, ""),
        memory=stepped(58, 72, reason=Action.RAISED_MAX_NUM_SEQS),
    ),
    BatchCase(
        "...never in a low-hit streak (the raise rule's ground)",
        ceiling_at(72),
        found(),
        BatchPlan(72, None, ""),
        memory=stepped(streaks=Streaks(low_hit=1)),
    ),
    BatchCase(
        "...never during a collapse",
        ceiling_at(72),
        found(collapse_active=True),
        BatchPlan(72, None, ""),
        memory=stepped(),
    ),
    BatchCase(
        "...never with B_max unknown",
        ceiling_at(72),
        found(ceiling=None),
        BatchPlan(72, None, ""),
        memory=stepped(),
    ),
    BatchCase(
        "...never off the ceiling it stepped to",
        ceiling_at(80),
        found(),
        BatchPlan(80, None, ""),
        memory=stepped(),
    ),
    BatchCase(
        "...never on a step older than the last change (the status lost a later one)",
        ceiling_at(72),
        found(),
        BatchPlan(72, None, ""),
        memory=stepped(ago=timedelta(minutes=90), changed_ago=timedelta(minutes=40)),
    ),
    BatchCase(
        "no change during a rollout",
        ceiling_at(128, rollout=True),
        found(**EVICTING),
        BatchPlan(
            128,
            None,
            f"{STEP_TO_B_MAX} 50; --max-num-seqs stays 128: a rollout is in progress",
            "a rollout is in progress",
        ),
    ),
]


@pytest.mark.parametrize("case", BATCH_CASES, ids=lambda case: case.name)
def test_plan_max_num_seqs(case: BatchCase) -> None:
    assert plan_max_num_seqs(case.policy, case.state, case.memory, T0, case.facts) == case.plan
