"""Label selectors: the API server's grammar, refused before anything is sent when wrong,
and the same test on labels the API server applies (``api/label_selector.py``)."""

from __future__ import annotations

import re

import pytest

from cachescale.api.label_selector import LabelSelector


@pytest.mark.parametrize(
    ("text", "spelled"),
    [
        ("team=search", "team=search"),
        ("team==search", "team==search"),
        ("team!=search", "team!=search"),
        ("team", "team"),
        ("!canary", "!canary"),
        ("team=", "team="),
        ("tier in (a,b)", "tier in (a,b)"),
        ("tier notin ( a , b )", "tier notin (a,b)"),
        ("tier in (a,)", "tier in (a,)"),
        ("tier in ()", "tier in ()"),
        ("shard>2", "shard>2"),
        ("shard < -1", "shard<-1"),
        (" team = search ,  tier in (a, b),!canary", "team=search,tier in (a,b),!canary"),
        ("cachescale.dev/shard=blue", "cachescale.dev/shard=blue"),
        ("app.kubernetes.io/part-of=llm_Serving.v2", "app.kubernetes.io/part-of=llm_Serving.v2"),
        ("tier in (in,notin)", "tier in (in,notin)"),
    ],
)
def test_selectors_the_api_server_accepts_parse_to_one_spelling(text: str, spelled: str) -> None:
    assert str(LabelSelector.parse(text)) == spelled
    assert str(LabelSelector.parse(spelled)) == spelled


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("tier in a", "in parentheses"),
        ("tier in (a b)", "expected ',' or ')'"),
        ("tier in (a", "expected ',' or ')'"),
        ("team=search shard=1", "expected ',' between requirements"),
        ("!team=search", "expected ',' between requirements"),
        ("!", "'!' must be followed by a label key"),
        (",team", "expected a label key, found ','"),
        ("team,", "expected a label key, found the end"),
        ("Team.Example/x=1", "DNS subdomain"),
        ("-team=1", "the name must be"),
        ("t" * 64, "the name must be"),
        ("team=-x", "label value '-x'"),
        ("team=" + "v" * 64, "label value"),
        ("team in (ok,bad!)", "expected ',' or ')'"),
        ("shard>two", "needs an integer"),
        ("shard<", "needs an integer"),
        ("team ~ x", "expected one of"),
        ("in in (a)", "expected a label key, found 'in'"),
    ],
)
def test_malformed_selectors_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        LabelSelector.parse(text)


@pytest.mark.parametrize(
    ("text", "labels", "selected"),
    [
        ("team=search", {"team": "search"}, True),
        ("team=search", {"team": "ads"}, False),
        ("team=search", {}, False),
        ("team==search", {"team": "search", "x": "y"}, True),
        ("team!=search", {}, True),
        ("team!=search", {"team": "ads"}, True),
        ("team!=search", {"team": "search"}, False),
        ("team", {"team": ""}, True),
        ("team", {}, False),
        ("!canary", {}, True),
        ("!canary", {"canary": "false"}, False),
        ("team=", {"team": ""}, True),
        ("team=", {}, False),
        ("tier in (a,b)", {"tier": "b"}, True),
        ("tier in (a,b)", {"tier": "c"}, False),
        ("tier in (a,b)", {}, False),
        ("tier notin (a,b)", {"tier": "c"}, True),
        ("tier notin (a,b)", {}, True),
        ("tier notin (a,b)", {"tier": "a"}, False),
        ("shard>2", {"shard": "3"}, True),
        ("shard>2", {"shard": "2"}, False),
        ("shard>2", {"shard": "x"}, False),
        ("shard>2", {}, False),
        ("shard<2", {"shard": "-5"}, True),
        ("team=search,!canary", {"team": "search"}, True),
        ("team=search,!canary", {"team": "search", "canary": "1"}, False),
    ],
)
def test_matches_as_the_api_server_selects(
    text: str, labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector.parse(text).matches(labels) is selected
