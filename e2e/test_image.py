"""The operator image, built here and run on the real API server as the chart runs it.

The image is built from this tree's Dockerfile with podman on a base made from Debian's
packages (e2e/image.py); the container runs with the image's own user, a read-only root
filesystem and the chart's ServiceAccount (a TokenRequest token), the chart's flags, and
serves one policy in its namespace until the policy says ``MetricsAvailable=True``: the
image starts, logs in, reads its policy, queries Prometheus and writes status. The
"Prometheus" is the fault tests' switchable one, answering for a healthy fleet.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.fault_rig import SwitchablePrometheus
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.image import built_image, image_operator, podman
from e2e.kube_helpers import apply, condition_of, get, until
from e2e.operators import chart_flags
from e2e.serving import APP, create_stack
from tests.controller.cluster import policy as policy_body
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS

MODEL = "image-model"
IMAGE_UID = 10001
"""The chart's runAsUser: the image must run as it without being told."""
MAX_IMAGE_BYTES = 450 * 1024 * 1024
"""What the image may weigh: the Debian base with python3 and the operator's virtualenv
(the kubernetes client is most of it). A build that grows past it is a regression."""


@pytest.fixture(scope="module")
def image() -> str:
    tag, size = built_image()
    print(f"\nimage {tag}: {size / 1e6:.0f} MB")
    assert size <= MAX_IMAGE_BYTES, f"{tag} is {size / 1e6:.0f} MB"
    return tag


def test_the_image_runs_as_the_charts_account_to_metrics_available(
    cluster: Cluster, release: Release, image: str, tmp_path: Path
) -> None:
    namespace = f"cachescale-e2e-image-{int(time.time()) % 100000}"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    account = tmp_path / "account"
    account.mkdir()
    kubeconfig = cluster.token_kubeconfig(
        account / "operator.kubeconfig", release.namespace, release.service_account
    )
    _, pods = create_stack(cluster, namespace, MODEL, 2)
    selector = {"namespace": namespace, "model_name": MODEL}
    engines = EngineFake()
    engines.set(selector, EngineNumbers(pods=tuple(pods)))
    prometheus = SwitchablePrometheus(engines)
    prometheus.start()
    installed = get(cluster, "deployment", release.name, "-n", release.namespace)
    flags = (*chart_flags(installed), "--namespace", namespace, "--standalone")
    try:
        with image_operator(image, tmp_path, kubeconfig, *flags, *LOOPBACK_PROMETHEUS) as ran:
            body = policy_body(
                APP, prometheus_url=prometheus.url, extra={"metrics": {"selector": selector}}
            )
            body["metadata"] = {"name": APP}
            apply(cluster, namespace, body)

            def available() -> dict[str, Any] | None:
                policy = get(cluster, "csp", APP, "-n", namespace) or {}
                metrics = condition_of(policy, "MetricsAvailable")
                return metrics if metrics and metrics["status"] == "True" else None

            try:
                metrics = until(available, "MetricsAvailable=True from the image", 120)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{ran.operator.tail()}") from None
            assert metrics["reason"] == "SignalsRead", metrics
            inspected = podman("inspect", ran.name)
            assert inspected.returncode == 0, inspected.stderr
            (container,) = json.loads(inspected.stdout)
            assert container["Config"]["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
            assert container["HostConfig"]["ReadonlyRootfs"] is True
            assert ran.operator.probe("/readyz") == 200
    finally:
        prometheus.kill()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
