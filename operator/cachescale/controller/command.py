"""``cachescale run``: start the operator against the cluster in reach.

Out of cluster it uses ``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``; inside a
pod, the ServiceAccount. It watches every namespace, or only those given with
``--namespace`` (repeatable). One replica runs ``--standalone`` (the default); several
replicas share a kopf peering object (``--peering NAME``) and exactly one acts. Beside
kopf it serves ``/metrics`` (Prometheus exposition) and ``/healthz`` / ``/readyz``.
SIGTERM stops it gracefully: running evaluations finish, daemons are cancelled.
``--allowed-prometheus-url`` (repeatable) limits where policies may make it connect
(``cachescale.gather.egress``, ``docs/security.md``); without it, anywhere, with a warning.
The chart names the operator's own Deployment in its environment, and no policy may target
it (``controller/claims.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf
from aiohttp import web
from prometheus_client import start_http_server

from cachescale.api.exit_codes import ExitCode
from cachescale.controller.claims import OperatorIdentity
from cachescale.controller.evaluation import Operator
from cachescale.controller.handlers import Runtime
from cachescale.controller.kube import KubeApi, load_config
from cachescale.gather.egress import REGEX_PREFIX, AllowedUrls

log = logging.getLogger("cachescale.operator")


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
        metavar="NS",
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="/metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8080, help="/healthz, /readyz port")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", metavar="NAME", help="kopf peering object shared by replicas (HA)"
    )
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: a single replica (default)"
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
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Start the operator and block until it stops."""
    from cachescale.controller.handlers import kubeconfig_login  # registers the handlers

    if args.kubeconfig:
        path = args.kubeconfig

        @kopf.on.login(id="kubeconfig")
        def _login(**_: object) -> kopf.ConnectionInfo:
            return kubeconfig_login(path)

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    allowed = args.allowed_prometheus_url
    if not allowed:
        log.warning(
            "no --allowed-prometheus-url: any policy author can make the operator connect "
            "to any address (docs/security.md)"
        )
    operator = Operator(
        KubeApi(load_config(args.kubeconfig)),
        allowed_urls=AllowedUrls.parse(allowed) if allowed else None,
    )
    itself = OperatorIdentity.from_env(os.environ)  # the chart's; None out of cluster
    runtime = Runtime(operator, itself=itself, scanning=not args.no_scanning)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=runtime.operator.metrics.registry)
    asyncio.run(_main(args, runtime))
    return ExitCode.OK


async def _main(args: argparse.Namespace, runtime: Runtime) -> None:
    health = await _serve_health(args.health_port, runtime) if args.health_port else None
    try:
        await kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=args.peering is None,
            peering_name=args.peering,
            memo=kopf.Memo(runtime=runtime),
        )
    finally:
        if health is not None:
            await health.cleanup()


async def _serve_health(port: int, runtime: Runtime) -> web.AppRunner:
    """``/healthz``: the event loop answers; ``/readyz``: startup finished (standby peers
    included, so a rollout of several replicas never waits on the one that acts)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if runtime.ready.is_set():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="starting\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()  # probes come from the kubelet
    log.info("health on :%d, metrics ready", port)
    return runner
