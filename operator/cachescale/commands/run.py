"""``cachescale run``: start the operator against the cluster in reach.

Out of cluster it uses ``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``; inside a
pod, the ServiceAccount. It watches every namespace, or only those given with
``--namespace`` (repeatable), and of those only the policies matching
``--policy-selector`` (a label selector): several releases, each with its own namespaces
or selector and its own peering object, split a fleet too big for one process. One
replica runs ``--standalone`` (the default); several replicas share a kopf peering object
(``--peering NAME``) and exactly one acts. Beside kopf it serves ``/metrics``
(Prometheus exposition) and ``/healthz`` / ``/readyz``. SIGTERM stops it gracefully
(exit 0): running evaluations finish, daemons are cancelled; SIGINT (Ctrl-C) alike, with
exit 130. ``--allowed-prometheus-url``
(repeatable) lists where policies may make it connect (``cachescale.gather.egress``,
``docs/security.md``); without it, a policy may not name its own Prometheus, only the
``--default-prometheus-url`` is read. ``--allow-insecure-tls`` lets policies ask for
unverified TLS (``auth.insecureSkipVerify``); without it they are refused. So does
``--allow-demand-query`` for a policy's own PromQL (confined to its namespace), and
``--prompt-source-namespace`` lists where prompt sources outside a policy's namespace
are read. ``--status-refresh`` sets how long a status may go unwritten while nothing
changes (``controller/reconcile/status_writes.py``).

Flags are checked before anything starts (exit 2), and so are the kubeconfig and the two
ports (exit 1, one line naming the flag): a typo must not end in a stack trace, nor in an
operator that half started.
The chart names the operator's own Deployment in its environment, and no policy may target
it (``controller/target/claims.py``).
"""

from __future__ import annotations

import argparse
import re

from cachescale.api.label_selector import LabelSelector
from cachescale.api.spec_base import DNS_LABEL, MAX_LABEL
from cachescale.commands.flags import at_least_one, duration_seconds
from cachescale.controller.reconcile.fairness import DEFAULT_PER_NAMESPACE
from cachescale.controller.reconcile.status_writes import (
    STATUS_REFRESH_BOUNDS,
    STATUS_REFRESH_SECONDS,
)
from cachescale.controller.runtime.launch import PRIORITIES, refused
from cachescale.extras import needs_extra
from cachescale.gather.egress import REGEX_PREFIX, AllowedUrls, UrlRefused, reached_url

_DNS_LABEL = re.compile(DNS_LABEL)


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
    if len(text) > MAX_LABEL or not _DNS_LABEL.fullmatch(text):
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
    except ImportError:  # no operator extra: ``run`` says so, in one line
        return entry
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return entry


def _default_prometheus_url(text: str) -> str:
    """``--default-prometheus-url``: read by the rules a policy's URL is read by
    (``gather/egress.py``), and kept normalized: what the operator connects to."""
    try:
        return reached_url(text)
    except ImportError:  # no operator extra: ``run`` says so, in one line
        return text
    except UrlRefused as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Prometheus URL the operator accepts: {error}; write "
            "http(s)://host[:port][/path], e.g. http://prometheus.monitoring:9090"
        ) from None


def _status_refresh(text: str) -> float:
    """``--status-refresh``: a duration within ``STATUS_REFRESH_BOUNDS``, in seconds."""
    seconds = duration_seconds(text)
    low, high = STATUS_REFRESH_BOUNDS
    if not low <= seconds <= high:
        raise argparse.ArgumentTypeError(f"{text} is not from {low:g} s to {high:g} s")
    return seconds


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
            "a Prometheus URL prefix policies may name in spec.metrics.prometheusUrl, or a "
            f"regex as {REGEX_PREFIX}<regex> matched against the whole normalized URL "
            "(scheme://host:port/path) (repeatable; a policy outside them is refused with "
            "MetricsURLNotAllowed and nothing is fetched). Default: none, so a policy may not "
            f"name its own Prometheus and reads --default-prometheus-url; {REGEX_PREFIX}.* "
            "allows any URL (SSRF: docs/security.md)"
        ),
    )
    parser.add_argument(
        "--allow-insecure-tls",
        action="store_true",
        help=(
            "let a policy turn off TLS verification (spec.metrics.auth.insecureSkipVerify); "
            "without it such a policy is refused with InsecureTLSNotAllowed and nothing is "
            "fetched or sent"
        ),
    )
    parser.add_argument(
        "--allow-demand-query",
        action="store_true",
        help=(
            "let a policy send its own PromQL (spec.metrics.demandQuery), with every vector "
            "selector in it forced to the policy's namespace; without it such a policy is "
            "refused with DemandQueryNotAllowed and nothing is fetched"
        ),
    )
    parser.add_argument(
        "--prompt-source-namespace",
        action="append",
        default=[],
        type=_object_name,
        metavar="NS",
        help=(
            "a namespace other than its own in which a policy's spec.cache.promptSources are "
            "read (repeatable; chart value rbac.changeCorrelation.namespaces). Default: none, "
            "so a prompt source elsewhere is reported as not read and nothing is listed there"
        ),
    )
    parser.add_argument(
        "--correlate-configmaps",
        action="store_true",
        help=(
            "list ConfigMap metadata (who wrote them, when) when looking for what changed "
            "before a prefix-cache collapse; needs list on configmaps (chart value "
            "rbac.changeCorrelation.configMaps). Default: no ConfigMap is listed, and a "
            "ConfigMap prompt source is reported as not read"
        ),
    )
    parser.add_argument(
        "--default-prometheus-url",
        type=_default_prometheus_url,
        metavar="URL",
        help="the Prometheus a policy reads when it gives no spec.metrics.prometheusUrl "
        "(chart value prometheus.url; the allow list does not apply to it)",
    )
    parser.add_argument(
        "--max-concurrent-per-namespace",
        type=at_least_one,
        default=DEFAULT_PER_NAMESPACE,
        metavar="N",
        help=(
            "evaluation jobs of one namespace's policies running at once: one namespace's "
            "slow Prometheus cannot take the workers other namespaces' policies need "
            f"(default: {DEFAULT_PER_NAMESPACE}; docs/security.md, Fair scheduling)"
        ),
    )
    parser.add_argument(
        "--prometheus-max-response-bytes",
        type=at_least_one,
        metavar="N",
        help=(
            "the most bytes one Prometheus answer may have, as received and as decoded: a "
            "larger one is not read further and the policy reports PrometheusResponseTooLarge "
            "(chart value prometheus.maxResponseBytes; default: 16777216, 16 MiB)"
        ),
    )
    parser.add_argument(
        "--status-refresh",
        type=_status_refresh,
        default=STATUS_REFRESH_SECONDS,
        metavar="DURATION",
        help=(
            "the longest a policy's status goes unwritten while its meaning does not change, "
            f"{STATUS_REFRESH_BOUNDS[0]:g} s to {STATUS_REFRESH_BOUNDS[1]:g} s: the numbers it "
            "shows are at most this old, and a steady fleet writes one status in (this ÷ the "
            "interval) per interval (chart value operator.statusRefresh; default: 10m; "
            "docs/reliability.md, Status writes)"
        ),
    )
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Start the operator (``controller/runtime/serve.py``); its dependencies are imported only
    now, so the rest of the CLI works without the ``operator`` extra."""
    try:
        from cachescale.controller.runtime.serve import serve
    except ImportError as error:
        return refused(needs_extra(str(error.name), "operator"))
    return serve(args)
