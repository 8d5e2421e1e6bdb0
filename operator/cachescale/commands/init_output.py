"""What ``cachescale init`` prints: the proposed SLO and budget, the header naming the
window the figures cover, and the commented ``CacheScalingPolicy`` (``commands.init``
gathers; this renders). The proposals are pure functions of what was measured: twice the
measured TTFT p95 (never under half a second), the measured cost per request plus 15%.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.policy import API_VERSION, KIND
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.controller.target.draft_target import DraftError, EngineContainer

if TYPE_CHECKING:
    from cachescale.snapshot import EngineSignals, WorkloadState


BUDGET_HEADROOM = 1.15
"""The proposed budget: the measured GPU-s per 1k requests plus 15%, room for ordinary
variation (a cost 15% over the healthy one is what the budget exists to flag)."""


SLO_FACTOR = 2.0
"""The proposed TTFT p95 objective: twice the measured p95 (at least ``SLO_FLOOR_S``)."""


SLO_FLOOR_S = 0.5
"""No objective tighter than this is proposed: a sub-second p95 measured on a quiet hour
would page on ordinary queueing."""


SLO_CEILING_S = 600.0
"""The API's own upper bound on ``slo.ttftP95Seconds``."""


@dataclass(frozen=True, slots=True)
class Measured:
    """The window of history the draft proposes from, and what was read over it."""

    selector: dict[str, str]
    signals: EngineSignals
    window_seconds: float
    """The span the signals were measured over: ``--history``, or the shorter span
    Prometheus holds (``--allow-short-history``)."""
    at: datetime
    """The window's end (``--at``, else now)."""

    @property
    def start(self) -> datetime:
        """The window's start."""
        return self.at - timedelta(seconds=self.window_seconds)


def span(seconds: float) -> str:
    """Seconds, to the nearest one, as ``--history`` takes them: ``1h``, ``2m``, ``2m13s``."""
    hours, rest = divmod(round(seconds), 3600)
    minutes, whole = divmod(rest, 60)
    parts = ((hours, "h"), (minutes, "m"), (whole, "s"))
    return "".join(f"{value}{unit}" for value, unit in parts if value) or "0s"


def proposed_slo(measured_p95: float) -> float:
    """``SLO_FACTOR`` × the measured p95, at least ``SLO_FLOOR_S``, to two significant
    figures (rounded up), within the API's bound."""
    raw = max(SLO_FACTOR * measured_p95, SLO_FLOOR_S)
    magnitude = 10.0 ** (math.floor(math.log10(raw)) - 1)
    return min(round(math.ceil(raw / magnitude - 1e-9) * magnitude, 6), SLO_CEILING_S)


def proposed_budget(measured_cost: float) -> int:
    """The measured GPU-s per 1k requests plus ``BUDGET_HEADROOM``, rounded up."""
    return math.ceil(measured_cost * BUDGET_HEADROOM - 1e-9)


