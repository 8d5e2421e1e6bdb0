"""``cachescale init``'s pure parts: which container is the engine, what its command line
says, the selectors tried, and the budget and SLO proposed from measured numbers (the
end-to-end path, on a real API server and Prometheus, is e2e/test_init.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cachescale.api.spec import Engine
from cachescale.commands.init import selector_candidates
from cachescale.commands.init_output import proposed_budget, proposed_slo
from cachescale.controller.target.draft_target import DraftError, EngineContainer, engine_container


def deployment(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": list(containers)}}}}


def test_the_engine_container_is_found_by_what_it_runs_and_its_flags_are_read() -> None:
    sidecar = {"name": "envoy", "image": "envoyproxy/envoy:v1.31"}
    engine = {
        "name": "server",
        "image": "vllm/vllm-openai:v0.13.0",
        "args": ["serve", "meta-llama/Llama-3.1-8B", "--served-model-name", "llama",
                 "--max-num-seqs=64", "--block-size", "32"],
    }  # fmt: skip
    found = engine_container(deployment(sidecar, engine), None)
    assert found == EngineContainer(
        name="server",
        engine=Engine.VLLM,
        model="meta-llama/Llama-3.1-8B",
        served_name="llama",
        max_num_seqs=64,
        block_size=32,
    )


def test_sglang_is_told_from_vllm_and_reads_its_own_flags() -> None:
    engine = {
        "name": "engine",
        "image": "lmsysorg/sglang:v0.5",
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--model-path", "Qwen/Qwen2.5-7B", "--max-running-requests", "48"],
    }
    found = engine_container(deployment(engine), None)
    assert found.engine is Engine.SGLANG
    assert found.model == "Qwen/Qwen2.5-7B"
    assert found.max_num_seqs == 48


def test_no_engine_container_names_the_ones_there() -> None:
    with pytest.raises(DraftError, match=r"\(it has: envoy, app\); name it with --container"):
        engine_container(deployment({"name": "envoy"}, {"name": "app", "image": "nginx"}), None)
    with pytest.raises(DraftError, match="no container 'vllm' \\(it has: envoy\\)"):
        engine_container(deployment({"name": "envoy"}), "vllm")


def test_a_flag_given_twice_is_refused_not_guessed() -> None:
    engine = {"name": "vllm", "args": ["--max-num-seqs", "8", "--max-num-seqs", "16"]}
    with pytest.raises(DraftError, match="given 2 times"):
        engine_container(deployment(engine), None)


def test_selectors_go_from_the_model_label_to_the_namespace() -> None:
    container = EngineContainer("vllm", Engine.VLLM, "org/model", "served", None, None)
    assert selector_candidates("llm", container) == [
        {"namespace": "llm", "model_name": "served"},
        {"namespace": "llm"},
    ]
    unnamed = EngineContainer("vllm", Engine.VLLM, None, None, None, None)
    assert selector_candidates("llm", unnamed) == [{"namespace": "llm"}]


@pytest.mark.parametrize(
    ("measured", "proposed"),
    [(0.21, 0.5), (0.43, 0.86), (0.432, 0.87), (1.234, 2.5), (7.9, 16.0), (450.0, 600.0)],
)
def test_the_slo_is_twice_the_measured_p95_rounded_up(measured: float, proposed: float) -> None:
    assert proposed_slo(measured) == proposed


def test_the_budget_is_the_measured_cost_plus_15_percent_rounded_up() -> None:
    assert proposed_budget(680.0) == 782
    assert proposed_budget(100.0) == 115
