"""The chart's status refresh (docs/reliability.md, Status writes): ``operator.statusRefresh``
becomes ``--status-refresh``, which the operator's own parser accepts within its bounds,
and the schema refuses a value that is not a duration."""

from __future__ import annotations

import pytest

from cachescale.commands.main import build_parser
from cachescale.controller.reconcile.status_writes import STATUS_REFRESH_SECONDS
from tests.chart.chart_helpers import operator_args as args
from tests.chart.chart_helpers import render_error


def test_the_status_refresh_is_a_flag_the_operator_parses() -> None:
    assert build_parser().parse_args(args({})).status_refresh == STATUS_REFRESH_SECONDS
    assert build_parser().parse_args(["run"]).status_refresh == STATUS_REFRESH_SECONDS
    rendered = args({"operator": {"statusRefresh": "30m"}})
    assert "--status-refresh=30m" in rendered
    assert build_parser().parse_args(rendered).status_refresh == 1800.0


def test_the_schema_refuses_a_refresh_that_is_not_a_duration() -> None:
    assert "statusRefresh" in render_error({"operator": {"statusRefresh": "half an hour"}})


@pytest.mark.parametrize("value", ["59s", "24h1s", "0s", "soon"])
def test_the_operator_refuses_a_refresh_outside_a_minute_to_a_day(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["run", "--status-refresh", value])
    assert stopped.value.code == 2
    assert "--status-refresh" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "seconds"), [("1m", 60.0), ("24h", 86_400.0)])
def test_the_bounds_themselves_are_accepted(value: str, seconds: float) -> None:
    assert build_parser().parse_args(["run", "--status-refresh", value]).status_refresh == seconds
