"""A CacheScalingPolicy as the operator leaves it, and a kubeconfig for a fake API server:
what ``cachescale report --around policy/NAME`` reads in the report tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RESOURCE = "cachescale.dev/v1alpha1/cachescalingpolicies"


def alert(since: str, reason: str = "PrefixCollapse", **extra: Any) -> dict[str, Any]:
    """One entry of ``status.alerts``."""
    return {"reason": reason, "since": since, "message": "warm-pod hit rate 0.04", **extra}


def kubeconfig(folder: Path, server: str, namespace: str | None = None) -> str:
    """A kubeconfig for ``server``; its context's namespace when given."""
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace is not None:
        context["namespace"] = namespace
    path = folder / "kubeconfig"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server.rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "c", "context": context}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return str(path)


def stored_policy(
    namespace: str, status: dict[str, Any], prometheus_url: str | None = "http://127.0.0.1:1"
) -> dict[str, Any]:
    """A CacheScalingPolicy named vllm with ``status``, as the operator would leave it."""
    metrics: dict[str, Any] = {"selector": {"namespace": namespace, "model_name": "llama-3-8b"}}
    if prometheus_url is not None:
        metrics["prometheusUrl"] = prometheus_url
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": "vllm", "namespace": namespace, "uid": "uid-vllm"},
        "spec": {"target": {"deploymentName": "vllm"}, "metrics": metrics},
        "status": status,
    }
