"""``cachescale simulate``: resolve a scenario, run it, present it.

The subcommand (``add_parser``, ``run``) is a thin shell around a library call: it builds a
:class:`SimulationRequest` from flags and prints what the :class:`SimulationOutcome`
renders, as text or ``--json``, with CSV and PNG files under ``--out``. Tests call the same
functions, so what they check is what users see. Output is deterministic: the same
scenario and seed give byte-identical JSON.

Everything a run needs is checked before it starts: the flags (the ``*_flag`` functions
are argparse types, shared with ``cachescale emulate``), the scenario file, the policy
cachescale would run with, and ``--out`` (a writable folder, and matplotlib for its plots),
so a mistake costs a second, not a simulation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.validation import error_lines
from cachescale.commands.flags import output_folder
from cachescale.exit_codes import ExitCode
from cachescale.extras import missing_extra
from cachescale.sim.autoscaler import Autoscaler, HPAAutoscaler
from cachescale.sim.compare import comparison, headline, sweep_json, sweep_table
from cachescale.sim.drive import run_together
from cachescale.sim.forked import ForkedError
from cachescale.sim.hpa import HPAModel
from cachescale.sim.incident import onset
from cachescale.sim.keda import KedaAutoscaler
from cachescale.sim.policy_loop import CachescaleAutoscaler, scenario_policy
from cachescale.sim.present import on_call_table, policy_story, run_json, verdict
from cachescale.sim.run import RunResult
from cachescale.sim.scenario import (
    DEFAULT_SCENARIO,
    MAX_DURATION_S,
    Scenario,
    ScenarioError,
    builtin_names,
    load_builtin,
    load_file,
)
from cachescale.sim.sweep import run_sweep

AUTOSCALER_CHOICES = {
    "hpa": ("hpa",),
    "cachescale": ("cachescale",),
    "both": ("hpa", "cachescale"),
}
"""``--autoscaler`` values and the runs each one makes (same seed, same requests)."""
MAX_SEED = 2**32 - 1
"""The largest seed every random generator in the simulator accepts."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cachescale simulate``."""
    parser = commands.add_parser(
        "simulate",
        help="run the prefix-cache fleet simulator (default: the rag-rechunk incident)",
        description=(
            "Simulate a vLLM fleet with per-pod prefix caches under an autoscaler and print "
            "an on-call report. Without flags it runs the rag-rechunk incident scenario."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--scenario", type=scenario_flag, metavar="NAME", help="built-in scenario name"
    )
    source.add_argument("--scenario-file", metavar="FILE", help="scenario YAML file")
    parser.add_argument(
        "--autoscaler",
        choices=list(AUTOSCALER_CHOICES),
        default="hpa",
        help="hpa: the scenario's autoscaler alone (an HPA, or KEDA's for a scenario with "
        "keda:); cachescale: the same one with cachescale reshaping its envelope and "
        "--max-num-seqs; both: the two runs side by side (same requests)",
    )
    parser.add_argument(
        "--seed", type=seed_flag, metavar="N", help="override the scenario's seed (0 or more)"
    )
    parser.add_argument(
        "--duration",
        type=duration_flag,
        metavar="D",
        help="override the duration, e.g. 30m, 2h (at most 168h)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write CSV time series and PNG plots into this folder (the plots extra)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def _progress_bar() -> Callable[[float], None] | None:
    """A one-line progress bar on stderr, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(fraction: float) -> None:
        filled = int(40 * fraction)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (40 - filled)}] {fraction:4.0%}")
        if fraction >= 1:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    """Handle ``cachescale simulate``; return the exit code."""
    try:
        request = SimulationRequest.from_cli(
            scenario=args.scenario,
            scenario_file=args.scenario_file,
            autoscaler=args.autoscaler,
            seed=args.seed,
            duration_s=args.duration,
        )
    except ValueError as error:  # ScenarioError: one line per problem, naming the file
        print(f"cachescale simulate: {error}", file=sys.stderr)
        return ExitCode.INVALID
    if args.out is not None and (problem := _out_problem(args.out)) is not None:
        print(f"cachescale simulate: {problem}", file=sys.stderr)
        return ExitCode.INVALID
    for warning in request.warnings:
        print(f"cachescale simulate: warning: {warning}", file=sys.stderr)
    try:
        outcome = simulate(request, progress=_progress_bar())
    except ForkedError as error:  # a worker process died (killed, out of memory)
        cause = str(error).splitlines()[0]
        again = "running it again in one process"
        print(f"cachescale simulate: warning: {cause}; {again}", file=sys.stderr)
        outcome = simulate(request, progress=_progress_bar(), processes=1)
    if args.out is not None:
        outcome.write_artifacts(Path(args.out))
    if args.json:
        sys.stdout.write(outcome.to_json() + "\n")
    else:
        sys.stdout.write(outcome.to_text() + "\n")
    return ExitCode.OK


def _out_problem(out: str) -> str | None:
    """Why ``--out`` cannot be written (its plots need matplotlib), checked before the run."""
    if (plots := missing_extra("matplotlib", "plots")) is not None:
        return f"--out {plots}"
    return output_folder(out)


def seed_flag(text: str) -> int:
    """``--seed``: a whole number from 0 to ``MAX_SEED``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text} is out of range: 0 to {MAX_SEED}")
    return value


def duration_flag(text: str) -> float:
    """``--duration``: a duration up to ``MAX_DURATION_S`` (a week), in seconds."""
    try:
        seconds = parse_duration_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text} is longer than a week (168h)")
    return seconds


