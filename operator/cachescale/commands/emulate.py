"""``cachescale emulate``: flags, start-up output, the files it keeps, clean shutdown.

The command resolves a scenario exactly as ``cachescale simulate`` does (same flags, same
HPA in the loop), then hands it to the runtime and keeps three outputs in step with it:
the console (targets as pods come and go), the file_sd file and the ground-truth file.
It stops at the scenario's end (after ``--linger``), on SIGINT/SIGTERM or when the reader
of its stdout leaves (a pipe's hang-up is watched, not only met on the next print), and
always shuts every server down and empties the file_sd file on the way out, so a
Prometheus watching it drops the targets instead of scraping closed ports. With
``--pods-of`` the targets carry a real Deployment's pods' names (``emulate_pods``).
``python -m cachescale.emulator`` is this subcommand without the rest of the CLI.

Exit codes follow the CLI's (``cachescale.exit_codes``): 0 success (including a stop by
SIGTERM or by the reader of stdout leaving), 130 a stop by SIGINT (Ctrl-C), 1 invalid
input (bad scenario, an output path that cannot be written, a port already taken or past
65535, a ``--pods-of`` Deployment not found or not readable), 2 usage error (flags are
checked as ``cachescale simulate`` checks them, before anything starts), 3 the API server
cannot be reached at start (``--pods-of``).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import FrameType

from prometheus_client import disable_created_metrics
from pydantic import ValidationError

from cachescale.commands.emulate_pods import PodsOf, PodsOfError, add_arguments, follower, following
from cachescale.commands.flags import duration_seconds, non_negative_number, positive_number
from cachescale.commands.simulate import (
    SimulationRequest,
    build_autoscaler,
    duration_flag,
    scenario_flag,
    seed_flag,
)
from cachescale.emulator.files import write_atomically
from cachescale.emulator.pods_of import PodFollower
from cachescale.emulator.runtime import (
    ENGINES,
    Emulator,
    EmulatorSettings,
    TargetChanges,
    run_in_real_time,
)
from cachescale.emulator.targets import scrape_config_yaml, write_file_sd
from cachescale.exit_codes import ExitCode
from cachescale.sim.profiles import get_profile
from cachescale.sim.run import Simulation
from cachescale.sim.scenario import MAX_DURATION_S, Scenario

PROG = "cachescale emulate"


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text}")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``emulate`` subcommand (its handler returns the exit code)."""
    parser = subparsers.add_parser(
        "emulate",
        help="run a scenario in real time and serve every pod's engine /metrics",
        description=(
            "Run a simulator scenario on the wall clock (optionally accelerated) and serve "
            "each ready pod's metrics on its own loopback port in the engine's exposition "
            "format. Pod and namespace labels belong to the scrape config: use "
            "--write-file-sd and --print-scrape-config to point a Prometheus at the pods, "
            "and --pods-of to have them named after a real Deployment's pods."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--scenario", type=scenario_flag, metavar="NAME", help="built-in scenario name"
    )
    source.add_argument("--scenario-file", metavar="FILE", help="scenario YAML file")
    parser.add_argument(
        "--seed", type=seed_flag, metavar="N", help="override the scenario's seed (0 or more)"
    )
    parser.add_argument(
        "--duration", type=duration_flag, metavar="D", help="override the duration, e.g. 10m"
    )
    parser.add_argument(
        "--engine", choices=ENGINES, default="vllm", help="exposition: vLLM or SGLang names"
    )
    parser.add_argument(
        "--speed",
        type=positive_number,
        default=1.0,
        metavar="X",
        help="simulated seconds per wall second (default 1: real time)",
    )
    parser.add_argument(
        "--base-port",
        type=_port,
        metavar="PORT",
        help="pod engine-N listens on PORT+N (default: a free port per pod)",
    )
    parser.add_argument("--namespace", help="the pods' namespace label (default llm)")
    naming = parser.add_mutually_exclusive_group()
    naming.add_argument(
        "--deployment", help="pod label prefix: DEPLOYMENT-engine-N (default: the engine name)"
    )
    add_arguments(naming, parser)
    parser.add_argument("--model-name", help="model_name label (default: the profile's model)")
    parser.add_argument(
        "--prefix-caching-hash-algo",
        choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "builtin"),
        default="sha256",
        help="the hash vllm:cache_config_info reports (default sha256, vLLM's)",
    )
    parser.add_argument(
        "--write-file-sd",
        metavar="PATH",
        help="keep a Prometheus file_sd JSON of the served pods at PATH",
    )
    parser.add_argument(
        "--print-scrape-config",
        action="store_true",
        help="print a scrape_configs snippet (file_sd with --write-file-sd, else static)",
    )
    parser.add_argument(
        "--ground-truth", metavar="PATH", help="keep a JSON of the simulator's truth at PATH"
    )
    parser.add_argument(
        "--ground-truth-interval",
        type=positive_number,
        default=1.0,
        metavar="SECONDS",
        help="wall seconds between ground-truth rewrites (default 1)",
    )
    parser.add_argument(
        "--ground-truth-window",
        type=duration_seconds,
        default=60.0,
        metavar="D",
        help="wall-clock window of the truth's recent requests, scrapes and TTFT (default 1m)",
    )
    parser.add_argument(
        "--no-traffic",
        action="store_true",
        help="no simulated traffic, no autoscaler, one pod: its engine serves only what "
        "clients POST to /v1/completions (for cachescale audit run --endpoint); runs until "
        "stopped, or --duration",
    )
    parser.add_argument(
        "--linger",
        type=non_negative_number,
        default=0.0,
        metavar="SECONDS",
        help="keep serving the final state this long after the scenario ends",
    )
    parser.set_defaults(handler=run)


