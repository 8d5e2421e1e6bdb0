"""The built-in scenarios reproduce the brief's mechanics (acceptance of the simulator).

Each test runs a real scenario through the real engine, workload, fleet and HPA with the
scenario's fixed seed and checks the emergent numbers; nothing here is scripted. The long
runs under the HPA alone (the two-hour incident among them) are the session's shared
closed-loop runs (``tests/sim/closed_loop.py``), read here as ``cachescale simulate
--json`` reports them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.bench_decisions import scenario_file
from cachescale.commands.simulate import SimulationRequest, simulate
from cachescale.sim.scenario import builtin_names, load_builtin, load_file
from tests.sim.closed_loop import LoopSummary

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    "batch-pressure",
    "batch-pressure-loop",
    "collapse-with-growth",
    "demand-step",
    "metrics-outage",
    "outage-rising-demand",
    "cold-dilution",
    "rag-rechunk",
    "rag-rechunk-keda",
    "rechunk-heals",
    "rolling-deploy",
    "scaleout-round-robin",
    "shuffled-long-tools",
    "shuffled-tools",
    "sliding-window",
    "steady",
    "traffic-doubling",
    "unique-prefixes",
}


def hpa_report(loops: dict[str, LoopSummary], name: str) -> dict[str, Any]:
    """The HPA-alone run of a built-in scenario, as ``simulate --json`` reports it."""
    report = loops[f"{name}/hpa"].report
    assert report is not None, f"{name}/hpa is run without its report (closed_loop.py)"
    return report


@pytest.fixture(scope="session")
def incident(loops: dict[str, LoopSummary]) -> dict[str, Any]:
    return hpa_report(loops, "rag-rechunk")


def test_every_builtin_ships_as_an_example_file() -> None:
    assert set(builtin_names()) == EXPECTED
    for name in EXPECTED:
        packaged = REPO / "operator" / "cachescale" / "sim" / "scenarios" / f"{name}.yaml"
        example = REPO / "examples" / "scenarios" / f"{name}.yaml"
        assert example.read_text() == packaged.read_text(), f"examples/scenarios/{name}.yaml"
        assert load_file(example) == load_builtin(name)


@pytest.mark.parametrize(
    "path", sorted((REPO / "bench" / "scenarios").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_unseen_bench_scenario_is_a_closed_loop_file(path: Path) -> None:
    """``bench/scenarios/`` holds shapes no rule was tuned on, for ``bench.bench_decisions
    --scenario-files``: each must be a file that flag takes (a loadable closed-loop
    scenario), not shadow a built-in, and change nothing for its first half hour (the
    policy starts at 900 s and learns its baseline from steady traffic)."""
    _, scenario = scenario_file(str(path))
    assert scenario.name == path.stem
    assert scenario.name not in EXPECTED
    assert scenario.perturbations
    assert min(p.at_s for p in scenario.perturbations) >= 1800


@pytest.mark.slow
def test_incident_hit_rate_collapses(incident: dict[str, Any]) -> None:
    assert incident["before"]["token_hit_rate"] >= 0.8
    assert incident["after"]["token_hit_rate"] <= 0.1


@pytest.mark.slow
def test_incident_hpa_buys_replicas_at_flat_traffic(incident: dict[str, Any]) -> None:
    before, after = incident["before"], incident["after"]
    assert after["replicas"] >= 1.5 * before["replicas"]
    assert abs(after["req_per_s"] - before["req_per_s"]) <= 0.05 * before["req_per_s"]
    assert after["gpu_s_per_1k"] >= 1.5 * before["gpu_s_per_1k"]


@pytest.mark.slow
def test_incident_slo_stays_green_after_the_spike(incident: dict[str, Any]) -> None:
    slo = load_builtin("rag-rechunk").report.slo_ttft_p95_s
    assert incident["after"]["ttft_p95_s"] < slo
    spike = max(row["ttft_p95_s"] or 0.0 for row in incident["timeline"])
    assert spike > slo  # it did spike for a while, as in the incident
    assert incident["alerts"] == []  # the HPA has no notion of a cache collapse


@pytest.mark.slow
def test_incident_request_share_hides_behind_token_rate(incident: dict[str, Any]) -> None:
    before = incident["before"]
    # A long shared preamble with a short unique tail: tokens hit, many requests still prefill.
    assert before["request_hit_share"] < before["token_hit_rate"] - 0.1


@pytest.mark.slow
def test_rechunk_alone_heals_within_ten_minutes(loops: dict[str, LoopSummary]) -> None:
    run = hpa_report(loops, "rechunk-heals")
    change = run["change_at_s"]
    before = run["before"]["token_hit_rate"]
    after_change = [row for row in run["timeline"] if row["t_s"] >= change]
    dip = min(row["token_hit_rate"] for row in after_change[:4])
    assert dip < 0.9 * before  # the new chunks miss once...
    healed = [row for row in after_change if row["t_s"] <= change + 600]
    assert healed[-1]["token_hit_rate"] >= 0.9 * before  # ...then the cache refills
    assert run["after"]["token_hit_rate"] >= 0.9 * before


def sweep_rows(name: str) -> list[dict[str, Any]]:
    outcome = simulate(SimulationRequest(load_builtin(name), ("hpa",))).to_json_object()
    rows: list[dict[str, Any]] = outcome["sweep"]
    return rows


def test_cold_dilution_round_robin_loses_hits_with_every_replica() -> None:
    rows = sweep_rows("cold-dilution")
    by = {(row["replicas"], row["router"]): row["token_hit_rate"] for row in rows}
    round_robin = [by[(n, "round_robin")] for n in ("1", "2", "4", "8")]
    assert round_robin == sorted(round_robin, reverse=True)
    assert len(set(round_robin)) == 4  # strictly decreasing
    loss = by[("1", "round_robin")] - by[("8", "round_robin")]
    recovered = by[("8", "prefix_aware")] - by[("8", "round_robin")]
    assert recovered >= 0.5 * loss  # prefix-aware routing recovers most of it


def test_batch_pressure_trades_cache_for_throughput() -> None:
    rows = {int(row["max_num_seqs"]): row for row in sweep_rows("batch-pressure")}
    assert rows[64]["throughput_tok_s"] > rows[32]["throughput_tok_s"]
    assert rows[64]["request_hit_share"] < 0.7 * rows[32]["request_hit_share"]
    assert rows[64]["token_hit_rate"] < rows[32]["token_hit_rate"] - 0.1
    assert rows[64]["ttft_p50_s"] > rows[32]["ttft_p50_s"]
    assert rows[32]["preemptions_per_s"] == 0
    assert rows[128]["preemptions_per_s"] > 0


def test_same_seed_gives_identical_json() -> None:
    scenario = load_builtin("rag-rechunk").model_copy(update={"duration_s": 300.0})
    first = simulate(SimulationRequest(scenario, ("hpa",))).to_json()
    second = simulate(SimulationRequest(scenario, ("hpa",))).to_json()
    assert first == second
    other = scenario.model_copy(update={"seed": scenario.seed + 1})
    assert simulate(SimulationRequest(other, ("hpa",))).to_json() != first
    json.loads(first)


@pytest.mark.slow
def test_traffic_doubling_scales_with_flat_cost(loops: dict[str, LoopSummary]) -> None:
    run = hpa_report(loops, "traffic-doubling")
    before, after = run["before"], run["after"]
    assert after["req_per_s"] >= 1.8 * before["req_per_s"]
    assert after["replicas"] >= 1.6 * before["replicas"]
    assert abs(after["gpu_s_per_1k"] - before["gpu_s_per_1k"]) <= 0.15 * before["gpu_s_per_1k"]
    assert abs(after["token_hit_rate"] - before["token_hit_rate"]) <= 0.05


@pytest.mark.slow
def test_rolling_deploy_spikes_ttft_then_recovers(loops: dict[str, LoopSummary]) -> None:
    run = hpa_report(loops, "rolling-deploy")
    change = run["change_at_s"]
    during = [r["ttft_p95_s"] for r in run["timeline"] if change <= r["t_s"] < change + 300]
    assert max(during) > 2 * run["before"]["ttft_p95_s"]
    assert run["after"]["ttft_p95_s"] < 1.5 * run["before"]["ttft_p95_s"]
