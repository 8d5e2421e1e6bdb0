"""The request stream's schema: layouts and fields are validated, perturbations parse."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from cachescale.sim.traffic_spec import (
    ChunkSizeChange,
    LayoutChange,
    LengthDist,
    Perturbation,
    RetrievalAheadOfHistory,
    TenantSpec,
    WorkloadSpec,
)


def test_layout_and_fields_are_validated() -> None:
    with pytest.raises(ValidationError, match="twice"):
        WorkloadSpec(layout=("user", "docs", "user"))
    with pytest.raises(ValidationError, match="user"):
        WorkloadSpec(layout=("docs", "system"))
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate({"rate": 3})
    with pytest.raises(ValidationError):
        LengthDist(mean_tokens=10, min_tokens=20, max_tokens=5)
    with pytest.raises(ValidationError, match="unique"):
        WorkloadSpec(tenants=(TenantSpec(name="a"), TenantSpec(name="a")))


def test_perturbations_parse_from_yaml_shaped_dicts() -> None:
    adapter: TypeAdapter[list[Perturbation]] = TypeAdapter(list[Perturbation])
    parsed = adapter.validate_python(
        [
            {"kind": "chunk_size", "at_s": 10, "chunk_size": 500},
            {"kind": "retrieval_per_turn_ahead_of_history", "at_s": 10},
            {"kind": "layout", "at_s": 5, "layout": ["docs", "user"]},
        ]
    )
    assert isinstance(parsed[0], ChunkSizeChange)
    assert isinstance(parsed[1], RetrievalAheadOfHistory)
    assert isinstance(parsed[2], LayoutChange)
    assert parsed[2].layout == ("docs", "user")
    with pytest.raises(ValidationError):
        adapter.validate_python([{"kind": "rolling_restart", "at_s": 1}])