class _Outputs:
    """Console lines, file_sd and ground truth, kept in step with the emulator."""

    def __init__(self, emulator: Emulator, args: argparse.Namespace) -> None:
        self._emulator = emulator
        self._file_sd = Path(args.write_file_sd) if args.write_file_sd else None
        self._truth = Path(args.ground_truth) if args.ground_truth else None
        self._truth_every_s: float = args.ground_truth_interval
        self._truth_due = 0.0

    def step(self, changes: TargetChanges) -> None:
        """Report and record one step's changes; rewrite the truth when it is due."""
        now_s = self._emulator.simulation.now_s
        if changes and self._file_sd is not None:
            write_file_sd(self._file_sd, self._emulator.targets())
        if time.monotonic() >= self._truth_due:
            self.write_truth()
        _raise_if_reader_left()
        for target in changes.removed:
            print(f"[sim {now_s:8.1f}s] - {target.namespace}/{target.pod}", flush=True)
        for target in changes.added:
            print(
                f"[sim {now_s:8.1f}s] + {target.namespace}/{target.pod}  {target.url}", flush=True
            )

    def write_truth(self) -> None:
        """Rewrite the ground-truth file now (if one was asked for)."""
        if self._truth is None:
            return
        snapshot = self._emulator.truth_snapshot()
        write_atomically(self._truth, json.dumps(snapshot, indent=1, allow_nan=False) + "\n")
        self._truth_due = time.monotonic() + self._truth_every_s

    def linger(self, stop: threading.Event, seconds: float) -> None:
        """Keep serving for ``seconds`` (or until ``stop``), rewriting the truth on its
        interval: scrapes served while lingering reach the truth file too."""
        self.write_truth()
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not stop.wait(
            min(left, self._truth_every_s)
        ):
            self.write_truth()
            _raise_if_reader_left()

    def banner(self, scenario: Scenario) -> None:
        """The start-up line: what runs, as what, how fast."""
        settings = self._emulator.settings
        print(
            f"{PROG}: scenario {scenario.name} (seed {scenario.seed}), engine "
            f"{settings.engine}, model {settings.model_name}, speed {settings.speed:g}x, "
            f"{scenario.duration_s:g} simulated seconds",
            flush=True,
        )

    def scrape_config(self) -> None:
        """Print the scrape config snippet (static targets: the pods served now)."""
        print(scrape_config_yaml(self._file_sd, self._emulator.targets()), flush=True)


