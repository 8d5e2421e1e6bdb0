"""Generated hostile values for ``spec.target``'s autoscaler names and
``spec.cache.promptSources``: `cachescale validate` and the CRD give the same verdict.

test_validation_rules.py checks each bound by hand; here hypothesis (derandomized, so a run
is repeatable) writes both-or-neither autoscaler names, names that are huge, empty, padded,
upper-case, unicode or PromQL, and prompt-source lists that are too long, hold the wrong
types, or items with a field missing or replaced. The one class where validate is stricter
is a label selector that does not parse: the CRD bounds its length only, and the operator
reports it as InvalidSpec (test_validation_rules.py, ``a_malformed_prompt_source``).
e2e/test_hostile_specs.py sends the same kind of values to a real API server.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachescale.api.crd import build_crd
from cachescale.api.spec import MAX_PROMPT_SOURCES
from cachescale.api.validation import problems_in_document
from tests.api.crd_emulation import crd_errors
from tests.api.test_validation_rules import RAG, base_policy

CRD = build_crd()
NAMES = st.one_of(
    st.sampled_from(["llama", "llama.keda", "a" * 253, "a" * 254, "a" * 70_000, "", "Llama"]),
    st.sampled_from(["llama_keda", "llama-", "-llama", ".llama", "llama\n", " llama", "llamá"]),
    st.sampled_from(['llama"} or vector(1) #', "../llama", "keda/llama", "0", "1.2.3"]),
    st.text(max_size=20),
)
WRONG_TYPES = st.one_of(st.integers(), st.booleans(), st.none(), st.just([]), st.just({}))
SELECTORS = st.one_of(
    st.sampled_from(["app=rag-api", "app in (a,b)", "!canary", "app", "tier notin (x)"]),
    st.sampled_from(["app in (a", "=x", "a==", "a=b,", "app=" + "x" * 64, "a" * 1025]),
    st.text(max_size=30),
)
FIELD_VALUES = {
    "namespace": st.one_of(NAMES, WRONG_TYPES),
    "kind": st.one_of(
        st.sampled_from(["Deployment", "ConfigMap", "Secret", "Pod", "deployment", " Secret"]),
        st.text(max_size=12),
        WRONG_TYPES,
    ),
    "labelSelector": st.one_of(SELECTORS, WRONG_TYPES),
}


@st.composite
def prompt_source(draw: st.DrawFn) -> Any:
    """A valid item with one or two fields replaced or removed, or not an object at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(WRONG_TYPES, st.just("app=rag-api"), st.just([dict(RAG)])))
    item: dict[str, Any] = dict(RAG)
    for key in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=2, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            del item[key]
        else:
            item[key] = draw(FIELD_VALUES[key])
    return item


@st.composite
def hostile_policy(draw: st.DrawFn) -> dict[str, Any]:
    """A valid policy with its autoscaler names, its prompt sources, or both made hostile."""
    policy = base_policy()
    where = draw(st.sampled_from(["target", "sources", "both"]))
    if where != "sources":
        target = policy["spec"]["target"]
        target.pop("hpaName")
        for key in draw(st.permutations(["hpaName", "scaledObjectName"]))[
            : draw(st.integers(1, 2))
        ]:
            target[key] = draw(st.one_of(st.just("llama"), NAMES, WRONG_TYPES))
    if where != "target":
        policy["spec"]["cache"] = {
            "promptSources": draw(
                st.one_of(
                    st.lists(prompt_source(), max_size=MAX_PROMPT_SOURCES + 2),
                    st.lists(st.just(dict(RAG)), min_size=MAX_PROMPT_SOURCES - 1, max_size=40),
                    WRONG_TYPES,
                    st.just(dict(RAG)),
                )
            )
        }
    return policy


def validate_only(problems: list[Any]) -> bool:
    """Every problem is a label selector that does not parse (the operator's check)."""
    return bool(problems) and all(
        p.path.endswith(".labelSelector") and "is not a label selector" in p.message
        for p in problems
    )


@settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(hostile_policy())
def test_validate_and_the_crd_agree_on_autoscaler_names_and_prompt_sources(
    policy: dict[str, Any],
) -> None:
    problems = problems_in_document(policy, 1)
    errors = crd_errors(CRD, policy)
    if errors or not validate_only(problems):
        assert bool(problems) == bool(errors), (problems, errors)
    for problem in problems:  # one line each, naming the field the user wrote
        assert problem.path.startswith(("spec.target", "spec.cache")), problem
        assert "\n" not in problem.message, problem


@pytest.mark.parametrize(
    "target",
    [
        {"deploymentName": "llama"},
        {"deploymentName": "llama", "hpaName": "llama", "scaledObjectName": "llama"},
        {"deploymentName": "llama", "hpaName": None, "scaledObjectName": None},
    ],
    ids=["neither", "both", "both-null"],
)
def test_both_or_neither_says_which_and_the_crd_says_the_same(target: dict[str, Any]) -> None:
    policy = base_policy()
    policy["spec"]["target"] = target
    (problem,) = problems_in_document(policy, 1)
    (error,) = crd_errors(CRD, policy)
    assert problem.path == "spec.target", problem
    assert "set exactly one of hpaName" in problem.message
    assert "both are set" in problem.message or "neither is set" in problem.message
    assert error.endswith(problem.message.split(";")[0]), (error, problem)
