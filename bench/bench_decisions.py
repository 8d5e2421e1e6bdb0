"""Decisions against the HPA alone: every closed-loop built-in scenario, both autoscalers.

Run from the repository root (about 12 minutes on a 2-core machine for two seeds)::

    nice -n 10 .venv/bin/python -m bench.bench_decisions                # seeds 7 and 11
    nice -n 10 .venv/bin/python -m bench.bench_decisions --seeds 1 2 3 \\
        --scenarios collapse-with-growth traffic-doubling
    nice -n 10 .venv/bin/python -m bench.bench_decisions --scenario-files mine.yaml

``--scenario-files`` runs scenario files (a team's own incident, or one written by someone
who never saw the tests) under the same rules, alone or beside ``--scenarios``;
``bench/scenarios/`` holds shapes no rule was tuned on (a ramp, a spike, a collapse while
demand ramps or falls, a timestamp at the top of the prompt), run as
``--scenario-files bench/scenarios/*.yaml``.

Each (scenario, seed) is what ``cachescale simulate --scenario NAME --seed S --autoscaler
both --json`` runs: the HPA alone (or KEDA alone) and the same HPA with cachescale, on the
same requests, made by the simulator suite's own harness (``tests/sim/closed_loop.py``,
two processes). It prints the machine, the date and the commit, then one markdown row per
run pair with what users felt and paid:

- over the last third of the run: TTFT p95 (every request of the window), mean replicas,
  GPU-s per 1k requests, requests served of those offered per second;
- from the first change to the end: mean replicas, the peak, GPU-s/1k, and how many of
  the minute windows had a TTFT p95 above the scenario's SLO (with the worst);

and, per row, which of the acceptance rules (``docs/design/acceptance.md``) cachescale breaks,
if any:

- ``p95``: its last-third TTFT p95 above the HPA alone's by more than 20% or 0.2 s,
  whichever is larger, unless the policy chose ``onCollapse: CapAtBudget``;
- ``onset``: the same bound on its TTFT p95 from the change to the end, which holds the
  start of the incident too (``sim.incident.Onset``);
- ``replicas``: its last-third replicas above the HPA alone's;
- ``cost``: in a collapse (the HPA alone's token hit rate over the last third under half
  of what it was before the change), its last-third GPU-s/1k not below the HPA alone's.

A scenario that is not a closed-loop built-in, a scenario file that cannot be read, is
not a valid scenario or has no autoscaler (or a sweep), or a seed outside 0..2**32-1, is a
usage error naming it: exit code 2 (argparse's).

With more than one seed it ends with a line per scenario across the seeds: at how many
the cachescale run's last-third replicas are above the HPA alone's (and the mean
difference), its GPU-s/1k at or above, its replicas from the change to the end above, the
minutes above the SLO of each, and the range of its worst minute against the HPA alone's.
One seed's last third is where each fleet happened to land after the incident; the count
over seeds is what a rule change moves.

The output is recorded in ``bench/RESULTS.md``; the rules it checks are
``docs/design/acceptance.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean
from typing import Any

from bench.provenance import provenance
from cachescale.api.spec import CollapseAction
from cachescale.commands.simulate import seed_flag
from cachescale.sim.incident import change_s, p95_limit
from cachescale.sim.policy_loop import scenario_policy
from cachescale.sim.present import COLLAPSED_HIT_SHARE
from cachescale.sim.scenario import (
    Scenario,
    ScenarioError,
    builtin_names,
    load_builtin,
    load_file,
)
from tests.sim.closed_loop import LoopRun, LoopSummary, run_all

AUTOSCALERS = ("hpa", "cachescale")


Labelled = tuple[str, Scenario]
"""A scenario and the name its rows carry: a built-in's name, or the file as given."""


def closed_loop(scenario: Scenario) -> bool:
    """cachescale runs in it: an autoscaler, no sweep."""
    return scenario.autoscaler is not None and scenario.sweep is None


def closed_loop_scenarios() -> list[str]:
    """The closed-loop built-ins."""
    return [name for name in builtin_names() if closed_loop(load_builtin(name))]


def scenario_file(text: str) -> Labelled:
    """A ``--scenario-files`` entry: a closed-loop scenario file, or a usage error."""
    try:
        scenario = load_file(Path(text))
    except ScenarioError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not closed_loop(scenario):
        raise argparse.ArgumentTypeError(
            f"{text}: not a closed-loop scenario (it needs an autoscaler and no sweep)"
        )
    return text, scenario


def jobs(scenarios: list[Labelled], seeds: list[int]) -> dict[str, LoopRun]:
    """One job per (scenario, seed, autoscaler); a pair shares its requests."""
    made = {}
    for label, scenario in scenarios:
        for seed in seeds:
            seeded = scenario.model_copy(update={"seed": seed})
            for autoscaler in AUTOSCALERS:
                made[f"{label}/{seed}/{autoscaler}"] = LoopRun(seeded, autoscaler, report=True)
    return made


def broken_rules(
    scenario: Scenario, alone: dict[str, Any], cachescale: dict[str, Any]
) -> list[str]:
    """Which acceptance rules the cachescale run breaks against the HPA alone's."""
    broken = []
    after, alone_after = cachescale["after"], alone["after"]
    capped = scenario_policy(scenario).cache.on_collapse is CollapseAction.CAP_AT_BUDGET
    p95, alone_p95 = after["ttft_p95_s"], alone_after["ttft_p95_s"]
    if not capped and p95 > p95_limit(alone_p95):
        broken.append("p95")
    whole, alone_whole = cachescale["from_change"]["ttft_p95_s"], alone["from_change"]["ttft_p95_s"]
    if not capped and whole > p95_limit(alone_whole):
        broken.append("onset")
    if after["replicas"] > alone_after["replicas"]:
        broken.append("replicas")
    hit_before, hit_after = alone["before"]["token_hit_rate"], alone_after["token_hit_rate"]
    collapse = hit_after < COLLAPSED_HIT_SHARE * hit_before
    if collapse and after["gpu_s_per_1k"] >= alone_after["gpu_s_per_1k"]:
        broken.append("cost")
    return broken


