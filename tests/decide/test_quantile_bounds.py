"""A TTFT quantile past the histogram's last bucket is a lower bound, and decisions say so.

``histogram_quantile`` returns the last finite bound (400 s for SGLang, 2,560 s for vLLM)
when the quantile lies beyond it; the gather layer marks it ``lower_bound``. Decisions
count it as above the SLO, even when the bound itself is not (custom buckets), and every
message quotes it as "> 400 s", never as a measured 400 s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cachescale.api.reasons import Diagnosis
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import decide, words
from cachescale.decide.diagnosis import run_checks
from cachescale.snapshot import Measured, Unit
from tests.decide.decide_builders import T0, learned, signals, snapshot, spec


def beyond(bound: float) -> Measured:
    return Measured.quantile(bound, Unit.SECONDS, lower_bound=True)


@pytest.mark.parametrize("bound", [400.0, 0.5])
def test_a_lower_bound_is_above_the_slo_even_when_the_bound_is_not(bound: float) -> None:
    engine = replace(signals(), ttft_p95_seconds=beyond(bound))
    results = run_checks(spec(), snapshot(engine), learned())
    assert results.slo_breach
    assert not results.slo_comfortable


def test_a_lower_bound_p99_breaches_a_p99_objective() -> None:
    policy = spec(slo={"ttftP95Seconds": 1.0, "ttftP99Seconds": 2.0})
    engine = replace(signals(), ttft_p99_seconds=beyond(1.5))
    assert run_checks(policy, snapshot(engine), learned()).slo_breach


def test_the_message_quotes_the_bound_as_a_bound() -> None:
    engine = replace(signals(), ttft_p95_seconds=beyond(400.0))
    decision = decide(spec(), snapshot(engine), learned(), T0)
    (finding,) = [f for f in decision.findings if f.diagnosis is Diagnosis.SLO_AT_RISK]
    assert "TTFT p95 > 400 s above the 1.00 s SLO" in finding.evidence
    slo = next(c for c in decision.conditions if c.type is ConditionType.SLO_MET)
    assert slo.status is ConditionStatus.FALSE
    assert "> 400 s" in slo.message


def test_a_wide_bucket_is_stated_beside_the_value() -> None:
    wide = Measured.quantile(2368.0, Unit.SECONDS, bucket=(640.0, 2560.0))
    assert words.latency(wide) == "2,368 s (bucket 640–2,560 s)"
    assert words.latency(beyond(400.0)) == "> 400 s"
    assert words.latency(Measured.known(0.58, Unit.SECONDS)) == "0.58 s"
