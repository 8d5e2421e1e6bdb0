"""A node stand-in, like kwok: real pods become Running and Ready without a kubelet.

envtest has no scheduler and no kubelet, so the pods the real Deployment controller
creates would stay Pending forever. :class:`FakeNode` plays both parts for one Node:

- it registers the Node (Ready, with CPU, memory and GPU capacity) and renews its Lease
  in ``kube-node-lease``, so the node-lifecycle controller never marks it NotReady;
- it binds every unscheduled pod to itself through the ``pods/binding`` subresource,
  as the scheduler does;
- it reports each bound pod Running and Ready through ``pods/status``, as a kubelet
  does: ``phase``, the four pod conditions, a pod IP, and a running, ready status for
  every container (image, container ID, start time);
- it finishes the deletion of its pods (a kubelet removes a terminating pod once its
  containers are gone): a rollout's old pods and a deleted namespace's pods go away.

It polls the API every ``interval_s`` on a daemon thread for the whole test session.
Pods get real names, real owners and real creation times from the real controllers; only
the container runtime is missing.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from datetime import UTC, datetime
from typing import Any

from e2e.harness.api import Api, ApiError

NODE = "envtest-node-0"
LEASE_EVERY_S = 10.0
CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": "16"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeNode:
    """One Node that schedules, runs and readies pods by writing their API objects."""

    def __init__(self, api: Api, name: str = NODE, interval_s: float = 0.3) -> None:
        self.api = api
        self.name = name
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"fake-node-{name}", daemon=True)
        self._ips = (f"10.244.{n // 250}.{n % 250 + 2}" for n in itertools.count())
        self._lease_at = 0.0
        self.errors: list[str] = []
        self.readied: list[str] = []
        """``namespace/name`` of every pod made Ready, in order."""

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> FakeNode:
        """Register the Node and start serving pods."""
        self._register()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (the Node object stays; the control plane goes with it)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except (ApiError, OSError) as error:  # the server may be busy or stopping
                self.errors.append(str(error))
                del self.errors[:-20]

    # -- the node ---------------------------------------------------------------------

    def _register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {"kubernetes.io/hostname": self.name, "type": "envtest-fake-node"},
            },
            "spec": {},
        }
        with contextlib.suppress(ApiError):
            self.api.post("/api/v1/nodes", node)
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "the e2e node stand-in runs pods by writing their status",
            "lastHeartbeatTime": _now(),
            "lastTransitionTime": _now(),
        }
        status = {
            "status": {
                "capacity": CAPACITY,
                "allocatable": CAPACITY,
                "conditions": [ready],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "nodeInfo": {"kubeletVersion": "fake", "architecture": "amd64"},
            }
        }
        self.api.patch(f"/api/v1/nodes/{self.name}/status", status)
        self._renew_lease()

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": _micro_now()}
        try:
            self.api.patch(path, {"spec": spec})
        except ApiError as error:
            if error.status != 404:
                raise
            body = {"metadata": {"name": self.name}, "spec": spec}
            self.api.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body)

    # -- pods -------------------------------------------------------------------------

    def sync(self) -> None:
        """One pass: renew the lease when due, bind, ready and finish deleting pods."""
        if time.monotonic() - self._lease_at > LEASE_EVERY_S:
            self._renew_lease()
            self._lease_at = time.monotonic()
        for pod in self.api.get("/api/v1/pods")["items"]:
            meta, spec = pod["metadata"], pod.get("spec", {})
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            node = spec.get("nodeName")
            if meta.get("deletionTimestamp"):
                if node in (None, self.name):
                    self._finish_deletion(path, meta)
            elif not node:
                self._bind(path, meta)
            elif node == self.name and not _is_ready(pod):
                self._run(path, pod)

    def _bind(self, path: str, meta: dict[str, Any]) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
        }
        with contextlib.suppress(ApiError):  # 409: already bound (or gone) meanwhile
            self.api.post(f"{path}/binding", binding)

    def _run(self, path: str, pod: dict[str, Any]) -> None:
        now = _now()
        containers = pod["spec"].get("containers", [])
        condition_types = ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": next(self._ips),
            "startTime": now,
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in condition_types
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": f"fake://{container.get('image', '')}",
                    "containerID": f"fake://{pod['metadata']['uid']}/{container['name']}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for container in containers
            ],
        }
        with contextlib.suppress(ApiError):  # 404: deleted meanwhile
            self.api.patch(f"{path}/status", {"status": status})
            meta = pod["metadata"]
            self.readied.append(f"{meta['namespace']}/{meta['name']}")

    def _finish_deletion(self, path: str, meta: dict[str, Any]) -> None:
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        options["preconditions"] = {"uid": meta["uid"]}
        with contextlib.suppress(ApiError):  # 404/409: already gone
            self.api.delete(path, options)


def _is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