def cells(report: dict[str, Any], scenario: Scenario) -> str:
    """One run's cells: last third, then from the change to the end."""
    after, whole = report["after"], report["from_change"]
    slo_s = scenario.report.slo_ttft_p95_s
    breaches, spans = breaches_from_change(report, scenario)
    worst = f" (worst {max(breaches):,.1f} s)" if breaches else ""
    return (
        f"{after['ttft_p95_s']:,.2f} s, {after['replicas']:.2f}, {after['gpu_s_per_1k']:,.0f}, "
        f"{after['req_per_s']:.1f} of {after['offered_req_per_s']:.1f} | "
        f"{whole['replicas']:.2f} (peak {report['replicas_max']}), "
        f"{whole['gpu_s_per_1k']:,.0f}, {len(breaches)} of {spans} above {slo_s:g} s{worst}"
    )


def breaches_from_change(report: dict[str, Any], scenario: Scenario) -> tuple[list[float], int]:
    """The one-minute TTFT p95 samples above the SLO from the change to the end, and how
    many one-minute windows that span has."""
    change = change_s(scenario)
    breaches = [b["ttft_p95_s"] for b in report["slo_breaches"] if b["t_s"] >= change]
    return breaches, sum(1 for sample in report["timeline"] if sample["t_s"] >= change)


HEADER = (
    "| scenario | seed | run | last third: TTFT p95, replicas, GPU-s/1k, served of offered"
    " req/s | from the change: replicas (peak), GPU-s/1k, timeline windows above the SLO"
    " | breaks |\n"
    "|---|---|---|---|---|---|"
)


def rows(
    summaries: dict[str, LoopSummary], scenarios: list[Labelled], seeds: list[int]
) -> list[str]:
    """The table's rows, the HPA alone's then cachescale's for each (scenario, seed)."""
    lines = []
    for name, _ in scenarios:
        for seed in seeds:
            alone, cachescale = pair_reports(summaries, name, seed)
            scenario = summaries[f"{name}/{seed}/cachescale"].scenario
            broken = ", ".join(broken_rules(scenario, alone, cachescale)) or "none"
            lines.append(f"| `{name}` | {seed} | alone | {cells(alone, scenario)} | |")
            lines.append(f"| | | cachescale | {cells(cachescale, scenario)} | {broken} |")
    return lines


def pair_reports(
    summaries: dict[str, LoopSummary], name: str, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The HPA alone's report and cachescale's, for one (scenario, seed)."""
    alone, cachescale = (summaries[f"{name}/{seed}/{a}"].report for a in AUTOSCALERS)
    assert alone is not None
    assert cachescale is not None
    return alone, cachescale


def across_seeds(
    summaries: dict[str, LoopSummary], scenarios: list[Labelled], seeds: list[int]
) -> list[str]:
    """Per scenario, how the cachescale runs compare with the HPA alone's over the seeds:
    one seed's last third is where each fleet happened to land after the incident, so
    the count of seeds on each side says more than any one row."""
    lines = []
    for name, scenario in scenarios:
        pairs = [pair_reports(summaries, name, seed) for seed in seeds]
        last = [c["after"]["replicas"] - h["after"]["replicas"] for h, c in pairs]
        cost = [c["after"]["gpu_s_per_1k"] - h["after"]["gpu_s_per_1k"] for h, c in pairs]
        whole = [c["from_change"]["replicas"] - h["from_change"]["replicas"] for h, c in pairs]
        above = [
            (breaches_from_change(h, scenario)[0], breaches_from_change(c, scenario)[0])
            for h, c in pairs
        ]
        worst = [max(c) / max(h) for h, c in above if h and c]
        ratio = (
            f"; worst minute {min(worst):.2f}–{max(worst):.2f}× the HPA alone's" if worst else ""
        )
        lines.append(
            f"- `{name}`, {len(seeds)} seeds: last-third replicas above the HPA alone's at "
            f"{sum(d > 0 for d in last)} (mean difference {mean(last):+.2f}, "
            f"{min(last):+.2f} to {max(last):+.2f}), GPU-s/1k at or above at "
            f"{sum(d >= 0 for d in cost)}; from the change replicas above at "
            f"{sum(d > 0 for d in whole)} (mean difference {mean(whole):+.2f}), minutes above "
            f"the SLO {sum(len(c) for _, c in above)} against {sum(len(h) for h, _ in above)}"
            f"{ratio}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seed_flag, nargs="+", default=[7, 11])
    known = closed_loop_scenarios()
    parser.add_argument(
        "--scenarios", nargs="+", choices=known, help="built-ins (default: all, without files)"
    )
    parser.add_argument("--scenario-files", nargs="+", type=scenario_file, default=[])
    args = parser.parse_args()
    names = args.scenarios or ([] if args.scenario_files else known)
    scenarios = [(name, load_builtin(name)) for name in names] + args.scenario_files
    print("\n".join(provenance()))
    summaries = run_all(jobs(scenarios, args.seeds))
    print(HEADER)
    print("\n".join(rows(summaries, scenarios, args.seeds)))
    if len(args.seeds) > 1:
        print()
        print("\n".join(across_seeds(summaries, scenarios, args.seeds)))


if __name__ == "__main__":
    main()
