"""The chart's cap on Prometheus answers: ``prometheus.maxResponseBytes`` becomes the
``--prometheus-max-response-bytes`` flag the operator's own parser accepts, at 16 MiB by
default, and the schema refuses a cap that is not a positive whole number."""

from __future__ import annotations

import pytest

from cachescale.commands.main import build_parser
from cachescale.gather.prometheus import MAX_RESPONSE_BYTES
from tests.chart.chart_helpers import operator_args as args
from tests.chart.chart_helpers import render_error


def test_the_default_cap_is_rendered_as_the_flag_in_whole_bytes() -> None:
    rendered = args({})
    assert f"--prometheus-max-response-bytes={MAX_RESPONSE_BYTES}" in rendered
    assert build_parser().parse_args(rendered).prometheus_max_response_bytes == MAX_RESPONSE_BYTES


def test_a_large_cap_is_rendered_without_an_exponent() -> None:
    rendered = args({"prometheus": {"maxResponseBytes": 1073741824}})
    assert "--prometheus-max-response-bytes=1073741824" in rendered
    assert build_parser().parse_args(rendered).prometheus_max_response_bytes == 1073741824


@pytest.mark.parametrize("cap", [0, -1, 1.5, "16Mi"])
def test_a_cap_that_is_not_a_positive_whole_number_is_refused(cap: object) -> None:
    assert "maxResponseBytes" in render_error({"prometheus": {"maxResponseBytes": cap}})
