"""Scenario files: one YAML document describes a whole simulated experiment.

A scenario fixes everything a run depends on — workload, fleet, engine profile, router,
autoscaler, perturbations, duration and seed — so the same file and seed give the same
bytes of output. Built-in scenarios ship inside the package (``sim/scenarios/*.yaml``) and
are copied under ``examples/scenarios/`` for users to start from; a test keeps the two in
sync. The schema is pydantic, documented field by field, and rejects unknown keys. A file
that cannot be used is a :class:`ScenarioError` whose every line names the file and what
is wrong, never a stack trace or a raw validation dump.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cachescale.api.validation import decode, error_lines, load_documents, yaml_error_line
from cachescale.sim.clients_spec import ClientsSpec
from cachescale.sim.engine_spec import (
    EngineSpec,
    engine_profile,
    longest_turn_tokens,
    max_model_len,
)
from cachescale.sim.fleet import RouterKind
from cachescale.sim.hpa import HPASpec
from cachescale.sim.profiles import PROFILES, ReplicaProfile
from cachescale.sim.traffic_spec import (
    WorkloadChange,
    WorkloadSpec,
)

BUILTIN_PACKAGE = "cachescale.sim.scenarios"
DEFAULT_SCENARIO = "rag-rechunk"


SCENARIO_FIELDS_HINT = (
    "scenario fields are snake_case; see examples/scenarios/ and docs/simulator.md"
)
"""What to check when a scenario file has an unknown field."""


MAX_DURATION_S = 7 * 86_400.0
"""The longest scenario: a simulated week already takes the better part of an hour."""
MAX_PODS = 1_000
"""The most pods at the start: every one is simulated request by request."""


class ScenarioError(ValueError):
    """A scenario that cannot be run: one line per problem, each naming its source."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


HPAMetric = Literal["num_requests_waiting", "num_requests_running"]
"""The per-pod gauge an HPA averages: queue length (waiting) or batch size (running)."""


class RollingRestart(_Model):
    """Every pod is replaced by a new, cold one (a rollout), starting at ``at_s``."""

    kind: Literal["rolling_restart"] = Field(default="rolling_restart", description="Tag.")
    at_s: float = Field(ge=0, description="Simulated time the rollout starts, seconds.")


class MetricsOutage(_Model):
    """Prometheus cannot be read by the policy engine for ``duration_s`` from ``at_s``.

    Only cachescale's view goes dark (no scrapes are stored, every query fails): the
    engines keep serving and the HPA keeps its own metrics pipeline, as when the
    operator's Prometheus is down or unreachable.
    """

    kind: Literal["metrics_outage"] = Field(default="metrics_outage", description="Tag.")
    at_s: float = Field(ge=0, description="Simulated time the outage starts, seconds.")
    duration_s: float = Field(gt=0, description="How long it lasts, seconds.")

    def covers(self, t_s: float) -> bool:
        """Whether ``t_s`` falls inside the outage."""
        return self.at_s <= t_s < self.at_s + self.duration_s


ScenarioPerturbation = Annotated[
    WorkloadChange | RollingRestart | MetricsOutage,
    Field(discriminator="kind"),
]
"""A change at a point in simulated time: a workload change, a fleet rollout, or an
outage of the policy engine's metrics."""
FLEET_EVENTS = (RollingRestart, MetricsOutage)
"""Perturbations that are not workload changes (the traffic generator skips them)."""


class FleetSpec(_Model):
    """The Deployment: engine profile, batch ceiling, pods and the router in front."""

    profile: str = Field(description=f"Engine profile, one of: {', '.join(sorted(PROFILES))}.")
    max_num_seqs: int = Field(
        default=64, ge=1, le=65_536, description="vLLM --max-num-seqs per pod."
    )
    replicas: int = Field(
        default=10, ge=1, le=MAX_PODS, description="Pods at t=0 (ready, caches empty)."
    )
    pod_start_delay_s: float = Field(
        default=120.0,
        ge=0,
        le=86_400,
        description="Seconds from pod creation to ready (weights, graphs).",
    )
    router: RouterKind = Field(
        default=RouterKind.ROUND_ROBIN, description="round_robin, least_loaded or prefix_aware."
    )
    engine: EngineSpec | None = Field(
        default=None,
        description="vLLM's settings as a server is started with them (block size, "
        "num_gpu_blocks, max_model_len, batched tokens, step times), in place of what the "
        "profile derives; null: the profile's.",
    )

    @model_validator(mode="after")
    def _known_profile(self) -> FleetSpec:
        if self.profile not in PROFILES:
            raise ValueError(
                f"unknown profile {self.profile!r}; choose one of {', '.join(sorted(PROFILES))}"
            )
        return self


