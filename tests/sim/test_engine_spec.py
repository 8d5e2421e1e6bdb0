"""A scenario's stated engine (``fleet.engine``), closed-loop clients (``clients``) and the
checks that keep a request from ever meeting an engine that cannot hold it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cachescale.sim.clients import ChatClient, ClosedLoopClients, system_prompts
from cachescale.sim.clients_spec import ClientsSpec
from cachescale.sim.drive import run, run_together
from cachescale.sim.profiles import PROFILES, usable_blocks
from cachescale.sim.scenario import (
    Scenario,
    ScenarioError,
    load_builtin,
    load_file,
    replica_profile,
    stream_workload,
)

ENGINE = {
    "block_size": 32,
    "num_gpu_blocks": 64,
    "max_model_len": 1024,
    "max_num_batched_tokens": 2048,
    "step": {"t_fixed_s": 0.004, "t_prefill_token_s": 2e-5, "t_decode_seq_s": 3e-4},
}
CHAT = {
    "rate_per_s": 20.0,
    "layout": ["system", "history", "user"],
    "system_tokens": 100,
    "user_tokens": {"mean_tokens": 60, "min_tokens": 20, "max_tokens": 120},
    "output_tokens": {"mean_tokens": 60, "min_tokens": 20, "max_tokens": 120},
    "sessions": {"mean_turns": 30, "concurrent": 4},
}
"""An open-loop chat workload whose sessions would grow without end."""
COUNT = 6
CLIENTS: dict[str, Any] = {
    "count": COUNT,
    "first_user_tokens": [128, 384],
    "turns": [2, 6],
}


def _document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": "engine",
        "description": "A stated engine.",
        "duration_s": 20,
        "fleet": {
            "profile": "llama3-8b-a100",
            "replicas": 1,
            "max_num_seqs": 4,
            "pod_start_delay_s": 0,
            "engine": dict(ENGINE),
        },
        "clients": dict(CLIENTS),
    }
    document.update(changes)
    return document


def _load(tmp_path: Path, document: dict[str, Any]) -> Scenario:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return load_file(path)


def _refused(tmp_path: Path, document: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as error:
        _load(tmp_path, document)
    message = str(error.value)
    assert "Traceback" not in message
    assert str(tmp_path) in message
    return message


def test_the_engine_replaces_what_the_profile_derives(tmp_path: Path) -> None:
    profile = replica_profile(_load(tmp_path, _document()))
    assert (profile.block_size, profile.num_blocks) == (32, 63)
    assert profile.max_num_batched_tokens == 2048
    assert (profile.step.t_fixed_s, profile.step.t_kv_token_s) == (0.004, 0.0)
    assert usable_blocks(64) == 63


def test_a_scenario_without_an_engine_keeps_its_profile() -> None:
    scenario = load_builtin("steady")
    assert replica_profile(scenario) is PROFILES[scenario.fleet.profile]
    assert stream_workload(scenario) is scenario.workload
    assert scenario.fleet.engine is None
    assert scenario.clients is None


def test_the_workload_is_hashed_at_the_engines_block_size(tmp_path: Path) -> None:
    document = _document(workload=CHAT, duration_s=5)
    del document["clients"]
    scenario = _load(tmp_path, document)
    assert stream_workload(scenario).block_size == 32
    assert run(scenario, autoscaler=None).finished  # the engine takes what it is sent


def test_a_workload_block_size_other_than_the_engines_is_refused(tmp_path: Path) -> None:
    document = _document(workload={"block_size": 32})
    del document["clients"], document["fleet"]["engine"]
    message = _refused(tmp_path, document)
    assert "workload.block_size 32 differs from the engine's block size 16" in message
    assert "fleet.engine.block_size" in message


def test_a_pool_smaller_than_one_longest_request_is_refused(tmp_path: Path) -> None:
    document = _document()
    document["fleet"]["engine"]["num_gpu_blocks"] = 32  # 31 usable × 32 < 1024
    assert "31 usable blocks of 32 tokens" in _refused(tmp_path, document)


def test_a_small_pool_with_the_default_max_model_len_is_refused(tmp_path: Path) -> None:
    document = _document(workload={"rate_per_s": 2.0})
    del document["clients"]
    document["fleet"]["engine"] = {"num_gpu_blocks": 64}
    assert "max_model_len 8192" in _refused(tmp_path, document)


def test_max_num_seqs_above_the_token_budget_is_refused(tmp_path: Path) -> None:
    document = _document(sweep={"max_num_seqs": [2, 4096]})
    assert "max_num_seqs 4096 exceeds" in _refused(tmp_path, document)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"workload": {"rate_per_s": 1.0}}, "remove workload"),
        ({"perturbations": [{"kind": "rate", "at_s": 5, "rate_per_s": 1.0}]}, "do not apply"),
        ({"clients": {"count": 2, "first_user_tokens": [64, 1000]}}, "first turn can take"),
        ({"clients": {"count": 2, "turns": [5, 2]}}, "the first bound exceeds the second"),
    ],
)
def test_clients_that_cannot_run_are_refused(
    tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    assert expected in _refused(tmp_path, _document(**changes))


def test_a_workload_turn_past_max_model_len_is_refused(tmp_path: Path) -> None:
    document = _document(workload={"rate_per_s": 1.0})
    del document["clients"]
    assert "without any history, more than max_model_len 1024" in _refused(tmp_path, document)


def test_open_loop_conversations_restart_below_max_model_len(tmp_path: Path) -> None:
    """Sessions that would grow without end stay within max_model_len (and the pool)."""
    document = _document(workload=CHAT, duration_s=30)
    del document["clients"]
    document["fleet"]["max_num_seqs"] = 16
    finished = run(_load(tmp_path, document), autoscaler=None).finished
    lengths = [r.prompt_tokens + r.output_tokens for r in finished]
    assert max(lengths) <= 1024
    assert max(lengths) > 800  # conversations did grow to the cap


def _client(spec: ClientsSpec, index: int = 0, max_model_len: int = 1024) -> ChatClient:
    return ChatClient(spec, system_prompts(spec, 7), 7, index, max_model_len)


def test_a_turn_extends_the_last_prompt_and_its_answer() -> None:
    spec = ClientsSpec(count=1, turns=(3, 3))
    client = _client(spec)
    first, _ = client.next_turn()
    assert first[: spec.system_tokens] in system_prompts(spec, 7)
    client.answered([7, 8, 9])
    second, _ = client.next_turn()
    assert second[: len(first) + 3] == [*first, 7, 8, 9]
    assert spec.user_tokens[0] <= len(second) - len(first) - 3 <= spec.user_tokens[1]


def test_a_conversation_restarts_before_it_passes_max_model_len() -> None:
    spec = ClientsSpec(count=1, turns=(50, 50), first_user_tokens=(200, 200))
    client = _client(spec, max_model_len=600)
    lengths = []
    for _ in range(40):
        prompt, max_tokens = client.next_turn()
        lengths.append(len(prompt) + max_tokens)
        client.answered([5] * max_tokens)
    assert max(lengths) <= 600
    assert client.restarts > 0


def test_clients_are_seeded_by_scenario_seed_and_index() -> None:
    spec = ClientsSpec(count=2)
    assert _client(spec, 0).next_turn() == _client(spec, 0).next_turn()
    assert _client(spec, 0).next_turn() != _client(spec, 1).next_turn()


def test_closed_loop_clients_send_a_turn_only_after_their_answer(tmp_path: Path) -> None:
    scenario = _load(tmp_path, _document())
    finished = run(scenario, autoscaler=None).finished
    assert len(finished) > 3 * COUNT
    ends = sorted(r.finished_s for r in finished if r.finished_s is not None)
    for request in finished:
        in_flight = sum(
            1
            for other in finished
            if other.arrival_s <= request.arrival_s < (other.finished_s or float("inf"))
        )
        assert in_flight <= COUNT
        assert request.arrival_s == 0.0 or request.arrival_s in ends


def test_think_time_delays_the_next_turn() -> None:
    spec = ClientsSpec(count=1, think_time_s=2.0)
    clients = ClosedLoopClients(spec, 7, 32, 1024, until_s=60.0)
    request = clients.take()
    assert clients.next_arrival_s() == float("inf")
    request.finished_s = 1.5
    clients.answered(request, 1.5)
    assert clients.next_arrival_s() == 3.5


def test_closed_loop_runs_together_are_each_the_run_made_alone(tmp_path: Path) -> None:
    scenario = _load(tmp_path, _document(duration_s=5))
    alone = run(scenario, autoscaler=None).finished
    together = run_together([(scenario, None), (scenario, None)])
    for result in together:
        assert [(r.arrival_s, r.cached_tokens, r.finished_s) for r in result.finished] == [
            (r.arrival_s, r.cached_tokens, r.finished_s) for r in alone
        ]
