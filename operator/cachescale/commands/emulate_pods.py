"""``cachescale emulate --pods-of``: the emulator scraped as a real Deployment's pods.

Without a GPU, a Deployment whose pods run no engine (Pending for want of a GPU node, or
an image that idles) stands in for a serving fleet, and the emulator serves its metrics: with
``--pods-of [NAMESPACE/]DEPLOYMENT`` each served replica's target is labelled with one of
that Deployment's pods (name and namespace), so the operator, which finds the pods
through the Deployment's selector and reads their series by ``pod``, reads the emulated
series as those pods' (``emulator/pods_of.py`` assigns the names and follows the pods).

Read-only, through the user's kubeconfig (``--kubeconfig``, else in-cluster, else
``$KUBECONFIG`` or ``~/.kube/config``): the Deployment's ``scale`` subresource once at
start, whose ``status.selector`` is the API server's own rendering of the Deployment's
selector (what an HPA lists the pods with), then its pods, at start and every second. A
pod being deleted, or whose phase is ``Succeeded`` or ``Failed``, is left out; the others
are taken oldest first, Ready or not (a pod that cannot run still names a replica). At
start a failure is one line, :class:`PodsOfError` with its exit code: 1 when the
Deployment is not there or the read is refused, 2 when ``--namespace`` names another
namespace, 3 when the API server cannot be reached; later failures keep the last pods
listed (``PodFollower``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cachescale.api.spec_base import DNS_LABEL, DNS_SUBDOMAIN, MAX_LABEL, MAX_NAME
from cachescale.controller.target.draft_target import DraftError, kube_api, read_object
from cachescale.emulator.pods_of import FOLLOW_EVERY_S, PodFollower, PodListError
from cachescale.exit_codes import ExitCode
from cachescale.extras import needs_extra

if TYPE_CHECKING:
    from cachescale.controller.kube.client import KubeApi

GONE_PHASES = ("Succeeded", "Failed")
"""Phases of a pod whose containers have stopped for good: no engine would serve there."""


@dataclass(frozen=True)
class PodsOf:
    """The Deployment ``--pods-of`` names, and its namespace ("": not given yet)."""

    namespace: str
    deployment: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.deployment}"


class PodsOfError(Exception):
    """What stops ``--pods-of`` at start, in one line, and the exit code it maps to."""

    def __init__(self, message: str, code: ExitCode = ExitCode.INVALID) -> None:
        super().__init__(message)
        self.code = code


def pods_of_flag(text: str) -> PodsOf:
    """``--pods-of``: ``DEPLOYMENT`` or ``NAMESPACE/DEPLOYMENT``, as Kubernetes names them
    (exit 2 otherwise)."""
    namespace, _, deployment = text.rpartition("/")
    if namespace and not (re.match(DNS_LABEL, namespace) and len(namespace) <= MAX_LABEL):
        raise argparse.ArgumentTypeError(f"{namespace!r} is not a namespace name")
    if not (re.match(DNS_SUBDOMAIN, deployment) and len(deployment) <= MAX_NAME):
        raise argparse.ArgumentTypeError(f"{deployment!r} is not a Deployment name")
    return PodsOf(namespace, deployment)


def add_arguments(naming: argparse._ActionsContainer, parser: argparse.ArgumentParser) -> None:
    """``--pods-of`` (in ``naming``, the group it excludes ``--deployment`` from) and
    ``--kubeconfig``."""
    naming.add_argument(
        "--pods-of",
        type=pods_of_flag,
        metavar="[NAMESPACE/]DEPLOYMENT",
        help="serve each replica as one of this Deployment's real pods (their names and "
        "namespace label the targets; followed as pods come and go), so an operator "
        "reading the Deployment finds its series; NAMESPACE defaults to --namespace",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for --pods-of (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )


def resolve(pods_of: PodsOf, namespace: str | None) -> PodsOf:
    """``pods_of`` with its namespace: its own, else ``--namespace`` (``namespace``), else
    ``llm``; a usage error when both are given and differ."""
    if not pods_of.namespace:
        return PodsOf(namespace or "llm", pods_of.deployment)
    if namespace is not None and namespace != pods_of.namespace:
        raise PodsOfError(
            f"--pods-of {pods_of} and --namespace {namespace} name two namespaces; give one",
            ExitCode.USAGE,
        )
    return pods_of


def pod_lister(
    pods_of: PodsOf, kubeconfig: str | None
) -> tuple[Callable[[], list[str]], list[str]]:
    """A function listing the names of ``pods_of``'s pods, oldest first (raising
    :class:`PodListError` when it cannot), and a first listing; :class:`PodsOfError`
    when the Deployment's selector or that listing cannot be read, or the Kubernetes
    client is not installed."""
    try:
        return lister_of(kube_api(kubeconfig), pods_of)
    except ImportError as error:  # the Kubernetes client is the operator extra's
        raise PodsOfError(f"--pods-of {needs_extra(str(error.name), 'operator')}") from None
    except DraftError as error:
        raise PodsOfError(f"--pods-of {pods_of}: {error}", error.code) from None


def lister_of(api: KubeApi, pods_of: PodsOf) -> tuple[Callable[[], list[str]], list[str]]:
    """:func:`pod_lister` on ``api``."""
    from cachescale.controller.kube.client import UNREACHABLE, KubeError

    namespace, name = pods_of.namespace, pods_of.deployment
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"
    scale = read_object(api, path, f"Deployment {name}", namespace)
    selector = scale.get("status", {}).get("selector")
    if not selector:
        raise DraftError(f"Deployment {name} in namespace {namespace} has no pod selector")
    pods = f"/api/v1/namespaces/{namespace}/pods"

    def names() -> list[str]:
        try:
            return serving_pods(api.items(pods, selector))
        except KubeError as error:
            raise PodListError(f"listing the pods of Deployment {pods_of}: {error}") from None

    try:
        first = serving_pods(api.items(pods, selector))
    except KubeError as error:
        lasting = error.status != UNREACHABLE and error.status < 500
        code = ExitCode.INVALID if lasting else ExitCode.UNAVAILABLE
        raise DraftError(f"listing its pods: {error}", code) from None
    return names, first


def serving_pods(pods: list[dict[str, Any]]) -> list[str]:
    """The names of the pods that may serve, oldest first (created, then name)."""
    kept = [
        pod["metadata"]
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and pod.get("status", {}).get("phase") not in GONE_PHASES
    ]
    return [
        meta["name"]
        for meta in sorted(kept, key=lambda meta: (meta.get("creationTimestamp", ""), meta["name"]))
    ]


def follower(
    pods_of: PodsOf | None, namespace: str | None, kubeconfig: str | None, prog: str
) -> tuple[PodsOf, PodFollower] | None:
    """``--pods-of``'s Deployment, its namespace resolved, and its follower (not started,
    its pods listed once; it reports on stderr, after ``prog``); None without the flag.
    :class:`PodsOfError` when the pods cannot be listed."""
    if pods_of is None:
        return None
    resolved = resolve(pods_of, namespace)
    list_pods, first = pod_lister(resolved, kubeconfig)
    report = PodFollower(list_pods, first, lambda line: print(f"{prog}: {line}", file=sys.stderr))
    return resolved, report


@contextmanager
def following(pods_of: PodsOf, pods: PodFollower, prog: str) -> Iterator[None]:
    """Say which pods are stood in for, and follow them for the duration."""
    names = pods.names()
    print(
        f"{prog}: serving as the pods of Deployment {pods_of} ({len(names)} now: "
        f"{', '.join(names) or 'none'}), listed again every {FOLLOW_EVERY_S:g}s",
        flush=True,
    )
    pods.start()
    try:
        yield
    finally:
        pods.stop()
