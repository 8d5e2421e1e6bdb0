"""The running operator behind ``cachescale run``: kopf, the probes and ``/metrics``.

Split from ``commands/run.py`` (the flags) so that building the CLI's parser
imports no operator dependency: ``cachescale simulate``, ``validate`` and ``emulate`` run
from a plain ``pip install cachescale``, and only ``run`` needs the ``operator`` extra.
The kubeconfig and the two ports are checked before kopf starts (exit 1, one line).

A shard (``--policy-selector``) is served by a server-side label selector on the policy
watch, not by filters on the handlers: the API server sends only the shard's policies,
so a shard's watch traffic, memory and claims index grow with its own share of the fleet;
and kopf never sees another shard's policies, which matters because with handler filters
it would strip the shared finalizer from every policy its filters skip, letting a policy
be deleted before the shard that serves it restored the HPA. A policy relabelled out of a
shard leaves its watch (the API server sends a deletion): it is unregistered there
(``handlers.membership``), without a restore, and joins the shard it now matches.
The claim rule (``controller/target/claims.py``) sees only the shard's own policies: policies
naming one HPA must fall in one shard (always so when sharding by namespace).
Targets are read from watch-fed indexes (``controller/kube/indexes.py``) that the operator's
own informers fill (``controller/kube/informer.py``, started by a kopf startup handler), in
the same namespaces as the policies; ScaledObjects only with ``--keda``. A cluster-wide
shard (``--policy-selector`` without ``--namespace``) follows only the namespaces its own
policies are in, each from the first of them joining to the last leaving
(``members.Runtime.targets``): shards split by namespace each watch their share. With
``--peering`` the operator picks its kopf identity and priority here, gives both to kopf,
and follows the peering objects with them (``controller/kube/peering.py``).
``/readyz`` says whether it can serve policies now (``controller/runtime/health.py``: the
rule, and the one log line each way when the API server stops and starts answering).
SIGTERM stops it with exit 0, SIGINT (Ctrl-C) with 130 (``exit_codes.py``): kopf stops on
either, and :func:`_kopf_until_stopped` keeps which one it was.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import random
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import kopf
from aiohttp import web
from kubernetes.client import ApiClient
from prometheus_client import disable_created_metrics

from cachescale.api.label_selector import LabelSelector
from cachescale.api.policy import GROUP, PLURAL, VERSION
from cachescale.controller.kube.client import KubeApi, api_client_or_reason
from cachescale.controller.kube.peering import PeeringFollower, peering_objects, watch_peering
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.reconcile.metrics import OperatorMetrics
from cachescale.controller.reconcile.status_writes import StatusWrites
from cachescale.controller.runtime.gc_pace import pace_collections
from cachescale.controller.runtime.health import (
    ApiHealth,
    policy_watch_paths,
    quiet_retries,
    server_name,
)
from cachescale.controller.runtime.kopf_startup import bounded_session, quiet_redundant_wakeups
from cachescale.controller.runtime.launch import PRIORITIES, refused
from cachescale.controller.runtime.members import PHASE_WORKERS, WORKERS, Runtime
from cachescale.controller.runtime.metrics_server import start_metrics_server
from cachescale.controller.target.claims import OperatorIdentity
from cachescale.exit_codes import ExitCode
from cachescale.gather.egress import ALLOWS_ANY, AllowedUrls
from cachescale.gather.prometheus import MAX_RESPONSE_BYTES

log = logging.getLogger("cachescale.operator")


def serve(args: argparse.Namespace) -> int:
    """Start the operator and block until it stops."""
    from cachescale.controller.kube.target_informers import (
        target_informers,  # registers their start
    )
    from cachescale.controller.runtime.handlers import kubeconfig_login  # registers the handlers

    api_client = api_client_or_reason(args.kubeconfig, connections=WORKERS + PHASE_WORKERS)
    if isinstance(api_client, str):
        return refused(api_client)

    path, watches = args.kubeconfig, kopf_watches(args)
    health = ApiHealth(
        server_name(api_client.configuration.host), policy_watch_paths(args.namespace)
    )

    @kopf.on.login(id="bounded-session")
    async def _login(
        logger: kopf.Logger, settings: kopf.OperatorSettings, **_: object
    ) -> kopf.AiohttpSession | None:
        """``--kubeconfig``, or what kopf's own login finds (in-cluster, $KUBECONFIG), in
        a session with bounded connections (``controller/runtime/kopf_startup.py``) that
        ``/readyz`` hears the API server's answers on."""
        info = (
            await asyncio.to_thread(kubeconfig_login, path)
            if path
            else await asyncio.to_thread(kopf.login_via_client, logger=logger, settings=settings)
        )
        if info is None:
            return None
        session = bounded_session(info, watches, [health.trace])
        health.follow(session.aiohttp_session, info.server)
        return session

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    quiet_retries(health, args.verbose)
    allowed = AllowedUrls.parse(args.allowed_prometheus_url)
    _warn_about_egress(allowed, args.allow_insecure_tls)
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    metrics = OperatorMetrics()
    operator = Operator(
        KubeApi(api_client, on_request=metrics.kube_request),
        metrics=metrics,
        allowed_urls=allowed,
        allow_insecure_tls=args.allow_insecure_tls,
        allow_demand_query=args.allow_demand_query,
        prompt_source_namespaces=frozenset(args.prompt_source_namespace),
        correlate_configmaps=args.correlate_configmaps,
        default_prometheus_url=args.default_prometheus_url,
        max_response_bytes=args.prometheus_max_response_bytes or MAX_RESPONSE_BYTES,
        status_writes=StatusWrites(refresh_seconds=args.status_refresh),
    )
    itself = OperatorIdentity.from_env(os.environ)  # the chart's; None out of cluster
    informers = target_informers(
        api_client,
        args.namespace,
        args.keda,
        on_demand=not args.namespace and args.policy_selector is not None,
        on_request=metrics.kube_request,
    )
    runtime = Runtime(
        operator,
        itself=itself,
        scanning=not args.no_scanning,
        max_concurrent_per_namespace=args.max_concurrent_per_namespace,
        targets=informers if informers.on_demand else None,
    )
    try:
        if args.metrics_port:
            start_metrics_server(args.metrics_port, runtime.operator.metrics)
    except OSError as error:  # the port is taken
        return refused(_port_problem("--metrics-port", args.metrics_port, error))
    quiet_redundant_wakeups()
    pace_collections()
    memo = kopf.Memo(runtime=runtime, informers=informers)
    try:
        return asyncio.run(_main(args, memo, api_client, health))
    except _PortTakenError as error:
        return refused(str(error))


