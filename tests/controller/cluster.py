"""A fake Kubernetes API (kmock's stateful emulator) on loopback, and the objects of a
vLLM serving stack to put in it.

kmock runs in a background thread with its own event loop, so the operator code under
test talks to it over real HTTP with the real ``kubernetes`` client, exactly as it would
to an API server. Tests read the stored objects back (``cluster.get``) and every
request the operator made (``cluster.requests``), and can script reactions such as a
409 on the first patch.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kmock
from kubernetes import client

from cachescale.api.status import unpack_learned_state
from cachescale.controller.kube.client import KubeApi

DEPLOYMENTS = "apps/v1/deployments"
HPAS = "autoscaling/v2/horizontalpodautoscalers"
PODS = "v1/pods"
POLICIES = "cachescale.dev/v1alpha1/cachescalingpolicies"
"""The emulator's keys of the kinds the tests put and get."""
RESOURCES = {
    DEPLOYMENTS: "Deployment",
    HPAS: "HorizontalPodAutoscaler",
    PODS: "Pod",
    "v1/events": "Event",
    "v1/secrets": "Secret",
    POLICIES: "CacheScalingPolicy",
}
NAMESPACE = "llm"


@dataclass
class FakeCluster:
    """The running emulator and a client for it."""

    emulator: kmock.KubernetesEmulator
    url: str
    loop: asyncio.AbstractEventLoop
    api: KubeApi = field(init=False)

    def __post_init__(self) -> None:
        configuration = client.Configuration()
        configuration.host = self.url.rstrip("/")
        self.api = KubeApi(client.ApiClient(configuration))

    def put(self, resource: str, obj: Mapping[str, Any]) -> None:
        """Store ``obj`` (namespace and name from its metadata)."""
        meta = obj["metadata"]
        body = copy.deepcopy(dict(obj))
        body["metadata"].setdefault("resourceVersion", "1")
        self._call(
            lambda: self.emulator.objects.__setitem__(
                (resource, meta.get("namespace"), meta["name"]), body
            )
        )

    def get(self, resource: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        """The stored object, as the API would return it now."""
        return dict(self.emulator.objects[resource, namespace, name].raw)

    def requests(self, method: str) -> list[Any]:
        """Requests made so far with this HTTP method."""
        return [r for r in list(self.emulator) if r.method.value.lower() == method.lower()]

    def serve_resource(self, resource: str, info: Mapping[str, Any]) -> None:
        """Serve one more kind of resource (its discovery info: namespaced, kind, verbs,
        subresources), or replace how one is served."""
        self._call(lambda: self.emulator.resources.__setitem__(resource, dict(info)))

    def react(self, criteria: Any, payload: Any) -> None:
        """Script a reaction, e.g. ``cluster.react(kmock_view, 409)``."""
        self._call(lambda: criteria << payload)

    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait(5)


START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@dataclass
class Clock:
    """The operator's notion of now, moved by the test."""

    now: datetime = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@contextmanager
def fake_cluster() -> Iterator[FakeCluster]:
    """A kmock Kubernetes emulator with the resources the operator uses."""
    ready = threading.Event()
    stop = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            for resource, kind in RESOURCES.items():
                emulator.resources[resource] = {"namespaced": True, "kind": kind}
            box.update(emulator=emulator, url=str(server.url), loop=asyncio.get_running_loop())
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(10), "kmock did not start"
    try:
        yield FakeCluster(box["emulator"], box["url"], box["loop"])
    finally:
        stop.set()
        thread.join(10)


# --- the objects of a serving stack -------------------------------------------------------


def deployment(
    name: str = "vllm",
    *,
    replicas: int = 4,
    args: list[str] | None = None,
    command: list[str] | None = None,
    gpus: int = 2,
    container: str = "vllm",
) -> dict[str, Any]:
    """A vLLM Deployment, settled (no rollout in progress)."""
    engine: dict[str, Any] = {
        "name": container,
        "image": "vllm/vllm-openai:v0.13.0",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    if command is not None:
        engine["command"] = command
    if args is not None:
        engine["args"] = args
    elif command is None:
        engine["args"] = ["--model", "llama", "--max-num-seqs", "32"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE, "generation": 3},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "sidecar", "image": "envoy"}, engine]},
            },
        },
        "status": {
            "observedGeneration": 3,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
        },
    }


def hpa(
    name: str = "vllm",
    *,
    target: str = "vllm",
    min_replicas: int = 2,
    max_replicas: int = 40,
    average_value: str = "24",
    metric: str = "vllm:num_requests_running",
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An autoscaling/v2 HPA on a per-pod engine gauge, plus a CPU metric and behavior the
    operator must leave alone."""
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": {"team": "ml"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 80},
                    },
                },
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric},
                        "target": {"type": "AverageValue", "averageValue": average_value},
                    },
                },
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
        },
    }


def pods(app: str, count: int, now: datetime, age_s: float = 3600.0) -> list[dict[str, Any]]:
    """``count`` ready pods of ``app``, ready for ``age_s`` seconds."""
    since = (now - timedelta(seconds=age_s)).isoformat()
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{app}-{i}", "namespace": NAMESPACE, "labels": {"app": app}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]
            },
        }
        for i in range(count)
    ]


def policy(
    name: str = "vllm",
    *,
    prometheus_url: str,
    mode: str = "Enforce",
    deployment_name: str = "vllm",
    hpa_name: str = "vllm",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A CacheScalingPolicy for the stack, short window, no warm-up (tests move fast)."""
    spec: dict[str, Any] = {
        "mode": mode,
        "target": {"deploymentName": deployment_name, "hpaName": hpa_name},
        "metrics": {
            "prometheusUrl": prometheus_url,
            "selector": {"namespace": NAMESPACE, "model_name": name},
            "window": "1m",
            "interval": "10s",
        },
        "slo": {"ttftP95Seconds": 1.0},
        "budget": {"gpuSecondsPer1kRequests": 800, "minReplicas": 2, "maxReplicas": 40},
        "cache": {"podWarmupSeconds": 0},
    }
    for key, value in (extra or {}).items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "generation": 1},
        "spec": spec,
    }


def learned_baseline(status: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline the operator learned, from a policy's stored status (its packed
    ``learnedState``): ``tokenHitRate``, ``gpuSecondsPer1kRequests``, ... and
    ``evaluations``; empty when there is none yet."""
    packed = status.get("learnedState")
    memory = unpack_learned_state(packed) if isinstance(packed, str) else {}
    baseline = memory.get("baseline")
    return dict(baseline) if isinstance(baseline, Mapping) else {}
