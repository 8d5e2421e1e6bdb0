"""`cachescale validate` and the CRD give the same verdict on hundreds of mutated policies.

test_validation_rules.py checks each rule at its boundary, by hand; this file checks
agreement on a generated set (tests/api/mutations.py), so a field whose pydantic type and
CRD schema drift apart (a bound on one side only, a coercion the API server would not
make) fails here even when nobody wrote a case for it. Validate is stricter only where
mutations.STRICTER_THAN_THE_SERVER says why; e2e/test_validate_agrees.py checks the same
set against a real API server.
"""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.api.crd import build_crd
from cachescale.api.validation import problems_in_document
from tests.api.crd_emulation import crd_errors
from tests.api.mutations import FULL_POLICY, STRICTER_THAN_THE_SERVER, mutated_policies

MUTATED = list(mutated_policies())


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


def test_the_set_is_large_and_the_full_policy_is_valid(crd: dict[str, Any]) -> None:
    assert len(MUTATED) >= 100
    assert problems_in_document(FULL_POLICY, 1) == []
    assert crd_errors(crd, FULL_POLICY) == []


@pytest.mark.parametrize(("ident", "policy"), MUTATED, ids=[m[0] for m in MUTATED])
def test_validate_and_the_crd_agree(
    crd: dict[str, Any], ident: str, policy: dict[str, Any]
) -> None:
    problems = problems_in_document(policy, 1)
    errors = crd_errors(crd, policy)
    if ident in STRICTER_THAN_THE_SERVER:
        assert problems, STRICTER_THAN_THE_SERVER[ident]
        assert not errors, errors
    else:
        assert (not problems) == (not errors), (problems, errors)
