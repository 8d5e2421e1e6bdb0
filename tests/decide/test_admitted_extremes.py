"""``decide`` on the extreme specs the API server admits: a number, not an exception.

Every spec float is bounded (``api/spec.py``: ``MAX_GIB``, ``MAX_GPU_SECONDS_PER_1K``)
and every ``gt=0`` one admits the smallest positive float. Each case is a corner of that
box fed to a healthy fleet (docs/security.md): a GPU memory that rounds to 0 bytes once
raised ``ValueError`` on every evaluation, so the policy never got a status.
"""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.api.spec import MAX_GIB, MAX_GPU_SECONDS_PER_1K
from cachescale.decide.checks import batch_ceiling, budget_replicas
from tests.decide.decide_builders import BATCHING, run, snapshot, spec

TINY = 5e-324
"""The smallest positive float: every ``gt=0`` field admits it."""
LARGEST_MODEL = {"layers": 1024, "kvHeads": 1024, "headDim": 4096, "kvDtypeBytes": 4}
EXTREMES: dict[str, dict[str, Any]] = {
    "the largest budget": {
        "budget": {"gpuSecondsPer1kRequests": MAX_GPU_SECONDS_PER_1K, "maxReplicas": 10_000}
    },
    "the smallest positive budget": {"budget": {"gpuSecondsPer1kRequests": TINY}},
    "the largest GPU memory": {"batching": {**BATCHING, "gpu": {"memoryGiB": MAX_GIB}}},
    "the largest weights, on the largest GPU": {
        "batching": {
            **BATCHING,
            "model": {**BATCHING["model"], "weightsGiB": MAX_GIB * 0.5},
            "gpu": {"memoryGiB": MAX_GIB},
        }
    },
    "the smallest weights, on the smallest GPU": {
        "batching": {
            **BATCHING,
            "model": {**BATCHING["model"], "weightsGiB": TINY},
            "gpu": {"memoryGiB": TINY * 4},
        }
    },
    "the largest cache reserve": {
        "batching": {**BATCHING, "cacheReserveGiB": MAX_GIB, "gpu": {"memoryGiB": MAX_GIB}}
    },
    "the largest model, the widest ceiling": {
        "batching": {
            **BATCHING,
            "model": {**LARGEST_MODEL, "weightsGiB": TINY},
            "gpu": {"memoryGiB": MAX_GIB, "gpuMemoryUtilization": TINY * 4},
            "minNumSeqs": 1,
            "maxNumSeqs": 65_536,
        }
    },
}


@pytest.mark.parametrize("overrides", EXTREMES.values(), ids=EXTREMES.keys())
def test_decide_never_raises_on_an_admitted_spec(overrides: dict[str, Any]) -> None:
    policy = spec(**overrides)
    fleet = snapshot()
    cap = budget_replicas(policy, fleet)
    assert cap is None or cap >= 0
    ceiling = batch_ceiling(policy, fleet)
    assert ceiling is None or ceiling >= 1
    for decision in run(policy, [fleet] * 12):
        envelope = decision.envelope
        assert policy.budget.min_replicas <= envelope.min_replicas <= envelope.max_replicas
        assert envelope.max_replicas <= policy.budget.max_replicas
        if decision.max_num_seqs is not None:
            assert 1 <= decision.max_num_seqs <= policy.batching.max_num_seqs