def _warn_about_egress(allowed: AllowedUrls, insecure_tls: bool) -> None:
    """Say at start what policy authors may make the operator connect to, when it is more
    than the cluster owner's listed URLs (``docs/security.md``)."""
    if not allowed.entries:
        log.info(
            "no --allowed-prometheus-url: policies may not name their own Prometheus "
            "(only --default-prometheus-url is read)"
        )
    if any(ALLOWS_ANY.fullmatch(entry) for entry in allowed.entries):
        log.warning(
            "--allowed-prometheus-url re:.* allows any URL: any policy author can make the "
            "operator connect to any address it reaches (docs/security.md)"
        )
    elif allowed.patterns:
        log.warning(
            "--allowed-prometheus-url has regular expressions (%s): each admits every URL it "
            "matches, so anchor hosts and ports and escape dots (docs/security.md)",
            ", ".join(allowed.patterns),
        )
    if insecure_tls:
        log.warning(
            "--allow-insecure-tls: policies may have the operator send their credentials "
            "over unverified TLS (spec.metrics.auth.insecureSkipVerify)"
        )


def _port_problem(flag: str, port: int, error: OSError) -> str:
    """Why a port flag's port cannot be bound: ``--health-port: port 8080 is already in
    use``, or the system's reason for another failure."""
    if error.errno == errno.EADDRINUSE:
        return f"{flag}: port {port} is already in use"
    return f"{flag}: port {port}: {os.strerror(error.errno) if error.errno else error}"


class _PortTakenError(Exception):
    """The health port could not be bound (raised before kopf starts)."""


async def _main(
    args: argparse.Namespace, memo: kopf.Memo, api_client: ApiClient, health: ApiHealth
) -> ExitCode:
    """Serve until a signal stops kopf; the exit code it calls for."""
    runtime: Runtime = memo.runtime
    try:
        site = await _serve_health(args.health_port, runtime, health) if args.health_port else None
    except OSError as error:
        raise _PortTakenError(_port_problem("--health-port", args.health_port, error)) from None
    identity = own_identity()
    # Peers with equal priorities all pause: chosen at random, distinct ones let one act.
    priority = args.priority if args.priority is not None else random.randint(*PRIORITIES)
    probe = asyncio.create_task(health.probe_forever(), name="API server probe")
    try:
        with _following_peers(args, runtime, api_client, identity, priority):
            stopped_by = await _kopf_until_stopped(args, memo, identity, priority, probe.cancel)
    finally:
        probe.cancel()
        if site is not None:
            await site.cleanup()
    return ExitCode.INTERRUPTED if stopped_by == signal.SIGINT else ExitCode.OK