def _raise_if_reader_left() -> None:
    """``BrokenPipeError`` once stdout is a pipe or socket whose reader has gone.

    A print only fails when it is made: an emulator whose fleet is settled prints nothing,
    so without this it would serve until the scenario's end behind a ``| head -1`` that
    left long ago. poll() reports the hang-up (POLLERR on a pipe, POLLHUP on a socket)
    without writing.
    """
    try:
        descriptor = sys.stdout.fileno()
        mode = os.fstat(descriptor).st_mode
    except (AttributeError, ValueError, OSError):  # replaced, closed or not a real file
        return
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return  # a terminal or a file: there is no reader to leave
    watch = select.poll()
    watch.register(descriptor, 0)  # no events asked: only errors and hang-ups come back
    if any(flags & (select.POLLERR | select.POLLHUP) for _, flags in watch.poll(0)):
        raise BrokenPipeError("stdout's reader has gone")


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """Turn SIGINT and SIGTERM into ``stop.set()`` for the duration (main thread only);
    yields the signals received, in order."""
    received: list[int] = []

    def handle(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _scenario(args: argparse.Namespace) -> Scenario:
    """The scenario with ``--seed``/``--duration`` applied, as ``simulate`` resolves it."""
    request = SimulationRequest.from_cli(
        scenario=args.scenario,
        scenario_file=args.scenario_file,
        autoscaler="hpa",
        seed=args.seed,
        duration_s=args.duration,
    )
    for warning in request.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if args.no_traffic:
        return _without_traffic(request.scenario, args.duration is None)
    return request.scenario


def _without_traffic(scenario: Scenario, longest: bool) -> Scenario:
    """``scenario``'s engine alone: one pod, no arrivals, no autoscaler, no perturbations
    (so the prefix-cache counters move only for clients' completions); the longest
    duration a scenario may have when ``longest``."""
    workload = scenario.workload.model_copy(update={"rate_per_s": 0.0, "rate_steps": ()})
    fleet = scenario.fleet.model_copy(update={"replicas": 1})
    update: dict[str, object] = {
        "workload": workload,
        "fleet": fleet,
        "autoscaler": None,
        "perturbations": (),
    }
    if longest:
        update["duration_s"] = MAX_DURATION_S
    return scenario.model_copy(update=update)


def _check_output_paths(args: argparse.Namespace) -> None:
    """``OSError``-free start: each output file's folder exists, or can be made, and the
    path is not a folder itself; ``ValueError`` naming the flag otherwise."""
    for flag, value in (
        ("--write-file-sd", args.write_file_sd),
        ("--ground-truth", args.ground_truth),
    ):
        if value is None:
            continue
        path = Path(value)
        if path.is_dir():
            raise ValueError(f"{flag} {value}: is a folder; give a file path")
        if path.parent.exists() and not path.parent.is_dir():
            raise ValueError(f"{flag} {value}: {path.parent} is not a folder")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"{flag} {value}: cannot create its folder: {error.strerror}"
            ) from None


def _emulator(
    args: argparse.Namespace, scenario: Scenario, pods: tuple[PodsOf, PodFollower] | None
) -> Emulator:
    pods_of = pods[0] if pods else None
    settings = EmulatorSettings(
        model_name=args.model_name or get_profile(scenario.fleet.profile).model.name,
        engine=args.engine,
        namespace=pods_of.namespace if pods_of else args.namespace or "llm",
        deployment=pods_of.deployment if pods_of else args.deployment or args.engine,
        base_port=args.base_port,
        speed=args.speed,
        truth_window_s=args.ground_truth_window,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo,
    )
    simulation = Simulation(scenario, build_autoscaler("hpa", scenario))
    return Emulator(simulation, settings, pods[1].names if pods else None)


def _emulate(
    emulator: Emulator, outputs: _Outputs, stop: threading.Event, args: argparse.Namespace
) -> None:
    first = emulator.advance_to(0.0)
    if args.print_scrape_config:
        outputs.scrape_config()
    outputs.step(first)
    run_in_real_time(emulator, stop, outputs.step)
    if not stop.is_set():
        print(
            f"{PROG}: scenario finished; serving the final state for {args.linger:g}s", flush=True
        )
        outputs.linger(stop, args.linger)


def _serve(emulator: Emulator, outputs: _Outputs, args: argparse.Namespace) -> int:
    """Emulate until the end or a signal; always stop the servers and empty file_sd.
    Stopped by SIGINT first: exit 130."""
    stop = threading.Event()
    status = ExitCode.OK
    with _stop_on_signals(stop) as received:
        try:
            _emulate(emulator, outputs, stop, args)
        except BrokenPipeError:  # stdout's reader left: the CLI's to handle, not bad input
            raise
        except OSError as error:  # a port already taken, an unwritable file
            print(f"{PROG}: {error}", file=sys.stderr)
            status = ExitCode.INVALID
        except OverflowError:  # --base-port + N went past the last TCP port
            print(
                f"{PROG}: --base-port {args.base_port}: a pod's port is past 65535", file=sys.stderr
            )
            status = ExitCode.INVALID
        finally:
            closed = emulator.close()
            outputs.write_truth()
            outputs.step(closed)  # prints last: a closed stdout must not skip the files
    print(f"{PROG}: stopped at simulated {emulator.simulation.now_s:.1f}s", flush=True)
    if status == ExitCode.OK and received[:1] == [signal.SIGINT]:
        return ExitCode.INTERRUPTED
    return status


def run(args: argparse.Namespace) -> int:
    """Run the emulator until the scenario ends (plus ``--linger``) or a signal arrives."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    try:
        _check_output_paths(args)
        scenario = _scenario(args)
        pods = follower(args.pods_of, args.namespace, args.kubeconfig, PROG)
        emulator = _emulator(args, scenario, pods)
        outputs = _Outputs(emulator, args)
    except (ValueError, ValidationError, OSError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return ExitCode.INVALID
    except PodsOfError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return error.code
    outputs.banner(scenario)
    with following(*pods, PROG) if pods else nullcontext():
        return _serve(emulator, outputs, args)
