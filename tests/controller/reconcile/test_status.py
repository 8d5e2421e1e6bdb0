"""The status a quantile past its last bucket, or in a wide one, leaves for humans.

``ttftP95Seconds`` keeps the number Prometheus gave (a machine may still compare it);
``qualifiedSignals`` says how to read it: "> 400 s" for a lower bound, the bucket beside
a value interpolated in a wide one. Plain quantiles are not listed.
"""

from __future__ import annotations

from dataclasses import replace

from cachescale.api.status import CacheScalingPolicyStatus
from cachescale.controller.reconcile.status import render
from cachescale.decide import decide
from cachescale.snapshot import Measured, Unit
from tests.decide.decide_builders import T0, learned, signals, snapshot, spec


def test_lower_bounds_and_wide_buckets_are_qualified_in_status() -> None:
    engine = replace(
        signals(),
        ttft_p95_seconds=Measured.quantile(400.0, Unit.SECONDS, lower_bound=True),
        ttft_p99_seconds=Measured.quantile(1800.0, Unit.SECONDS, bucket=(640.0, 2560.0)),
    )
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
    observed = status["signals"]
    assert observed["ttftP95Seconds"] == 400.0
    assert status["summary"]["ttftP95"] == ">400s"  # what the kubectl get column shows
    assert observed["qualifiedSignals"] == [
        {"signal": "ttftP95Seconds", "reads": "> 400 s"},
        {"signal": "ttftP99Seconds", "reads": "1,800 s (bucket 640–2,560 s)"},
    ]
    slo = next(c for c in status["conditions"] if c["type"] == "SLOMet")
    assert "TTFT p95 > 400 s above the 1.00 s SLO" in slo["message"]
