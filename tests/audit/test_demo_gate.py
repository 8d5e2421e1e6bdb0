"""Acceptance: the gate fails the five breaking demo cases naming the right cause, and
passes the boundary shift, which heals after warm-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cachescale.audit.compare import Thresholds, compare, render_json, render_markdown
from cachescale.audit.corpus import parse_corpus
from cachescale.audit.demo import VARIANTS, build_case
from cachescale.audit.replay import replay
from cachescale.audit.result import build_result
from cachescale.commands.audit import DEMO_CASES

EXPECTED_CAUSE = {
    "rechunk-retrieval-first": "retrieval-rerun",
    "timestamp-top": "variable-span",
    "shuffled-tools": "unstable-ordering",
    "sliding-window": "sliding-window",
    "prompt-doubled": "prompt-growth",
}


def _result(lines: list[str], name: str) -> dict[str, Any]:
    corpus = parse_corpus(Path(name), "\n".join(lines))
    return build_result(corpus, name, replay(corpus))


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    out = {}
    for case in DEMO_CASES:
        baseline, candidate = build_case(case)
        out[case] = (_result(baseline, "baseline.jsonl"), _result(candidate, "candidate.jsonl"))
    return out


def test_the_cli_offers_every_demo_case() -> None:
    assert set(DEMO_CASES) == set(VARIANTS)


@pytest.mark.parametrize("case", sorted(EXPECTED_CAUSE))
def test_the_gate_fails_a_breaking_change_and_names_its_cause(
    results: dict[str, tuple[dict[str, Any], dict[str, Any]]], case: str
) -> None:
    verdict = compare(*results[case], Thresholds())
    assert verdict.regression, verdict.headline
    assert verdict.cause == EXPECTED_CAUSE[case], verdict.headline
    if case != "prompt-doubled":  # the cause is quoted at a position
        assert "token " in verdict.headline
        assert ", block " in verdict.headline
    assert '"verdict": "regression"' in render_json(verdict)
    assert render_markdown(verdict).startswith("### ❌")


def test_the_gate_passes_a_boundary_shift_and_says_it_heals(
    results: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    baseline, candidate = results["boundary-shift-only"]
    verdict = compare(baseline, candidate, Thresholds())
    assert not verdict.regression, verdict.failures
    assert verdict.cause is None
    assert any("heals after warm-up" in note for note in verdict.notes)
    # The chunks start after the system prompt and the tools: 400 + 8 × 60 tokens.
    assert any("from block 55 (token 880)" in note for note in verdict.notes), verdict.notes


def test_the_baseline_is_cache_friendly(
    results: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    baseline = results["timestamp-top"][0]["passes"]["audit"]
    assert baseline["token_hit_rate"] > 0.8
    assert baseline["request_hit_share"] > 0.75


def test_a_demo_corpus_is_the_same_for_the_same_seed() -> None:
    assert build_case("shuffled-tools", 3) == build_case("shuffled-tools", 3)
    assert build_case("shuffled-tools", 3) != build_case("shuffled-tools", 4)
