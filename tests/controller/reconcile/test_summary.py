"""``status.summary``: the figures ``kubectl get csp`` prints, written formatted because a
printer column cannot format a number; never more than three significant digits."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from cachescale.api.reasons import Problem
from cachescale.api.status import CacheScalingPolicyStatus
from cachescale.controller.reconcile.status import render, render_problem, significant
from cachescale.decide import decide
from cachescale.snapshot import EngineSignals, Measured, Unit
from tests.decide.decide_builders import T0, learned, signals, snapshot, spec


def summary_of(engine: EngineSignals) -> dict[str, Any]:
    state = snapshot(engine)
    decision = decide(spec(), state, learned(), T0)
    status = render(
        CacheScalingPolicyStatus(),
        decision,
        state,
        generation=1,
        now=T0,
        applied=False,
        warmup_seconds=0,
    ).wire
    summary: dict[str, Any] = status["summary"]
    return summary


def digits(cell: object) -> int:
    """Significant digits of the figure in a cell (a bucket's bounds beside it left out)."""
    number = re.sub(r"\(.*\)", "", str(cell)).strip(">s").replace(",", "").replace(".", "")
    return len(number.lstrip("0").rstrip("0") or "0")


def test_raw_floats_are_written_as_kubectl_get_should_print_them() -> None:
    engine = replace(
        signals(hit=0.874417119214396, gpu_seconds_per_1k_requests=16.393990644082322),
        ttft_p95_seconds=Measured.quantile(0.58342, Unit.SECONDS),
    )
    assert summary_of(engine) == {"hitRate": "0.87", "ttftP95": "0.58s", "gpuSecondsPer1k": 16}


@pytest.mark.parametrize(
    ("quantile", "cell"),
    [
        (Measured.quantile(9.8765, Unit.SECONDS), "9.88s"),
        (Measured.quantile(16.393990644082322, Unit.SECONDS), "16s"),
        (Measured.quantile(400.0, Unit.SECONDS, lower_bound=True), ">400s"),
        (Measured.quantile(2368.4, Unit.SECONDS, bucket=(640.0, 2560.0)), "2,370s(640–2,560s)"),
        (Measured.quantile(1.3, Unit.SECONDS, bucket=(1.0, 2.5)), "1.30s(1–2.5s)"),
    ],
)
def test_ttft_p95_reads_as_it_should_to_three_digits(quantile: Measured, cell: str) -> None:
    summary = summary_of(replace(signals(), ttft_p95_seconds=quantile))
    assert summary["ttftP95"] == cell
    assert digits(cell) <= 3


@pytest.mark.parametrize(
    ("cost", "cell"), [(0.4, 0), (16.39, 16), (687.5, 688), (1142.3, 1140), (98765.0, 98800)]
)
def test_gpu_seconds_per_1k_is_a_whole_number_to_three_digits(cost: float, cell: int) -> None:
    summary = summary_of(signals(gpu_seconds_per_1k_requests=cost))
    assert summary["gpuSecondsPer1k"] == cell
    assert digits(cell) <= 3


def test_an_unknown_signal_leaves_its_figure_out() -> None:
    summary = summary_of(signals(hit=None, gpu_seconds_per_1k_requests=None))
    assert "hitRate" not in summary
    assert "gpuSecondsPer1k" not in summary
    assert summary["ttftP95"] == "0.50s"


def test_a_problem_keeps_the_last_summary() -> None:
    state = snapshot(signals(hit=0.874))
    decision = decide(spec(), state, learned(), T0)
    status = render(
        CacheScalingPolicyStatus(),
        decision,
        state,
        generation=1,
        now=T0,
        applied=False,
        warmup_seconds=0,
    ).wire
    problem = render_problem(
        CacheScalingPolicyStatus.model_validate(status),
        Problem.TARGET_NOT_FOUND,
        "gone",
        generation=1,
        now=T0,
    ).wire
    assert problem["summary"] == status["summary"]


def test_significant_rounds_to_three_digits() -> None:
    assert significant(0.874417119214396) == 0.874
    assert significant(1142.3) == 1140.0
    assert significant(0.0) == 0.0
