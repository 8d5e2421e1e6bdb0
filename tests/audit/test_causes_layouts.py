"""Causes named from what changed, in every prompt layout (issue 57's acceptance).

Each case is a baseline corpus and a candidate that changes one thing, built in three
layouts (system prompt first, tools first, no system prompt: ``layouts.py``). The gate
must fail the breaking ones naming the right cause in every layout, quote the change at
the token and block where it starts, and the candidate aligned with the baseline
(``--baseline-corpus``) must say what the change did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachescale.audit.against import against_baseline, attach
from cachescale.audit.compare import Thresholds, Verdict, compare
from cachescale.audit.corpus import Corpus, parse_corpus
from cachescale.audit.replay import replay
from cachescale.audit.result import build_result
from cachescale.exit_codes import ExitCode
from tests.audit.helpers import cli
from tests.audit.layouts import LAYOUTS, STAMP, TURNS, Variant, records, stamp_position

BREAKING = {
    "variable-span": Variant(stamp=True),
    "unstable-ordering": Variant(shuffle_tools=True),
    "sliding-window": Variant(window=2),
    "retrieval-rerun": Variant(retrieval_per_turn=True),
    "cache-salt": Variant(salt="tenant"),
}


def _corpus(layout: str, variant: Variant) -> Corpus:
    lines = "\n".join(json.dumps(r) for r in records(layout, variant))
    return parse_corpus(Path(f"{layout}.jsonl"), lines)


DEFAULTS = Thresholds()


def _gate(
    layout: str, variant: Variant, limits: Thresholds = DEFAULTS
) -> tuple[Verdict, dict[str, Any]]:
    """Baseline and candidate replayed, the candidate aligned with the baseline, gated."""
    base, cand = _corpus(layout, Variant()), _corpus(layout, variant)
    baseline = build_result(base, "b", replay(base))
    candidate = build_result(cand, "c", replay(cand))
    attach(candidate, *against_baseline(cand, base, 16))
    return compare(baseline, candidate, limits), candidate


def _example(result: dict[str, Any], cause: str) -> dict[str, Any]:
    entry = next(e for e in result["causes"]["audit"] if e["cause"] == cause)
    example: dict[str, Any] = entry["examples"][0]
    return example


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cause", sorted(BREAKING))
def test_the_gate_names_the_cause_in_every_layout(layout: str, cause: str) -> None:
    verdict, candidate = _gate(layout, BREAKING[cause])
    assert verdict.regression, verdict.headline
    assert verdict.cause == cause, verdict.headline
    assert "token " in verdict.headline
    assert ", block " in verdict.headline
    changes = candidate["baseline"]["changes"]
    assert changes[0]["cause"] == cause, changes


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_variable_span_is_quoted_where_it_sits(layout: str) -> None:
    _, candidate = _gate(layout, BREAKING["variable-span"])
    example = _example(candidate, "variable-span")
    position = stamp_position(layout)
    assert (example["position"], example["block"]) == (position, position // 16)
    assert (example["inserted"], example["removed"]) in ((STAMP, STAMP), (STAMP, 0))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_salted_tenants_are_named_as_isolation_intended_or_not(layout: str) -> None:
    verdict, _ = _gate(layout, Variant(salt="tenant"))
    assert verdict.cause == "cache-salt"
    assert "tenancy isolation" in verdict.headline
    assert "isolation as intended" in verdict.headline
    verdict, _ = _gate(layout, Variant(salt="conversation"))
    assert verdict.cause == "cache-salt"
    assert "probably not intended" in verdict.headline


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_sliding_window_under_the_gates_is_named_all_the_same(layout: str) -> None:
    loose = Thresholds(max_hit_rate_drop=1.0, max_recompute_rise=100.0)
    verdict, _ = _gate(layout, BREAKING["sliding-window"], loose)
    assert not verdict.regression
    assert any(note.startswith("under the gates, sliding-window costs +") for note in verdict.notes)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rechunking_is_named_against_the_baseline_and_heals(layout: str) -> None:
    verdict, candidate = _gate(layout, Variant(chunk=60))
    changes = candidate["baseline"]["changes"]
    assert changes[0]["cause"] == "rechunked", changes
    assert any("re-chunking" in note for note in verdict.notes)


def test_a_hit_that_lost_its_previous_turn_is_explained() -> None:
    """A sliding window whose requests still take most of their prompt from the cache is
    explained too: with a low hit fraction every request hits, and the cause is there."""
    cand = _corpus("system-first", BREAKING["sliding-window"])
    result = build_result(cand, "c", replay(cand, hit_fraction=0.05))
    assert result["settings"]["hit_fraction"] == 0.05
    assert result["passes"]["audit"]["request_hit_share"] == 1.0
    assert [e["cause"] for e in result["causes"]["audit"]] == ["sliding-window"]


def test_the_changed_span_is_decoded_with_a_tokenizer() -> None:
    cand = _corpus("tools-first", BREAKING["variable-span"])
    outcome = replay(cand, decode=lambda ids: " ".join(f"w{i}" for i in ids))
    result = build_result(cand, "c", outcome)
    example = _example(result, "variable-span")
    # The first audited request is conversation c4's turn 0, the 21st request: its value
    # is the 21st drawn.
    first = 100 + STAMP * 4 * TURNS
    assert (example["conversation_id"], example["turn"]) == ("c4", 0)
    assert example["text"] == " ".join(f"w{i}" for i in range(first, first + STAMP))
    assert f"'{example['text']}'" in example["where"]


def test_the_cli_aligns_with_the_baseline_corpus(tmp_path: Path) -> None:
    for name, variant in (("base", Variant()), ("cand", Variant(chunk=60))):
        lines = [json.dumps(r) for r in records("tools-first", variant)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert cli("run", "base.jsonl", "--out", "base.json", cwd=tmp_path).returncode == 0
    done = cli(
        "run", "cand.jsonl", "--out", "cand.json", "--baseline-corpus", "base.jsonl", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "cand.json").read_text(encoding="utf-8"))
    assert result["baseline"]["changes"][0]["cause"] == "rechunked"
    assert {r["baseline_change"] for r in result["requests"]} == {"rechunked"}
    done = cli("compare", "base.json", "cand.json", cwd=tmp_path)
    assert "against the baseline corpus, 40 of 40 requests changed: rechunked 40" in done.stdout
    missing = cli(
        "run", "cand.jsonl", "--out", "x.json", "--baseline-corpus", "nope.jsonl", cwd=tmp_path
    )
    assert missing.returncode == ExitCode.USAGE
    assert missing.stderr.startswith("cachescale audit: --baseline-corpus nope.jsonl: cannot read")
