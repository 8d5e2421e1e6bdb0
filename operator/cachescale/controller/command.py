"""``cachescale run``: start the operator against the cluster in reach.

Out of cluster it uses ``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``; inside a
pod, the ServiceAccount. It watches every namespace, or only those given with
``--namespace`` (repeatable), and of those only the policies matching
``--policy-selector`` (a label selector): several releases, each with its own namespaces
or selector and its own peering object, split a fleet too big for one process. One
replica runs ``--standalone`` (the default); several replicas share a kopf peering object
(``--peering NAME``) and exactly one acts. Beside kopf it serves ``/metrics``
(Prometheus exposition) and ``/healthz`` / ``/readyz``. SIGTERM stops it gracefully:
running evaluations finish, daemons are cancelled. ``--allowed-prometheus-url``
(repeatable) limits where policies may make it connect (``cachescale.gather.egress``,
``docs/security.md``); without it, anywhere, with a warning.

Flags are checked before anything starts (exit 2), and so are the kubeconfig and the two
ports (exit 1, one line naming the flag): a typo must not end in a stack trace, nor in an
operator that half started.
The chart names the operator's own Deployment in its environment, and no policy may target
it (``controller/claims.py``).
"""

from __future__ import annotations

import argparse
import re
import sys

from cachescale.api.exit_codes import ExitCode
from cachescale.api.label_selector import LabelSelector
from cachescale.gather.command import prometheus_url
from cachescale.gather.egress import REGEX_PREFIX, AllowedUrls

PROG = "cachescale run"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
PRIORITIES = (1, 32_767)
"""The peering priorities a replica may have (``--priority``; random when not given)."""


def _port_or_off(text: str) -> int:
    """``--metrics-port`` / ``--health-port``: a TCP port, or 0 for off."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1 to 65535, or 0: off)")
    return value


def _object_name(text: str) -> str:
    """``--namespace`` / ``--peering``: a Kubernetes name (a DNS label)."""
    if len(text) > 63 or not _DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Kubernetes name (lowercase letters, digits and '-', at most 63)"
        )
    return text


def _priority(text: str) -> int:
    """``--priority``: a peering priority kopf accepts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not PRIORITIES[0] <= value <= PRIORITIES[1]:
        raise argparse.ArgumentTypeError(f"{text} is not within {PRIORITIES[0]}..{PRIORITIES[1]}")
    return value


def _policy_selector(text: str) -> LabelSelector:
    """``--policy-selector``: a label selector the API server accepts."""
    try:
        return LabelSelector.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a label selector: {error}") from None


def _allowed_url(entry: str) -> str:
    """One ``--allowed-prometheus-url`` value, checked when the flags are parsed."""
    try:
        AllowedUrls.parse([entry])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return entry


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``cachescale run``."""
    parser = subparsers.add_parser(
        "run",
        help="run the operator (kopf) against the current cluster",
        description=(
            "Run the cachescale operator: one gather → decide → act loop per "
            "CacheScalingPolicy. Uses the kubeconfig (out of cluster) or the ServiceAccount."
        ),
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        type=_object_name,
        metavar="NS",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--policy-selector",
        type=_policy_selector,
        metavar="SELECTOR",
        help=(
            "serve only the CacheScalingPolicies whose labels match this Kubernetes label "
            "selector, e.g. 'team=search' or 'tier in (a,b),!canary' (filtered by the API "
            "server; default: every policy). With --namespace, releases split the fleet "
            "(docs/install.md, Sharding)"
        ),
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG)")
    parser.add_argument(
        "--metrics-port", type=_port_or_off, default=9090, help="/metrics port (0: off)"
    )
    parser.add_argument(
        "--health-port", type=_port_or_off, default=8080, help="/healthz, /readyz port (0: off)"
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        type=_object_name,
        metavar="NAME",
        help="kopf peering object shared by replicas (HA)",
    )
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: a single replica (default)"
    )
    parser.add_argument(
        "--priority",
        type=_priority,
        metavar="N",
        help=(
            "this replica's peering priority: among live peers the highest acts, and equal "
            f"ones all pause (default: random in {PRIORITIES[0]}..{PRIORITIES[1]})"
        ),
    )
    parser.add_argument(
        "--no-scanning",
        action="store_true",
        help=(
            "never list or watch namespaces and CRDs: serve the --namespace list and the "
            "CRDs present at start (RBAC without cluster-wide access: rbac.namespaced=true)"
        ),
    )
    parser.add_argument(
        "--keda",
        action="store_true",
        help=(
            "also keep KEDA ScaledObjects in a watch-fed index, as Deployments, HPAs and pods "
            "are (needs list and watch on scaledobjects.keda.sh: chart value keda.enabled); "
            "without it a ScaledObject target is read from the API server each evaluation"
        ),
    )
    parser.add_argument(
        "--allowed-prometheus-url",
        action="append",
        default=[],
        type=_allowed_url,
        metavar="URL",
        help=(
            "a Prometheus URL prefix policies may use, or a regex as "
            f"{REGEX_PREFIX}<regex> matched against the whole URL (repeatable; a policy "
            "outside them is refused with MetricsURLNotAllowed; default: any URL)"
        ),
    )
    parser.add_argument(
        "--default-prometheus-url",
        type=prometheus_url,
        metavar="URL",
        help="the Prometheus a policy reads when it gives no spec.metrics.prometheusUrl "
        "(chart value prometheus.url; the allow list does not apply to it)",
    )
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=run)


def refused(message: str) -> int:
    """Say what is wrong in one line, as ``cachescale run``, and return exit code 1."""
    print(f"{PROG}: {message}", file=sys.stderr)
    return ExitCode.INVALID


def run(args: argparse.Namespace) -> int:
    """Start the operator (``controller/serve.py``); its dependencies are imported only
    now, so the rest of the CLI works without the ``operator`` extra."""
    try:
        from cachescale.controller.serve import serve
    except ImportError as error:
        return refused(f"needs {error.name}: pip install 'cachescale[operator]'")
    return serve(args)