class ReportSpec(_Model):
    """How results are summarised and judged."""

    window_s: float = Field(default=600.0, gt=0, description="Rows of the on-call table, s.")
    timeline_s: float = Field(default=60.0, gt=0, description="Timeline resolution, seconds.")
    steady_window_s: float = Field(
        default=1200.0, gt=0, description="'before' = this long, ending at the first change."
    )
    slo_ttft_p95_s: float = Field(default=1.0, gt=0, description="TTFT p95 objective, s.")
    budget_gpu_s_per_1k: float | None = Field(
        default=None, gt=0, description="GPU-seconds per 1k requests budget (report only)."
    )
    full_hit_max_computed_tokens: int = Field(
        default=200,
        ge=0,
        description="A request counts as a full hit when it computed at most this many "
        "prompt tokens (a bucket bound of vLLM's computed-tokens histogram).",
    )


class SweepSpec(_Model):
    """Run the scenario once per combination of settings (fixed fleet, no autoscaler)."""

    replicas: tuple[int, ...] = Field(default=(), description="Pod counts to try.")
    router: tuple[RouterKind, ...] = Field(default=(), description="Routers to try.")
    max_num_seqs: tuple[int, ...] = Field(default=(), description="Batch ceilings to try.")
    rate_per_s_per_seq: float | None = Field(
        default=None,
        gt=0,
        description="If set, each point's arrival rate is this × its max_num_seqs, so the "
        "offered load grows with the batch ceiling (as a benchmark run at concurrency = "
        "batch size does) instead of saturating the small ceilings.",
    )

    def points(self) -> Iterator[dict[str, object]]:
        """Each combination as ``{setting: value}``, in a fixed order."""
        axes: dict[str, tuple[object, ...]] = {
            name: values
            for name, values in (
                ("replicas", self.replicas),
                ("router", self.router),
                ("max_num_seqs", self.max_num_seqs),
            )
            if values
        }
        for combo in itertools.product(*axes.values()):
            yield dict(zip(axes, combo, strict=True))


class KedaSpec(_Model):
    """A KEDA ScaledObject's own settings (``sim/keda.py`` models it). Its minReplicaCount,
    maxReplicaCount and threshold are the scenario's ``autoscaler`` min_replicas,
    max_replicas and target_average_value: the HPA KEDA generates carries them."""

    polling_interval_s: float = Field(
        default=30.0, gt=0, le=3600, description="pollingInterval: seconds between KEDA's polls."
    )
    use_cached_metrics: bool = Field(
        default=False,
        description="useCachedMetrics: the HPA reads the last poll's value instead of a "
        "fresh query at each of its syncs.",
    )


class Scenario(_Model):
    """One simulated experiment, end to end."""

    name: str = Field(pattern=r"^[a-z0-9][-a-z0-9]*$", description="Scenario name.")
    description: str = Field(description="What it shows, in a sentence or two.")
    seed: int = Field(default=7, ge=0, description="Seed for every random draw.")
    duration_s: float = Field(
        gt=0, le=MAX_DURATION_S, description="Simulated seconds (at most a week)."
    )
    fleet: FleetSpec = Field(description="Pods, profile and router.")
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, description="Request stream.")
    autoscaler: HPASpec | None = Field(
        default=None, description="The HPA on vllm:num_requests_waiting; null: fixed fleet."
    )
    keda: KedaSpec | None = Field(
        default=None,
        description="Set: the autoscaler is a KEDA ScaledObject with a Prometheus trigger on "
        "sum(vllm:<autoscaler_metric>) (the HPA KEDA generates has autoscaler's min, max "
        "and, as its threshold, target_average_value); null: a plain HPA.",
    )
    autoscaler_metric: HPAMetric = Field(
        default="num_requests_waiting",
        description="vllm:num_requests_waiting (queue length) or vllm:num_requests_running "
        "(batch size), averaged per ready pod: the two metrics HPA guides for vLLM use.",
    )
    perturbations: tuple[ScenarioPerturbation, ...] = Field(
        default=(), description="Changes at given times (workload or rollout)."
    )
    policy: dict[str, object] = Field(
        default_factory=dict,
        description="The CacheScalingPolicy spec cachescale runs with (--autoscaler "
        "cachescale|both), in the CRD's camelCase. target and metrics.prometheusUrl are "
        "filled in; slo and budget default to the report's SLO and budget.",
    )
    policy_start_s: float = Field(
        default=900.0,
        ge=0,
        description="When cachescale is installed (--autoscaler cachescale|both): before it, "
        "the HPA runs alone while Prometheus already scrapes, as on a fleet that was running "
        "before the operator arrived. The default skips the simulator's cold start, where "
        "every pod starts empty under full traffic at once.",
    )
    report: ReportSpec = Field(default_factory=ReportSpec, description="Summary settings.")
    sweep: SweepSpec | None = Field(default=None, description="Settings to sweep, if any.")
    clients: ClientsSpec | None = Field(
        default=None,
        description="Closed-loop chat clients in place of the workload's open-loop stream: "
        "each sends its conversation's next turn when its last answer arrives.",
    )

    @model_validator(mode="after")
    def _engine_fits(self) -> Scenario:
        problems = list(engine_problems(self))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def change_at_s(self) -> float | None:
        """When the first perturbation happens (None without perturbations)."""
        return min((p.at_s for p in self.perturbations), default=None)


