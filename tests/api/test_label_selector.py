"""Label selectors: the API server's grammar, refused before anything is sent when wrong
(``api/label_selector.py``)."""

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
