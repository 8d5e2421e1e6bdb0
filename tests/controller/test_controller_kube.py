"""The API client when the API server gives no answer at all (down, restarting).

e2e/test_faults.py kills the real API server mid-run; this is the same failure at unit
scale: the request must end in a typed ``KubeError`` the evaluation reports
(``ApiError``), after the usual retries, never in a transport exception that escapes the
evaluation as a crash with a traceback.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from cachescale.controller import kube
from cachescale.controller.kube import UNREACHABLE, KubeApi, KubeError
from tests.gather.gather_fakes import closed_port_url


def test_no_answer_is_a_typed_error_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "BACKOFF_S", 0.0)
    configuration = client.Configuration()
    configuration.host = closed_port_url()
    configuration.retries = 0
    api = KubeApi(client.ApiClient(configuration))
    sent = []
    original = api._send

    def counted(*args: object) -> tuple[int, bytes]:
        sent.append(args)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "_send", counted)
    with pytest.raises(KubeError) as failure:
        api.get("/apis/apps/v1/namespaces/llm/deployments/vllm")
    assert failure.value.status == UNREACHABLE
    assert "no answer from the API server" in failure.value.message
    assert len(sent) == kube.RETRIES + 1