def scenario_flag(text: str) -> str:
    """``--scenario``: the name of a built-in scenario."""
    if text not in builtin_names():
        raise argparse.ArgumentTypeError(
            f"no built-in scenario {text!r}; choose one of {', '.join(builtin_names())}"
        )
    return text


@dataclass(frozen=True)
class SimulationRequest:
    """A resolved scenario (overrides applied) and the autoscalers to run it under."""

    scenario: Scenario
    autoscalers: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    """Things the user may not have meant, e.g. a run that ends before the scenario's
    change; the run goes ahead."""

    @classmethod
    def from_cli(
        cls,
        scenario: str | None,
        scenario_file: str | None,
        autoscaler: str,
        seed: int | None,
        duration_s: float | None,
    ) -> SimulationRequest:
        """Resolve checked CLI flags (see ``seed_flag``, ``duration_flag``); raises
        ``ScenarioError`` when the scenario or the policy it runs cachescale with is
        invalid, or ``ValueError`` for an unknown scenario name."""
        if scenario_file is not None:
            resolved = load_file(Path(scenario_file))
            source = scenario_file
        else:
            resolved = load_builtin(scenario or DEFAULT_SCENARIO)
            source = f"scenario {resolved.name}"
        updates: dict[str, Any] = {}
        if seed is not None:
            updates["seed"] = seed
        if duration_s is not None:
            updates["duration_s"] = duration_s
        resolved = resolved.model_copy(update=updates)
        names = AUTOSCALER_CHOICES[autoscaler]
        if "cachescale" in names and resolved.autoscaler is not None:
            _check_policy(resolved, source)
        return cls(resolved, names, _warnings(resolved, duration_s))


def _check_policy(scenario: Scenario, source: str) -> None:
    """Fail now, naming the file, if cachescale's policy for ``scenario`` is invalid."""
    try:
        scenario_policy(scenario)
    except ValidationError as error:
        raise ScenarioError("\n".join(error_lines(error, source, "policy."))) from None


def _warnings(scenario: Scenario, duration_s: float | None) -> tuple[str, ...]:
    change_at_s = scenario.change_at_s
    if duration_s is None or change_at_s is None or duration_s > change_at_s:
        return ()
    return (
        f"--duration ends at {duration_s:g} s, before the scenario's first change at "
        f"{change_at_s:g} s: the run shows only the time before it",
    )


def build_autoscaler(name: str, scenario: Scenario) -> Autoscaler | None:
    """The named autoscaler configured by ``scenario`` (None when the fleet is fixed):
    ``hpa`` is the scenario's own autoscaler alone (a plain HPA, or KEDA's when the
    scenario has ``keda``), ``cachescale`` the same one with cachescale reshaping it."""
    if scenario.autoscaler is None:
        return None
    model, metric = HPAModel(scenario.autoscaler), scenario.autoscaler_metric
    hpa = (
        HPAAutoscaler(model, metric)
        if scenario.keda is None
        else KedaAutoscaler(model, metric, scenario.keda)
    )
    if name == "hpa":
        return hpa
    if name == "cachescale":
        return CachescaleAutoscaler(hpa, scenario_policy(scenario), scenario)
    raise ValueError(f"unknown autoscaler {name!r}")


