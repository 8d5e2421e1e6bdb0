"""Size limits: every field a policy author writes is bounded, and the largest admissible
spec is small.

The rule (docs/security.md, "Size limits"): a policy can be no larger
than ``MAX_SPEC_BYTES`` as the API server stores it, whatever its author writes, so kopf's
annotations, the status that quotes it and every watch event stay small. Two checks hold
it: every string, list and map of the generated CRD's spec carries a bound (so no field
added later escapes), and the maximal spec, built from those bounds with the character
that costs the most bytes where a field allows it, is admitted by the model and the CRD
and measured in JSON as Go's encoder writes it (``<``, ``>`` and ``&`` become ``\\u003c``:
six bytes for one character).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from cachescale.api.crd import build_crd
from cachescale.api.durations import parse_duration_seconds
from cachescale.api.policy import CacheScalingPolicy
from cachescale.api.spec import (
    MAX_DEMAND_QUERY,
    MAX_LABEL,
    MAX_LABEL_SELECTOR,
    MAX_NAME,
    MAX_PROMPT_SOURCES,
    MAX_SELECTOR_KEY,
    MAX_SELECTOR_LABELS,
    MAX_SELECTOR_VALUE,
    MAX_URL,
)
from tests.api.crd_emulation import crd_errors
from tests.api.test_crd import walk

MAX_SPEC_BYTES = 64 * 1024
"""The bound the limits are chosen for (the maximal spec measures well under it)."""
COSTLY = "<"
"""One character, six bytes in the API server's JSON (``\\u003c``)."""
GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028"}


def go_json_bytes(value: Any) -> int:
    """Bytes of ``value`` as JSON written by Go's encoding/json (the API server's and
    etcd's encoding of a custom resource): HTML characters and U+2028 escaped too."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in GO_ESCAPES.items():
        text = text.replace(char, escaped)
    return len(text.encode("utf-8"))


def longest_duration(text: str) -> str:
    """``text`` (a duration such as 24h) padded with leading zeros to the 32-character
    bound every duration field has: the same duration, the longest spelling of it."""
    return text.rjust(32, "0")


def distinct_keys(count: int, length: int) -> list[str]:
    """``count`` different Prometheus label names of ``length`` characters."""
    return [f"k{index:0{length - 1}d}" for index in range(count)]


def maximal_label_selector() -> str:
    """The longest prompt-source label selector, dense in the costly character: ``a<1``
    requirements (``key<N`` is part of the grammar), one digit longer at the end."""
    count = MAX_LABEL_SELECTOR // 4
    return ",".join(["a<1"] * (count - 1) + ["a<1" + "1" * (MAX_LABEL_SELECTOR - 4 * count + 1)])


def maximal_spec() -> dict[str, Any]:
    """The largest spec the model admits: every bounded string at its bound (with the
    costly character where the field allows any), every list and map full, every
    optional field written."""
    secret = {"name": "s" * MAX_NAME, "key": "k" * MAX_NAME}
    source = {"namespace": "n" * MAX_LABEL, "kind": "Deployment"}
    return {
        "mode": "Enforce",
        "target": {
            "deploymentName": "d" * MAX_NAME,
            "containerName": "c" * MAX_LABEL,
            "hpaName": "h" * MAX_NAME,
            "engine": "sglang",
        },
        "metrics": {
            "prometheusUrl": "https://" + "p" * (MAX_URL - len("https://")),
            "auth": {
                "bearerTokenSecretRef": secret,
                "caSecretRef": secret,
                "insecureSkipVerify": False,
            },
            "selector": dict.fromkeys(
                distinct_keys(MAX_SELECTOR_LABELS, MAX_SELECTOR_KEY), COSTLY * MAX_SELECTOR_VALUE
            ),
            "window": longest_duration("24h"),
            "interval": longest_duration("4m"),
            "demandQuery": COSTLY * MAX_DEMAND_QUERY,
        },
        "slo": {"ttftP95Seconds": 1.2345678901234567, "ttftP99Seconds": 2.3456789012345678},
        "budget": {
            "gpuSecondsPer1kRequests": 1.2345678901234567e-300,
            "minReplicas": 10_000,
            "maxReplicas": 10_000,
        },
        "cache": {
            "collapseRelativeDrop": 0.12345678901234567,
            "collapseAbsoluteDrop": 0.12345678901234567,
            "collapseWindows": 100,
            "podWarmupSeconds": 86_400,
            "onCollapse": "ScaleAsUsual",
            "tenancy": "SingleTenant",
            "promptSources": [
                {**source, "labelSelector": maximal_label_selector()}
                for _ in range(MAX_PROMPT_SOURCES)
            ],
        },
        "batching": {
            "manageMaxNumSeqs": True,
            "minNumSeqs": 65_536,
            "maxNumSeqs": 65_536,
            "model": {
                "layers": 1024,
                "kvHeads": 1024,
                "headDim": 4096,
                "kvDtypeBytes": 4,
                "weightsGiB": 1.2345678901234567e-300,
            },
            "gpu": {"memoryGiB": 16_383.123456789012, "gpuMemoryUtilization": 0.9876543210987654},
            "cacheReserveGiB": 16_383.123456789012,
            "cooldown": longest_duration("168h"),
        },
        "restoreOnDelete": True,
    }


def policy(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": "p" * 63, "namespace": "n" * 63},
        "spec": spec,
    }


def test_every_spec_field_is_bounded() -> None:
    """No string without maxLength (or an enum), no list without maxItems, no map without
    maxProperties: a field added without a bound fails here."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unbounded = []
    for path, node in walk(schema["properties"]["spec"], ".spec"):
        bound = {"string": "maxLength", "array": "maxItems", "object": "maxProperties"}
        kind = node.get("type")
        if kind == "string" and "enum" in node:
            continue  # an enum is bounded by its longest value
        if kind == "object" and "additionalProperties" not in node:
            continue  # fixed fields, each checked on its own
        if kind in bound and bound[kind] not in node:
            unbounded.append(path)
    assert unbounded == []


