"""``decide`` on the extreme specs the API server admits: a number, not an exception.

The CRD and the spec model bound most fields, but not every float from above
(``gpuSecondsPer1kRequests``, ``memoryGiB``, ``weightsGiB``, ``cacheReserveGiB``): a
policy may carry ``1e308``. Each case here was found by feeding such specs to a healthy
fleet (docs/security.md); before the fix, every case but the smallest budget raised
(``OverflowError``, or ``ValueError`` for a GPU memory that rounds to 0 bytes) on every
evaluation, so the policy never got a status.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from cachescale.decide.diagnosis import batch_ceiling, budget_replicas
from tests.decide.decide_builders import BATCHING, run, snapshot, spec

HUGE = 1e308
LARGEST_MODEL = {"layers": 1024, "kvHeads": 1024, "headDim": 4096, "kvDtypeBytes": 4}
EXTREMES: dict[str, dict[str, Any]] = {
    "a budget near float max": {"budget": {"gpuSecondsPer1kRequests": HUGE}},
    "the largest float budget": {
        "budget": {"gpuSecondsPer1kRequests": sys.float_info.max, "maxReplicas": 10_000}
    },
    "the smallest positive budget": {"budget": {"gpuSecondsPer1kRequests": 5e-324}},
    "GPU memory near float max": {"batching": {**BATCHING, "gpu": {"memoryGiB": HUGE}}},
    "weights near float max": {
        "batching": {**BATCHING, "model": {**BATCHING["model"], "weightsGiB": HUGE}}
    },
    "GPU memory of the smallest float": {"batching": {**BATCHING, "gpu": {"memoryGiB": 5e-324}}},
    "a cache reserve near float max": {"batching": {**BATCHING, "cacheReserveGiB": HUGE}},
    "the largest model, the widest ceiling": {
        "batching": {
            **BATCHING,
            "model": {**LARGEST_MODEL, "weightsGiB": 5e-324},
            "gpu": {"memoryGiB": HUGE, "gpuMemoryUtilization": 5e-324},
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
