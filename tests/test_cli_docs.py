"""README.md and CHANGELOG.md agree with the built-in scenarios, and cite nothing a user
cannot open.

The scenario set grows; the prose that lists it has drifted before ("eight scenarios"
when there were ten). These tests read the lists and counts back and compare them with
``cachescale.sim.scenario.builtin_names()``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cachescale.sim.scenario import builtin_names

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
CHANGELOG = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
NUMBERS = {
    word: value
    for value, word in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
}
COUNTED = re.compile(r"\b(\w+) (?:new )?built-in scenarios", re.IGNORECASE)


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, and each Markdown list item on its own."""
    blocks = re.split(r"\n\s*\n", text)
    return [item for block in blocks for item in re.split(r"\n(?=- )", block)]


def test_readme_lists_exactly_the_built_in_scenarios() -> None:
    (listing,) = [p for p in paragraphs(README) if p.startswith("Built-in scenarios")]
    listing = listing.split("\n\n")[0]
    named = backticked(listing.split("A scenario's")[0]) - {"examples/scenarios/"}
    assert named == set(builtin_names())


def test_changelog_names_every_built_in_scenario() -> None:
    missing = set(builtin_names()) - backticked(CHANGELOG)
    assert not missing, f"CHANGELOG.md never names {sorted(missing)}"


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_every_scenario_count_matches_the_names_beside_it(name: str) -> None:
    text = (REPO / name).read_text(encoding="utf-8")
    builtin = set(builtin_names())
    counted = 0
    for block in paragraphs(text):
        for match in COUNTED.finditer(block):
            word = match.group(1).lower()
            number = NUMBERS.get(word, int(word) if word.isdigit() else None)
            if number is None:
                continue
            counted += 1
            named = backticked(block) & builtin
            assert len(named) == number, f"{name}: {match.group(0)!r} but names {sorted(named)}"
    if name == "CHANGELOG.md":
        assert counted, "the CHANGELOG's scenario counts were not found: update this test"


USER_FACING = [
    REPO / "README.md",
    REPO / "CHANGELOG.md",
    REPO / "docs" / "simulator.md",
    REPO / "docs" / "scenario-engine.md",
    *sorted((REPO / "operator" / "cachescale" / "sim" / "scenarios").glob("*.yaml")),
    *sorted((REPO / "examples" / "scenarios").glob("*.yaml")),
]


@pytest.mark.parametrize("path", USER_FACING, ids=[p.name for p in USER_FACING])
def test_no_reference_to_a_document_users_do_not_have(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"\bbrief\b|§", text, re.IGNORECASE), path