def test_the_maximal_spec_is_admitted_and_small() -> None:
    spec = maximal_spec()
    document = policy(spec)
    CacheScalingPolicy.model_validate(document)  # the model admits it...
    assert crd_errors(build_crd(), document) == []  # ...and so does the CRD
    assert parse_duration_seconds(spec["metrics"]["window"]) == 24 * 3600
    stored = go_json_bytes(spec)
    plain = len(json.dumps(spec, separators=(",", ":")).replace("<", "a").encode())
    print(f"\nmaximal spec: {stored} bytes as stored, {plain} in plain ASCII")
    assert stored < MAX_SPEC_BYTES
    assert stored > MAX_SPEC_BYTES // 2, "the maximal spec is built from every limit"


def test_one_more_of_anything_is_refused() -> None:
    """Each limit used above is the edge: one character, item or label more is refused by
    both the model and the CRD, naming the field."""
    crd = build_crd()
    over: dict[str, tuple[tuple[str, ...], Any]] = {
        "selector": (("metrics", "selector"), None),
        "demandQuery": (("metrics", "demandQuery"), COSTLY * (MAX_DEMAND_QUERY + 1)),
        "prometheusUrl": (("metrics", "prometheusUrl"), "https://" + "p" * (MAX_URL - 7)),
        "promptSources": (("cache", "promptSources"), None),
        "labelSelector": (("cache", "promptSources"), None),
    }
    for word, (where, value) in over.items():
        spec = maximal_spec()
        parent = spec[where[0]]
        if word == "selector":
            parent["selector"]["k" * MAX_SELECTOR_KEY] = "v"
        elif word == "promptSources":
            parent["promptSources"].append(dict(parent["promptSources"][0]))
        elif word == "labelSelector":
            parent["promptSources"][3]["labelSelector"] += "1"
        else:
            parent[where[1]] = value
        document = policy(spec)
        errors = crd_errors(crd, document)
        assert errors, f"{word}: the CRD admits one more"
        assert all(word in error for error in errors), (word, errors)
        with pytest.raises(ValidationError) as refused:
            CacheScalingPolicy.model_validate(document)
        assert word in str(refused.value), (word, str(refused.value)[:300])
