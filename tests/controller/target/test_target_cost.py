"""The pods the operator counts as holding GPUs: the Deployment's, starting ones included."""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.controller.target.workload import Target
from tests.decide.decide_builders import workload


def target(status: dict[str, Any]) -> Target:
    return Target(
        deployment={"spec": {"replicas": 14}, "status": status},
        autoscaler={},
        state=workload(),
        pod_ages={},
        container_index=0,
        flag=None,
        metric_index=None,
        max_num_seqs_changed_at=None,
    )


@pytest.mark.parametrize(
    ("status", "held"),
    [
        # A scale-out from 10 to 14: 4 pods start (loading weights, not ready) and hold
        # their GPUs already; cost counts them, where the ready count would not.
        ({"replicas": 14, "readyReplicas": 10}, 14),
        ({}, 0),  # scaled to 0: the API server leaves the counts out
    ],
)
def test_cost_counts_every_pod_of_the_deployment_not_only_ready_ones(
    status: dict[str, Any], held: int
) -> None:
    assert target(status).pods_holding_gpus == held
