"""The operator's cap on Prometheus answers: ``--prometheus-max-response-bytes`` is a
positive whole number, and every client the operator makes carries it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from cachescale.commands.main import build_parser
from cachescale.controller.kube.client import KubeApi
from cachescale.controller.reconcile.context import Operator
from cachescale.gather.prometheus import MAX_RESPONSE_BYTES, PrometheusClient, PrometheusConfig

FLAG = "--prometheus-max-response-bytes"


def test_the_flag_takes_a_positive_whole_number_and_defaults_to_the_clients_cap() -> None:
    assert build_parser().parse_args(["run", FLAG, "1048576"]).prometheus_max_response_bytes == (
        1048576
    )
    assert build_parser().parse_args(["run"]).prometheus_max_response_bytes is None
    assert Operator(cast(KubeApi, object())).max_response_bytes == MAX_RESPONSE_BYTES


@pytest.mark.parametrize("value", ["0", "-5", "16Mi", "1.5"])
def test_a_cap_that_is_not_a_positive_whole_number_is_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["run", FLAG, value])
    assert caught.value.code == 2
    assert FLAG in capsys.readouterr().err


def test_every_client_the_operator_makes_carries_its_cap() -> None:
    made: list[PrometheusConfig] = []

    def new_client(config: PrometheusConfig) -> PrometheusClient:
        made.append(config)
        return cast(PrometheusClient, object())

    operator = Operator(cast(KubeApi, object()), max_response_bytes=4096, new_client=new_client)
    policy_config: dict[str, Any] = {"url": "http://prom.a:9090", "bearer_token": "t"}
    operator.prometheus(PrometheusConfig(**policy_config))
    operator.prometheus(PrometheusConfig(url="http://prom.b:9090"))
    assert [config.max_response_bytes for config in made] == [4096, 4096]
    assert made[0].bearer_token == "t"
