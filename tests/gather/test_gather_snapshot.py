"""The snapshot types: a value is known and finite, or unknown with a reason — never both."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from cachescale.snapshot import (
    SIGNAL_UNITS,
    EngineSignals,
    FetchFailure,
    Measured,
    PodSignals,
    Unit,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def test_known_and_unknown() -> None:
    known = Measured.known(0.85, Unit.RATIO)
    unknown = Measured.unknown("series absent", Unit.RATIO)
    assert (known.is_known, known.value, known.reason) == (True, 0.85, None)
    assert (unknown.is_known, unknown.value, unknown.reason) == (False, None, "series absent")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_not_measurements(value: float) -> None:
    with pytest.raises(ValueError, match="not a measurement"):
        Measured.known(value, Unit.SECONDS)


@pytest.mark.parametrize(("value", "reason"), [(None, None), (1.0, "both")])
def test_exactly_one_of_value_and_reason(value: float | None, reason: str | None) -> None:
    with pytest.raises(ValueError, match="either a value or an unknown"):
        Measured(Unit.RATIO, value, reason)


def test_measured_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Measured.known(1, Unit.SECONDS).value = 2  # type: ignore[misc]


def test_every_fleet_signal_has_a_unit_and_only_those() -> None:
    snapshot = EngineSignals.all_unknown("down", observed_at=AT, window_seconds=300)
    assert set(snapshot.signals()) == set(SIGNAL_UNITS)
    assert {name: m.unit for name, m in snapshot.signals().items()} == SIGNAL_UNITS


def test_all_unknown_carries_the_reason_and_failure() -> None:
    snapshot = EngineSignals.all_unknown(
        "Prometheus is unreachable at http://p:9090: connection refused",
        observed_at=AT,
        window_seconds=300,
        failure=FetchFailure.UNREACHABLE,
    )
    assert snapshot.failure is FetchFailure.UNREACHABLE
    assert {reason for _, reason in snapshot.unknown_signals()} == {
        "Prometheus is unreachable at http://p:9090: connection refused"
    }


def pod(name: str, age: float | None, rate: float, volume: float) -> PodSignals:
    some = Measured.known(1, Unit.REQUESTS)
    return PodSignals(
        pod=name,
        age_seconds=Measured.known(age, Unit.SECONDS)
        if age is not None
        else Measured.unknown("no age", Unit.SECONDS),
        token_hit_rate=Measured.known(rate, Unit.RATIO),
        prompt_tokens_looked_up_per_second=Measured.known(volume, Unit.TOKENS_PER_SECOND),
        waiting_requests=some,
        running_requests=some,
        kv_cache_usage_ratio=Measured.known(0.5, Unit.RATIO),
    )


def test_warm_hit_rate_is_token_weighted_over_warm_pods_only() -> None:
    pods = (pod("old", 3600, 0.9, 3000), pod("older", 7200, 0.5, 1000), pod("cold", 30, 0.1, 5000))
    snapshot = dataclasses.replace(
        EngineSignals.all_unknown("x", observed_at=AT, window_seconds=300), pods=pods
    )
    assert snapshot.warm_token_hit_rate(600).value == pytest.approx((2700 + 500) / 4000)


def test_warm_hit_rate_is_unknown_without_warm_pods() -> None:
    pods = (pod("cold", 30, 0.1, 5000), pod("unknown-age", None, 0.9, 100))
    snapshot = dataclasses.replace(
        EngineSignals.all_unknown("x", observed_at=AT, window_seconds=300), pods=pods
    )
    warm = snapshot.warm_token_hit_rate(600)
    assert warm.value is None
    assert "no pod is known to be older than 600s" in str(warm.reason)


def test_snapshot_module_imports_nothing_that_does_io() -> None:
    code = (
        "import sys, cachescale.snapshot; "
        "bad = {'requests', 'prometheus_api_client', 'kubernetes', 'kopf', 'urllib3', 'socket'}; "
        "print(sorted(bad & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