async def _kopf_until_stopped(
    args: argparse.Namespace,
    memo: kopf.Memo,
    identity: str,
    priority: int,
    on_signal: Callable[[], object],
) -> signal.Signals | None:
    """``kopf.operator`` (its two halves, as it runs them), with kopf's handlers of SIGINT
    and SIGTERM replaced by ones that keep the signal (and call ``on_signal``): kopf stops
    on the flag as it would on the signal, with the same last resort (a SIGKILL if
    stopping hangs)."""
    settings = shard_settings(args.policy_selector)
    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks()  # the probe among them: not kopf's to wait for
    stop: asyncio.Future[signal.Signals] = loop.create_future()
    tasks = await kopf.spawn_tasks(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        identity=identity,  # type: ignore[arg-type]  # kopf's NewType of str
        priority=priority,
        settings=settings,
        memo=memo,
        stop_flag=stop,
    )

    def stopping(received: signal.Signals) -> None:
        if stop.done():
            return
        stop.set_result(received)  # kopf logs "Signal SIGINT is received" for a signal
        on_signal()
        last_resort = settings.process.ultimate_exiting_timeout
        if last_resort is not None:  # kopf's, which a stop flag turns off
            kill = signal.pthread_kill
            loop.call_later(last_resort, kill, threading.get_ident(), signal.SIGKILL)

    for received in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(received, stopping, received)
    await kopf.run_tasks(tasks, ignored=before)
    return stop.result() if stop.done() else None


def kopf_watches(args: argparse.Namespace) -> int:
    """The watch streams kopf keeps open, each on a connection of its own: the policies
    and, with ``--peering``, the peering object, per served namespace (or cluster-wide);
    namespaces and CRDs unless ``--no-scanning``."""
    scopes = len(args.namespace or ()) or 1
    return scopes * (2 if args.peering else 1) + (0 if args.no_scanning else 2)


def own_identity() -> str:
    """This replica's name among its peers: the pod (its hostname in a cluster), the
    process, and a random suffix so that a restarted process is a new peer."""
    pod = os.environ.get("POD_ID") or socket.gethostname()
    return f"{pod}/{os.getpid()}/{secrets.token_hex(3)}"


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` called from another thread: run on ``loop``."""

    def post(*args: object) -> None:
        loop.call_soon_threadsafe(fn, *args)

    return post


@contextmanager
def _following_peers(
    args: argparse.Namespace,
    runtime: Runtime,
    api_client: ApiClient,
    identity: str,
    priority: int,
) -> Iterator[None]:
    """With ``--peering``: not active until kopf's rule says so on every peering object,
    watched in threads until the operator stops. Standalone: always active."""
    if args.peering is None:
        yield
        return
    loop = asyncio.get_running_loop()
    objects = peering_objects(args.peering, args.namespace)
    follower = PeeringFollower(list(objects), identity, priority, runtime.turn)
    runtime.turn(False)
    stopping = threading.Event()
    for key in objects:
        threading.Thread(
            target=watch_peering,
            args=(api_client, key, _on_loop(loop, follower.seen), stopping),
            kwargs={"on_request": runtime.operator.metrics.kube_request},
            name=f"peering {key[0] or 'cluster'}",
            daemon=True,
        ).start()
    try:
        yield
    finally:
        stopping.set()
        follower.stop()


def shard_settings(shard: LabelSelector | None) -> kopf.OperatorSettings:
    """kopf's settings before startup: the policy watch (its list too) carries the
    ``--policy-selector`` as ``labelSelector``; nothing else kopf watches does (namespaces,
    CRDs, the peering object)."""
    settings = kopf.OperatorSettings()
    if shard is not None:
        settings.watching.label_selectors[GROUP, VERSION, PLURAL] = str(shard)
    return settings


async def _serve_health(port: int, runtime: Runtime, health: ApiHealth) -> web.AppRunner:
    """``/healthz``: the event loop answers; ``/readyz``: startup finished and the operator
    can serve policies now (``controller/runtime/health.py``; standby peers need no policy
    watch, so a rollout of several replicas never waits on the one that acts). A 503 says
    why, in one line."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if not runtime.ready.is_set():
            return web.Response(status=503, text="starting\n")
        problem = health.problem(acting=runtime.active)
        if problem is not None:
            return web.Response(status=503, text=f"not ready: {problem}\n")
        return web.Response(text="ready\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()  # probes come from the kubelet
    log.info("health on :%d, metrics ready", port)
    return runner
