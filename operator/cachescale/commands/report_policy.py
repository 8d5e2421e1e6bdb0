"""Read one CacheScalingPolicy for ``cachescale report --around policy/NAME``.

The one part of ``cachescale report`` that needs the Kubernetes client (the ``operator``
extra), imported only when a policy is named. It connects as ``cachescale init`` does
(``draft_target.kube_api``: ``--kubeconfig``, else in-cluster, else ``$KUBECONFIG`` or
``~/.kube/config``), fails as ``init`` does (1 not found or refused, 3 the API server did
not answer, each in one line), and reads nothing else. Without ``--namespace`` the
namespace is the pod's own when connected in-cluster, else the kubeconfig context's, else
``default``.
"""

from __future__ import annotations

from pathlib import Path

from cachescale.api.policy import API_VERSION, KIND, PLURAL
from cachescale.commands.report_around import PolicyRead, PolicyReadError
from cachescale.controller.target.draft_target import DraftError, kube_api, read_object

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def read_policy(kubeconfig: str | None, namespace: str | None, name: str) -> PolicyRead:
    """The policy ``name`` in ``namespace`` (None: the context's); raises
    ``PolicyReadError``, or ``ImportError`` without the ``operator`` extra."""
    try:
        api = kube_api(kubeconfig)
        where = namespace or context_namespace(kubeconfig)
        body = read_object(
            api,
            f"/apis/{API_VERSION}/namespaces/{where}/{PLURAL}/{name}",
            f"{KIND} {name}",
            where,
        )
    except DraftError as error:
        raise PolicyReadError(str(error), error.code) from None
    return PolicyRead(namespace=where, body=body)


def context_namespace(kubeconfig: str | None) -> str:
    """The namespace to read in without ``--namespace``: the pod's own when connected
    in-cluster (``kube.load_config`` tries that first), else the current kubeconfig
    context's, else ``default``."""
    from kubernetes import config

    if kubeconfig is None and SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, AttributeError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")