@dataclass
class SimulationOutcome:
    """The results of one ``simulate`` call, renderable as text, JSON and files."""

    scenario: Scenario
    runs: dict[str, RunResult] = field(default_factory=dict)
    sweep: list[tuple[dict[str, object], RunResult]] = field(default_factory=list)

    def to_json_object(self) -> dict[str, Any]:
        """The ``--json`` object: ``scenario``, ``seed`` and each run under ``runs`` (as
        ``sim.present.run_json`` writes it); both autoscalers add ``onset``
        (``sim.incident.Onset``), a sweep adds ``sweep``."""
        out: dict[str, Any] = {
            "scenario": self.scenario.name,
            "seed": self.scenario.seed,
            "runs": {name: run_json(result) for name, result in self.runs.items()},
        }
        if {"hpa", "cachescale"} <= self.runs.keys():
            out["onset"] = onset(self.runs["hpa"], self.runs["cachescale"]).as_dict()
        if self.sweep:
            out["sweep"] = sweep_json(self.sweep)
        return out

    def to_json(self) -> str:
        """Deterministic JSON text."""
        return json.dumps(self.to_json_object(), sort_keys=True, allow_nan=False)

    def to_text(self) -> str:
        """The on-call report: a table per run and a verdict paragraph."""
        lines = [
            f"scenario {self.scenario.name} (seed {self.scenario.seed})",
            self.scenario.description.strip(),
            "",
        ]
        for name, result in self.runs.items():
            lines += [
                f"autoscaler: {_label(name, result)}",
                on_call_table(result),
                "",
                verdict(result),
                "",
            ]
            story = policy_story(result)
            if story:
                lines += [story, ""]
        if len(self.runs) > 1:
            lines += [comparison(self.runs), ""]
        if self.sweep:
            lines += [sweep_table(sweep_json(self.sweep)), ""]
        return "\n".join(lines).rstrip()

    def write_artifacts(self, folder: Path) -> None:
        """CSV time series per run and a PNG of the runs (``--out DIR``)."""
        from cachescale.sim.artifacts import write_plots, write_timeline_csv

        folder.mkdir(parents=True, exist_ok=True)
        timelines = {name: run_json(result)["timeline"] for name, result in self.runs.items()}
        for name, timeline in timelines.items():
            write_timeline_csv(folder / f"{self.scenario.name}-{name}.csv", timeline)
        if self.sweep:
            rows = sweep_json(self.sweep)
            (folder / f"{self.scenario.name}-sweep.json").write_text(
                json.dumps(rows, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
        if timelines:
            write_plots(
                folder / f"{self.scenario.name}.png",
                headline(self.runs),
                timelines,
                self.scenario.change_at_s,
                self.scenario.report.slo_ttft_p95_s,
                self.scenario.report.budget_gpu_s_per_1k,
            )


def _label(name: str, result: RunResult) -> str:
    """A run's heading: its ``--autoscaler`` name, or with a KEDA scenario what scaled:
    "keda" alone, or "cachescale (over keda)"."""
    if result.scenario.keda is None:
        return name
    return "keda" if name == "hpa" else f"{name} (over keda)"


def simulate(
    request: SimulationRequest,
    progress: Callable[[float], None] | None = None,
    *,
    processes: int | None = None,
) -> SimulationOutcome:
    """Run the scenario (or its sweep) under each requested autoscaler, on at most
    ``processes`` processes (None: one per CPU; ``sim.drive.run_together``). The answer
    is the same on any number."""
    scenario = request.scenario
    outcome = SimulationOutcome(scenario)
    if scenario.sweep is not None:
        outcome.sweep = run_sweep(scenario)
        return outcome
    names = request.autoscalers
    runs = [(scenario, build_autoscaler(name, scenario)) for name in names]
    outcome.runs = dict(zip(names, run_together(runs, progress, processes=processes), strict=True))
    return outcome
