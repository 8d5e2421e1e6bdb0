"""Mutated policies: every field of a full policy, each replaced by a wrong (or edge) value.

One full policy (every spec field written out) is changed one field at a time: left out,
replaced by a value of another type, quoted, negated, zeroed, made huge or infinite, or,
for strings, emptied, padded or re-cased. The set is generated, not hand-picked, so a
field added to the models is mutated too. Tests compare what ``cachescale validate`` and
the CRD say about each one; the same set can be sent to a real API server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

FULL_POLICY: dict[str, Any] = {
    "apiVersion": "cachescale.dev/v1alpha1",
    "kind": "CacheScalingPolicy",
    "metadata": {"name": "full", "namespace": "llm"},
    "spec": {
        "mode": "Advise",
        "target": {
            "deploymentName": "llama",
            "containerName": "vllm",
            "hpaName": "llama",
            "engine": "vllm",
        },
        "metrics": {
            "prometheusUrl": "http://prometheus:9090",
            "selector": {"namespace": "llm"},
            "window": "5m",
            "interval": "30s",
            "demandQuery": "sum(rate(requests_total[5m]))",
        },
        "slo": {"ttftP95Seconds": 1.0, "ttftP99Seconds": 2.0},
        "budget": {"gpuSecondsPer1kRequests": 900.0, "minReplicas": 2, "maxReplicas": 4},
        "cache": {
            "collapseRelativeDrop": 0.5,
            "collapseAbsoluteDrop": 0.2,
            "collapseWindows": 3,
            "podWarmupSeconds": 600,
            "onCollapse": "Hold",
        },
        "batching": {
            "manageMaxNumSeqs": True,
            "minNumSeqs": 8,
            "maxNumSeqs": 256,
            "model": {
                "layers": 32,
                "kvHeads": 8,
                "headDim": 128,
                "kvDtypeBytes": 2,
                "weightsGiB": 16.0,
            },
            "gpu": {"memoryGiB": 80.0, "gpuMemoryUtilization": 0.9},
            "cacheReserveGiB": 2.0,
            "cooldown": "30m",
        },
        "restoreOnDelete": True,
    },
}

STRICTER_THAN_THE_SERVER: dict[str, str] = {
    "metrics.selector.namespace-3": (
        "a selector value left empty (`namespace:` with nothing after it, a YAML null): "
        "the API server drops null map values before it validates, so no CRD rule can "
        "see it, and it stores the selector without that label, which can widen what "
        "the policy reads; validate refuses it as it refuses an empty string there"
    ),
}
"""Mutations validate rejects and the API server accepts, by id: why each is right."""

_LEFT_OUT = object()


def _leaves(node: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path, node


def _wrong_values(value: Any) -> list[Any]:
    common: list[Any] = [_LEFT_OUT, [], {}, None]
    if isinstance(value, bool):
        return [*common, "true", 1, 0, not value]
    if isinstance(value, int):
        return [*common, str(value), True, -1, 0, 10**9, float("inf"), value + 0.5]
    if isinstance(value, float):
        return [*common, str(value), True, -1.0, 0, 1e12, float("inf"), 1]
    if isinstance(value, str):
        return [*common, "", "a" * 300, 5, f" {value}", value.upper(), "99999999999h"]
    return common


def mutated_policies() -> Iterator[tuple[str, dict[str, Any]]]:
    """``(id, policy)`` for every field of ``FULL_POLICY`` and every wrong value for it."""
    for path, value in _leaves(FULL_POLICY["spec"], ("spec",)):
        for index, wrong in enumerate(_wrong_values(value)):
            policy = copy.deepcopy(FULL_POLICY)
            node = policy
            for key in path[:-1]:
                node = node[key]
            if wrong is _LEFT_OUT:
                del node[path[-1]]
            else:
                node[path[-1]] = wrong
            yield f"{'.'.join(path[1:])}-{index}", policy
