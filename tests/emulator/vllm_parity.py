"""What a ``vllm:`` exposition is made of, and the comparison of the emulator's with vLLM's.

A family's shape is what a dashboard or a PromQL query depends on: its type, its label
keys, the values of its enumerated labels (``finished_reason``, ``reason``, ``source``,
``sleep_state``) and a histogram's bucket bounds. ``differences`` lists where the
emulator's shapes depart from a real vLLM's (a recorded fixture in
``tests/emulator/test_vllm_parity.py``, a live server in
``referee/test_emulator_parity.py``): a family of vLLM's the emulator neither serves nor
lists in ``NOT_EXPOSED``, one served otherwise, or one vLLM does not have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachescale.sim.fleet import Fleet, RouterKind
from cachescale.sim.metrics import ReplicaSeries
from cachescale.sim.profiles import get_profile
from cachescale.sim.traffic import Traffic
from cachescale.sim.traffic_spec import WorkloadSpec
from cachescale.sim.vllm_metrics import VllmReplicaCollector

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/emulator/fixtures/vllm-0.32.0-metrics.txt"
"""Real vLLM 0.32.0's ``/metrics`` after a few completions (docs/emulator.md says how)."""
DOC = REPO / "docs/emulator.md"
ENUMERATED_LABELS = frozenset({"finished_reason", "reason", "source", "sleep_state"})
"""Labels whose values are a fixed set a query selects on (the rest name a model or a
configuration)."""
FIXTURE_MAX_MODEL_LEN = 1024
"""The recorded server's ``--max-model-len``, which caps vLLM's token buckets."""


@dataclass(frozen=True)
class Shape:
    """One family as a query sees it."""

    type: str
    label_keys: frozenset[str]
    label_values: tuple[tuple[str, frozenset[str]], ...]
    """Each enumerated label's values."""
    buckets: frozenset[str]
    """A histogram's ``le`` values (empty for other types)."""


def shapes(text: str) -> dict[str, Shape]:
    """The ``vllm:`` families of an exposition, by family name (counters without
    ``_total``, as prometheus_client's parser names them). The ``X_created`` gauges
    prometheus_client writes beside counters and histograms in the text format are not
    families of their own here: they are timestamps no query reads (the emulator writes
    none)."""
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")]
    names = {family.name for family in families}
    out: dict[str, Shape] = {}
    for family in families:
        if family.name.endswith("_created") and family.name.removesuffix("_created") in names:
            continue
        keys: set[str] = set()
        values: dict[str, set[str]] = {}
        buckets: set[str] = set()
        for sample in family.samples:
            labels = dict(sample.labels)
            if "le" in labels:
                buckets.add(labels.pop("le"))
            keys.update(labels)
            for key in ENUMERATED_LABELS & labels.keys():
                values.setdefault(key, set()).add(labels[key])
        out[family.name] = Shape(
            family.type,
            frozenset(keys),
            tuple(sorted((key, frozenset(found)) for key, found in values.items())),
            frozenset(buckets),
        )
    return out


def differences(
    real: Mapping[str, Shape], emulated: Mapping[str, Shape], not_exposed: Mapping[str, str]
) -> list[str]:
    """Every way the emulated families depart from the real ones, one line each."""
    out: list[str] = []
    for name, shape in sorted(real.items()):
        if name in not_exposed:
            if name in emulated:
                out.append(f"{name}: listed as not served, but served")
        elif name not in emulated:
            out.append(f"{name}: not served and not listed in NOT_EXPOSED")
        elif emulated[name] != shape:
            out.append(f"{name}: served as {emulated[name]}, vLLM has {shape}")
    out.extend(
        f"{name}: served, but vLLM has no such family" for name in sorted(set(emulated) - set(real))
    )
    out.extend(
        f"{name}: in NOT_EXPOSED, but vLLM has no such family"
        for name in sorted(set(not_exposed) - set(real))
    )
    return out


def emulated_exposition(max_model_len: int = FIXTURE_MAX_MODEL_LEN) -> str:
    """One simulated pod's ``/metrics`` after a minute of traffic, its token buckets capped
    at ``max_model_len`` (as vLLM caps them at its ``--max-model-len``)."""
    fleet = Fleet(get_profile("llama3-8b-a100"), 32, RouterKind.ROUND_ROBIN, 0.0, 1)
    pod = fleet.pods[0]
    pod.series = ReplicaSeries(max_model_len)
    for request in Traffic(WorkloadSpec(rate_per_s=4), seed=5, until_s=60.0):
        fleet.route(request)
    fleet.advance_to(300.0)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(VllmReplicaCollector(pod.engine, pod.series, "tiny"))
    return generate_latest(registry).decode()


def documented_not_exposed(doc: str) -> tuple[dict[str, str], tuple[int, int]]:
    """The families docs/emulator.md's "Parity with real vLLM" lists as not served (its
    table's first column), and the section's "N of M" figure."""
    section = doc.split("## Parity with real vLLM", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(vllm:[a-z_:]+)` \| (.+?) \|$", section, flags=re.MULTILINE)
    figure = re.search(r"serves\s+\*\*(\d+) of the (\d+)\*\*\s+`vllm:` families", section)
    assert figure is not None, "no 'serves **N of the M** `vllm:` families' in the section"
    return dict(rows), (int(figure[1]), int(figure[2]))
