"""The request stream: determinism, prompts from segments, memoised hashing, arrivals, and
what each perturbation does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cachescale.sim.request import SimRequest
from cachescale.sim.traffic import Traffic, ideal_hit_rate
from cachescale.sim.traffic_spec import (
    ChunkSizeChange,
    LayoutChange,
    LengthDist,
    Perturbation,
    RateChange,
    RateStep,
    RetrievalAheadOfHistory,
    RetrievalSpec,
    SessionSpec,
    ShuffleTools,
    SlidingWindow,
    TenantSpec,
    ToolsSpec,
    VariableFieldToTop,
    WorkloadSpec,
    incident_perturbations,
    incident_workload_spec,
)


def _run(
    spec: WorkloadSpec,
    until_s: float,
    perturbations: Sequence[Perturbation] = (),
    memo: bool = True,
    memo_max_digests: int = 4_000_000,
) -> list[SimRequest]:
    workload = Traffic(
        spec,
        seed=7,
        perturbations=perturbations,
        until_s=until_s,
        memo=memo,
        memo_max_digests=memo_max_digests,
    )
    return list(workload)


def _small(**changes: object) -> WorkloadSpec:
    """A light incident-shaped workload for fast tests."""
    base = incident_workload_spec().model_dump()
    base["retrieval"].update(topics=40, docs_per_topic=4)
    base.update(changes)
    return WorkloadSpec.model_validate(base)


# --- tenants ---------------------------------------------------------------------------


def test_salted_tenants_share_no_block_even_with_identical_tokens() -> None:
    # Layout of shared tools only + user turn: the tools' tokens are identical for both.
    def stream(salts: tuple[str | None, str | None]) -> list[SimRequest]:
        spec = _small(
            layout=("tools", "user"),
            tenants=(
                TenantSpec(name="a", cache_salt=salts[0]),
                TenantSpec(name="b", cache_salt=salts[1]),
            ),
        )
        return _run(spec, 60)

    def shared(requests: list[SimRequest]) -> set[bytes]:
        by_tenant: dict[str, set[bytes]] = {"a": set(), "b": set()}
        for r in requests:
            by_tenant[r.tenant].update(r.block_hashes)
        return by_tenant["a"] & by_tenant["b"]

    assert shared(stream((None, None)))  # control: unsalted tenants do share the tools
    assert not shared(stream(("salt-a", "salt-b")))


# --- stream shape ----------------------------------------------------------------------


def test_same_seed_same_stream_and_other_seed_differs() -> None:
    spec = _small()
    perts: list[Perturbation] = [ShuffleTools(at_s=20), ChunkSizeChange(at_s=30, chunk_size=500)]

    def head(seed: int) -> list[tuple[int, float, str, int, int, int, list[bytes]]]:
        w = Traffic(spec, seed=seed, perturbations=perts, until_s=60)
        return [
            (
                r.request_id,
                r.arrival_s,
                r.tenant,
                r.prefix_group,
                r.prompt_tokens,
                r.output_tokens,
                r.block_hashes,
            )
            for r in w
        ]

    assert head(3) == head(3)
    assert head(3) != head(4)


def test_every_full_block_of_prompt_and_output_is_hashed() -> None:
    requests = _run(_small(), 60)
    assert requests
    for r in requests:
        assert len(r.block_hashes) == (r.prompt_tokens + r.output_tokens) // 16


def test_prompt_is_the_sum_of_its_segments() -> None:
    spec = _small(
        layout=("system", "tools", "docs", "user", "variable"),
        user_tokens=LengthDist(mean_tokens=100, sigma=0, min_tokens=1, max_tokens=1000),
    )
    r = next(iter(Traffic(spec, seed=1)))
    retrieval = spec.retrieval
    docs = r.prompt_tokens - (800 + 6 * 200 + 100 + 24)
    assert 0 < docs <= retrieval.top_k * retrieval.chunk_size


def test_follow_up_extends_previous_turn_prompt_and_output() -> None:
    """A follow-up's prompt starts with every full block of its previous turn's sequence."""
    requests = _run(_small(), 120)
    finals = {r.block_hashes[-1]: len(r.block_hashes) for r in requests if r.block_hashes}
    extending = [
        r
        for r in requests
        if any(
            finals.get(d) == i + 1 for i, d in enumerate(r.block_hashes[: r.prompt_tokens // 16])
        )
    ]
    assert len(extending) > 0.4 * len(requests)


def test_memoised_hashes_equal_unmemoised() -> None:
    spec = _small(
        tenants=(TenantSpec(name="a", cache_salt="x"), TenantSpec(name="b")),
        sessions=SessionSpec(history_max_tokens=3000),
    )
    perts: list[Perturbation] = [
        ChunkSizeChange(at_s=20, chunk_size=500),
        RetrievalAheadOfHistory(at_s=30),
        ShuffleTools(at_s=40),
        SlidingWindow(at_s=45, history_max_tokens=900),
    ]
    plain = _run(spec, 60, perts, memo=False)
    memo = _run(spec, 60, perts)
    tiny_memo = _run(spec, 60, perts, memo_max_digests=500)
    assert [r.block_hashes for r in memo] == [r.block_hashes for r in plain]
    assert [r.block_hashes for r in tiny_memo] == [r.block_hashes for r in plain]


def test_memo_avoids_rehashing_shared_prefixes() -> None:
    spec = _small()
    plain, memo = Traffic(spec, until_s=60, memo=False), Traffic(spec, until_s=60)
    list(plain)
    list(memo)
    assert memo.stats.blocks_hashed < 0.3 * plain.stats.blocks_hashed


# --- arrivals --------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["perturbation", "spec_step"])
def test_rate_change_changes_arrival_rate(via: str) -> None:
    if via == "perturbation":
        spec, perts = _small(rate_per_s=20.0), [RateChange(at_s=100, rate_per_s=60.0)]
    else:
        spec, perts = _small(rate_per_s=20.0, rate_steps=(RateStep(at_s=100, rate_per_s=60),)), []
    times = [r.arrival_s for r in _run(spec, 200, perts)]
    assert times == sorted(times)
    before = sum(1 for t in times if t < 100)
    after = sum(1 for t in times if t >= 100)
    assert before == pytest.approx(2000, rel=0.1)
    assert after == pytest.approx(6000, rel=0.1)


def test_stream_ends_at_until_and_when_rate_drops_to_zero() -> None:
    assert max(r.arrival_s for r in _run(_small(), 30)) <= 30
    stopped = _run(_small(), 10_000, [RateChange(at_s=5, rate_per_s=0)])
    assert stopped
    assert max(r.arrival_s for r in stopped) < 5


# --- perturbations ---------------------------------------------------------------------


def _before_after(
    spec: WorkloadSpec, perts: Sequence[Perturbation], at_s: float, until_s: float
) -> tuple[float, float]:
    reqs = _run(spec, until_s, perts)
    return (
        ideal_hit_rate(reqs, until_s=at_s),
        ideal_hit_rate(reqs, since_s=at_s + 30),
    )


def test_rechunk_changes_doc_blocks_once() -> None:
    """per_topic retrieval: one docs prefix per topic before, another one after, no third."""
    spec = _small(
        layout=("docs", "user"),
        retrieval=RetrievalSpec(topics=5, docs_per_topic=4, mode="per_topic"),
        sessions=SessionSpec(mean_turns=1),
    )
    n_doc_blocks = 3 * 500 // 16  # the first three chunks, full blocks only, at either size
    prefixes: dict[tuple[int, bool], set[tuple[bytes, ...]]] = {}
    for r in _run(spec, 60, [ChunkSizeChange(at_s=30, chunk_size=500)]):
        key = (r.prefix_group, r.arrival_s >= 30)
        prefixes.setdefault(key, set()).add(tuple(r.block_hashes[:n_doc_blocks]))
    assert len(prefixes) == 10
    assert all(len(p) == 1 for p in prefixes.values())
    for topic in range(5):
        assert prefixes[(topic, False)] != prefixes[(topic, True)]


def test_rechunk_heals_but_retrieval_ahead_of_history_stays_low() -> None:
    spec = _small()
    reqs = _run(spec, 200, [ChunkSizeChange(at_s=100, chunk_size=500)])
    before = ideal_hit_rate(reqs, until_s=100)
    assert before > 0.8
    first_100_after = [r.arrival_s for r in reqs if r.arrival_s >= 100][100]
    assert ideal_hit_rate(reqs, since_s=100, until_s=first_100_after) < before - 0.04  # dip
    assert ideal_hit_rate(reqs, since_s=130) > before - 0.05  # healed

    _, ahead = _before_after(spec, incident_perturbations(100, docs_first=False), 100, 200)
    assert ahead < before - 0.3
    _, docs_first = _before_after(spec, incident_perturbations(100), 100, 200)
    assert docs_first < 0.2  # a 40-topic corpus: chance repeats of first chunks are common


def test_variable_field_to_top_kills_the_hit_rate() -> None:
    before, after = _before_after(_small(), [VariableFieldToTop(at_s=100)], 100, 200)
    assert before > 0.8
    assert after < 0.01


def test_shuffled_tools_lower_the_hit_rate() -> None:
    spec = _small(tools=ToolsSpec(count=8, tokens_each=150))
    before, after = _before_after(spec, [ShuffleTools(at_s=100)], 100, 200)
    assert after < before - 0.3


def test_sliding_window_changes_the_prefix_every_turn() -> None:
    spec = _small(sessions=SessionSpec(mean_turns=8, concurrent=64))
    window: list[Perturbation] = [SlidingWindow(at_s=120, history_max_tokens=600)]
    reqs = _run(spec, 240, window)
    finals: dict[bytes, int] = {}
    extends = {False: 0, True: 0}
    counts = {False: 0, True: 0}
    for r in reqs:
        late = r.arrival_s >= 150
        counts[late] += 1
        prompt = r.block_hashes[: r.prompt_tokens // 16]
        extends[late] += any(finals.get(d) == i + 1 for i, d in enumerate(prompt))
        finals[r.block_hashes[-1]] = len(r.block_hashes)
    share_before = extends[False] / counts[False]
    share_after = extends[True] / counts[True]
    assert share_before > 0.5
    assert share_after < 0.5 * share_before
    unwindowed = ideal_hit_rate(_run(spec, 240), since_s=150)
    assert ideal_hit_rate(reqs, since_s=150) < unwindowed - 0.05


def test_state_and_layout_follow_the_perturbations() -> None:
    spec = _small(layout=("tools", "system", "history", "docs", "user"))
    w = Traffic(
        spec,
        perturbations=[
            VariableFieldToTop(at_s=20),
            RetrievalAheadOfHistory(at_s=10),
            ChunkSizeChange(at_s=30, chunk_size=500),
            RateChange(at_s=40, rate_per_s=5),
            LayoutChange(at_s=50, layout=("user", "docs")),
        ],
    )
    assert w.layout_at(0) == ("tools", "system", "history", "docs", "user")
    assert w.layout_at(10) == ("tools", "system", "docs", "history", "user")
    assert w.state_at(10).retrieval_mode == "per_request"
    assert w.layout_at(25) == ("variable", "tools", "system", "docs", "history", "user")
    assert w.state_at(29).chunk_size == 512
    assert w.state_at(30).chunk_size == 500
    assert (w.state_at(39).rate_per_s, w.state_at(40).rate_per_s) == (32.0, 5)
    assert w.layout_at(60) == ("user", "docs")
    assert w.state_at(60).applied == (
        "retrieval_per_turn_ahead_of_history",
        "variable_field_to_top",
        "chunk_size",
        "rate",
        "layout",
    )


# --- ground truth ----------------------------------------------------------------------


def _req(i: int, hashes: list[bytes], prompt: int, output: int = 0, t: float = 0) -> SimRequest:
    return SimRequest(i, t, "t", 0, prompt, output, hashes)


def test_ideal_hit_rate_first_miss_and_last_token_cap() -> None:
    a, b, c, x = (bytes([i]) * 32 for i in range(4))
    reqs = [
        _req(0, [a, b, c], 48),  # cold: 0 of 48
        _req(1, [a, x, c], 48),  # a hits, x misses, c not counted after the miss: 16 of 48
        _req(2, [a, b, c], 48),  # all cached but the last token is recomputed: 32 of 48
        _req(3, [a, b, c], 50),  # 50 tokens: 3 full blocks hit, 48 ≤ 49: 48 of 50
    ]
    assert ideal_hit_rate(reqs) == pytest.approx((0 + 16 + 32 + 48) / (48 * 3 + 50))
    assert ideal_hit_rate([]) == 0.0


def test_ideal_hit_rate_counts_output_blocks_for_the_next_turn_and_windows() -> None:
    a, b, c = (bytes([i]) * 32 for i in range(3))
    reqs = [_req(0, [a, b], 16, 16, t=0), _req(1, [a, b, c], 40, 8, t=10)]
    assert ideal_hit_rate(reqs, since_s=5) == pytest.approx(32 / 40)


@pytest.mark.slow
def test_incident_calibration() -> None:
    """Baseline ≈ 0.85–0.9; docs-first re-retrieval collapses it to a few percent."""
    spec = incident_workload_spec()
    reqs = _run(spec, 1200, incident_perturbations(600))
    assert 0.85 <= ideal_hit_rate(reqs, since_s=120, until_s=600) <= 0.92
    assert ideal_hit_rate(reqs, since_s=630) <= 0.09