def replica_profile(scenario: Scenario) -> ReplicaProfile:
    """Every pod's engine: the fleet's profile with what ``fleet.engine`` states."""
    return engine_profile(PROFILES[scenario.fleet.profile], scenario.fleet.engine)


def stream_workload(scenario: Scenario) -> WorkloadSpec:
    """The workload the request stream is made with: hashed at the engine's block size
    (``fleet.engine.block_size`` is the one place a scenario sets it)."""
    block_size = replica_profile(scenario).block_size
    if scenario.workload.block_size == block_size:
        return scenario.workload
    return scenario.workload.model_copy(update={"block_size": block_size})


def engine_problems(scenario: Scenario) -> Iterator[str]:
    """What keeps the scenario's engine from serving its requests, as vLLM would refuse."""
    profile = replica_profile(scenario)
    workload, engine = scenario.workload, scenario.fleet.engine
    if "block_size" in workload.model_fields_set and workload.block_size != profile.block_size:
        yield (
            f"workload.block_size {workload.block_size} differs from the engine's block size "
            f"{profile.block_size}: set it once, as fleet.engine.block_size"
        )
    seqs = [scenario.fleet.max_num_seqs, *(scenario.sweep.max_num_seqs if scenario.sweep else ())]
    if max(seqs) > profile.max_num_batched_tokens:
        yield (
            f"max_num_seqs {max(seqs)} exceeds the engine's max_num_batched_tokens "
            f"{profile.max_num_batched_tokens} (vLLM refuses it)"
        )
    longest = max_model_len(engine)
    if profile.num_blocks * profile.block_size < longest:
        yield (
            f"the engine's pool holds {profile.num_blocks} usable blocks of "
            f"{profile.block_size} tokens, fewer than one request of max_model_len {longest} "
            "needs (vLLM refuses to start)"
        )
    yield from _stream_problems(scenario, longest)


def _stream_problems(scenario: Scenario, longest: int) -> Iterator[str]:
    clients = scenario.clients
    if clients is not None:
        if "workload" in scenario.model_fields_set:
            yield "clients replace the workload's open-loop stream: remove workload"
        if any(not isinstance(p, FLEET_EVENTS) for p in scenario.perturbations):
            yield "workload perturbations do not apply to clients"
        if clients.longest_first_turn() > longest:
            yield (
                f"a client's first turn can take {clients.longest_first_turn()} tokens with its "
                f"output, more than max_model_len {longest}"
            )
    elif scenario.fleet.engine is not None:
        changes = [p for p in scenario.perturbations if not isinstance(p, FLEET_EVENTS)]
        turn = longest_turn_tokens(scenario.workload, changes)
        if turn > longest:
            yield (
                f"a request can take {turn} tokens without any history, more than "
                f"max_model_len {longest}"
            )


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with the package."""
    folder = resources.files(BUILTIN_PACKAGE)
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


def load_builtin(name: str) -> Scenario:
    """A built-in scenario by name; ``ValueError`` listing the names when unknown."""
    if name not in builtin_names():
        raise ValueError(f"no built-in scenario {name!r}; choose one of {builtin_names()}")
    text = resources.files(BUILTIN_PACKAGE).joinpath(f"{name}.yaml").read_text("utf-8")
    return parse_scenario(text)


def load_file(path: Path) -> Scenario:
    """A scenario from a YAML file, read as policy files are (``load_documents``: a key
    written twice is an error); ``ScenarioError`` naming the file when it cannot be read,
    is not UTF-8 or YAML, holds more than one document, or is not a valid scenario."""
    try:
        documents = load_documents(decode(path.read_bytes()))
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ScenarioError(f"{path}: not valid YAML: {yaml_error_line(error)}") from None
    except ValueError as error:  # not UTF-8
        raise ScenarioError(f"{path}: {error}") from None
    if len(documents) > 1:
        raise ScenarioError(f"{path}: {len(documents)} YAML documents; a scenario is one")
    document = documents[0] if documents else None
    if not isinstance(document, dict):
        found = "nothing" if document is None else f"a YAML {type(document).__name__}"
        raise ScenarioError(f"{path}: expected a scenario (a YAML mapping), found {found}")
    try:
        return Scenario.model_validate(document)
    except ValidationError as error:
        lines = error_lines(error, str(path), fields_hint=SCENARIO_FIELDS_HINT)
        raise ScenarioError("\n".join(lines)) from None


def parse_scenario(text: str) -> Scenario:
    """Validate scenario YAML text (raises pydantic's ValidationError with field paths)."""
    return Scenario.model_validate(yaml.safe_load(text))