def render(
    args: argparse.Namespace,
    container: EngineContainer,
    hpa: dict[str, Any],
    keda_owner: str | None,
    state: WorkloadState,
    measured: Measured,
) -> str:
    """The policy as commented YAML, checked against the API model before it is shown."""
    signals = measured.signals
    cost = signals.gpu_seconds_per_1k_requests
    p95 = signals.ttft_p95_seconds
    if cost.value is None:
        raise DraftError(f"GPU-seconds per 1k requests cannot be measured: {cost.reason}")
    if p95.value is None:
        raise DraftError(f"TTFT p95 cannot be measured: {p95.reason}")
    budget, slo = proposed_budget(cost.value), proposed_slo(p95.value)
    spec: dict[str, Any] = {
        "mode": "Advise",
        "target": {
            "deploymentName": args.deployment,
            **(
                {"scaledObjectName": keda_owner}
                if keda_owner is not None
                else {"hpaName": hpa["metadata"]["name"]}
            ),
            "containerName": container.name,
            "engine": container.engine.value,
        },
        "metrics": _metrics(args, measured.selector),
        "slo": {"ttftP95Seconds": slo},
        "budget": {
            "gpuSecondsPer1kRequests": budget,
            "minReplicas": state.hpa.min_replicas,
            "maxReplicas": state.hpa.max_replicas,
        },
    }
    try:
        CacheScalingPolicySpec.model_validate(spec)
    except ValidationError as error:  # e.g. a --policy-prometheus that is not a URL
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise DraftError(
            f"the drafted policy would not validate: {where}: {first['msg']}"
        ) from None
    hit = signals.token_hit_rate_local.value
    lines = [
        f"# Drafted by `cachescale init` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC from "
        f"{span(measured.window_seconds)} of history.",
        "# Advise mode: cachescale reads, decides and explains (kubectl describe), and patches",
        "# nothing. Switch spec.mode to Enforce once its decisions read right for a while.",
        *_window_lines(args, measured),
        f"# with the selector below: {signals.requests_per_second.value:,.1f} req/s served, "
        f"TTFT p95 {p95.value:.3g} s, {cost.value:,.0f} GPU-s per 1k requests"
        + (f", token hit rate {hit:.2f}" if hit is not None else "")
        + f", {state.ready_replicas} ready pods with {state.gpus_per_pod:g} GPU(s) each.",
        "# If that window was not a healthy one, run init again over one that was (--history,",
        "# --at).",
    ]
    if keda_owner is not None:
        lines.append(
            f"# HPA {hpa['metadata']['name']} is generated by KEDA ScaledObject {keda_owner}, "
            "so the policy names the ScaledObject (KEDA would overwrite changes to its HPA); "
            "the operator needs the chart value keda.enabled=true to read and patch it."
        )
    body = yaml.safe_dump(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": args.deployment, "namespace": args.namespace},
            "spec": spec,
        },
        sort_keys=False,
    )
    comments = {
        "  slo:": f"  # {SLO_FACTOR:g}x the measured TTFT p95 ({p95.value:.3g} s), at least "
        f"{SLO_FLOOR_S:g} s; set it to what your users need.",
        "  budget:": f"  # The measured {cost.value:,.0f} GPU-s per 1k requests + "
        f"{BUDGET_HEADROOM - 1:.0%}; the replica range is the HPA's own.",
        "  metrics:": "  # The selector was checked to return this Deployment's series alone."
        + (
            "\n  # No prometheusUrl: the operator's default (chart value prometheus.url) is read."
            if args.operator_default_prometheus
            else "\n  # The operator reads this prometheusUrl only if its admin lists it"
            "\n  # (chart value allowedPrometheusUrls); --operator-default-prometheus writes none."
        ),
    }
    out = []
    for line in body.splitlines():
        if line in comments:
            out.append(comments[line])
        out.append(line)
    return "\n".join(lines + out) + "\n" + _batching_note(container) + "\n"


def _window_lines(args: argparse.Namespace, measured: Measured) -> list[str]:
    """The window the figures cover, ``<at - span> .. <at>``, and, when Prometheus held
    less than ``--history``, that it did."""
    window = (
        f"# Measured over {span(measured.window_seconds)}, "
        f"{measured.start:%Y-%m-%d %H:%M:%S} .. {measured.at:%Y-%m-%d %H:%M:%S} UTC,"
    )
    if measured.window_seconds >= parse_duration_seconds(args.history):
        return [window]
    return [
        f"# Prometheus holds only {span(measured.window_seconds)} of the --history "
        f"{args.history} asked for (--allow-short-history): every figure covers those alone.",
        window,
    ]


def _metrics(args: argparse.Namespace, selector: dict[str, str]) -> dict[str, Any]:
    """``spec.metrics``: the selector, and the URL the operator reaches unless the
    operator's default is to be read."""
    if args.operator_default_prometheus:
        return {"selector": selector}
    return {"prometheusUrl": args.policy_prometheus or args.prometheus, "selector": selector}


def _batching_note(container: EngineContainer) -> str:
    """What to add for cachescale to manage ``--max-num-seqs``: the model and GPU shape,
    which the Deployment does not say."""
    current = (
        f"--max-num-seqs is {container.max_num_seqs}"
        if container.max_num_seqs is not None
        else "--max-num-seqs is not set (the engine's default)"
    )
    block = f", --block-size {container.block_size}" if container.block_size else ""
    model = container.model or "the model"
    return (
        f"  # Batch ceiling: {current}{block}. To let cachescale manage it, add\n"
        "  # batching: {manageMaxNumSeqs: true, model: {layers, kvHeads, headDim, weightsGiB},\n"
        f"  #   gpu: {{memoryGiB}}}} from {model}'s config.json and your GPU (docs/decisions.md)."
    )
