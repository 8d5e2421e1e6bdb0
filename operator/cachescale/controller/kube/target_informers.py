"""Every target kind's informers (``informer.py``) in the operator's scopes, and the
indexes evaluations read from them.

The scopes are those kopf serves the policies in, fixed at start: the cluster, or each
``--namespace``. A cluster-wide shard (``--policy-selector`` without ``--namespace``)
instead follows only the namespaces its own policies are in, on demand
(:class:`TargetInformers` ``on_demand``): a namespace's informers, one per kind, start
when the first of the shard's policies there joins (``controller/runtime/members.py``)
and stop when the last one leaves, their objects dropped from the stores at once. Shards
that split the policies by namespace so each list and watch only their own namespaces'
targets; a shard with policies in every namespace watches every namespace, one watch per
kind and namespace. A namespace's start and stop are each logged once.

At start-up (:func:`start_informers`, a kopf startup handler: kopf opens no watch before
every startup handler returned, so no policy handler runs before it) every informer of
the fixed scopes lists once before the operator serves anything: the stores are full
before the first evaluation. An on-demand namespace is started on kopf's event loop
without waiting for its lists. Reads are served per kind and namespace
(:meth:`TargetInformers.index`): until a kind has been listed in a namespace (just
started, or it could not be listed: RBAC, the API server down, KEDA's CRD not installed
with ``--keda``: a 404, logged while its informer keeps trying in the background),
evaluations read that kind there from the API server, as they would without an index,
and every other namespace is still served from the stores.

"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import kopf
from kubernetes.client import ApiClient

from cachescale.controller.kube.client import KubeApi, with_connections
from cachescale.controller.kube.indexes import Index, IndexedReads, IndexName
from cachescale.controller.kube.informer import Informer, ListWatch, target_kinds
from cachescale.controller.kube.store import Store

log = logging.getLogger("cachescale.operator")


class TargetInformers:
    """The informers of every target kind in the operator's scope, and their stores:
    what :class:`IndexedReads` serves from (``indexes.TargetIndexes``), offering a kind's
    store for a namespace once that namespace (or the cluster) is listed.

    The fixed scopes (``namespaces``, none: the cluster) start with the operator
    (:meth:`start`), all on an API from one ``connect()``. ``on_demand`` (a cluster-wide
    shard, ``namespaces`` empty) none does: :meth:`open` starts a namespace's informers,
    on an API of their own from ``connect()``, and :meth:`close` stops them."""

    def __init__(
        self,
        connect: Callable[[], ListWatch],
        namespaces: Sequence[str],
        keda: bool,
        on_demand: bool = False,
    ) -> None:
        self.on_demand = on_demand
        self._connect = connect
        self._kinds = target_kinds(keda)
        self._stores = {kind.index: Store() for kind in self._kinds}
        self._lock = threading.Lock()
        """Guards the scopes: opened and closed on kopf's loop, stopped from a thread."""
        self._scopes: dict[str | None, list[Informer]] = {}
        self._stopped = False
        if not on_demand:
            api = connect()
            scopes: list[str | None] = list(namespaces) or [None]
            for scope in scopes:
                self._scopes[scope] = self._informers(api, scope, announce=True)

    @property
    def informers(self) -> list[Informer]:
        """The informers of every scope followed now."""
        with self._lock:
            return [informer for group in self._scopes.values() for informer in group]

    def start(self) -> None:
        """Start the fixed scopes' informers and return once each has listed once, or
        failed to (on demand: none, nothing to wait for)."""
        if self.on_demand:
            return
        informers = self.informers
        for informer in informers:
            informer.start()
        for informer in informers:
            informer.tried.wait()

    def open(self, namespace: str) -> None:
        """On demand: follow the targets of ``namespace``, one informer per kind in threads
        of their own; returns at once (on kopf's loop), and until a kind has listed there
        its reads there go to the API server."""
        with self._lock:
            if self._stopped or namespace in self._scopes:
                return
            informers = self._informers(self._connect(), namespace, announce=False)
            self._scopes[namespace] = informers
        for informer in informers:
            informer.start()
        log.info("%s: following its targets (the first policy there joined)", namespace)

    def close(self, namespace: str) -> None:
        """On demand: stop following ``namespace``: its objects leave the stores at once,
        and its informers' threads end on their own (not waited for: this runs on kopf's
        loop)."""
        with self._lock:
            informers = self._scopes.pop(namespace, None)
        if informers is None:
            return
        for informer in informers:
            informer.stop()
        log.info("%s: no longer following its targets (the last policy there left)", namespace)

    def stop(self) -> None:
        """Stop every informer, and wait for their threads (a few seconds at most each)."""
        with self._lock:
            self._stopped = True
        informers = self.informers
        for informer in informers:
            informer.stop()
        for informer in informers:
            informer.join()

    def index(self, kind: IndexName, namespace: str) -> Index | None:
        """The store of ``kind`` once it has listed ``namespace`` (``TargetIndexes``)."""
        store = self._stores.get(kind)
        return store if store is not None and store.listed(namespace) else None

    def _informers(self, api: ListWatch, scope: str | None, announce: bool) -> list[Informer]:
        return [
            Informer(api, kind, scope, self._stores[kind.index], announce=announce)
            for kind in self._kinds
        ]


def target_informers(
    api_client: ApiClient,
    namespaces: Sequence[str],
    keda: bool,
    on_demand: bool = False,
    on_request: Callable[[str], None] | None = None,
) -> TargetInformers:
    """The operator's informers: in each of ``namespaces`` (none: cluster-wide, as kopf
    serves the policies), or ``on_demand`` in each namespace its policies are in.

    A watch holds its connection for minutes, so the informers get connections of their
    own, never the evaluation threads', one per watch: the fixed scopes share one client
    of kinds × scopes connections. On demand, each namespace's informers get a client of
    their own with one connection per kind: how many namespaces there will be is not known
    when a pool is made (urllib3 fixes its size then, and a pool too small closes every
    connection a watch gives back, with a warning each time), and a namespace's
    connections then close with its informers, once they are stopped and dropped."""
    kinds = len(target_kinds(keda))

    def connect(connections: int) -> KubeApi:
        return KubeApi(with_connections(api_client, connections), on_request=on_request)

    if on_demand:
        return TargetInformers(lambda: connect(kinds), (), keda, on_demand=True)
    api = connect(kinds * max(1, len(namespaces)))
    return TargetInformers(lambda: api, namespaces, keda)


# -- the kopf side -------------------------------------------------------------------------------


@kopf.on.startup(id="target_informers")
async def start_informers(memo: Any, **_: Any) -> None:
    """List every target kind of the fixed scopes (in worker threads: the event loop still
    answers the probes; on demand there is none yet), start following them, and serve the
    evaluations' reads from the stores. ``memo.informers`` is set by
    ``controller/runtime/serve.py``."""
    informers: TargetInformers | None = getattr(memo, "informers", None)
    if informers is None:
        return
    await asyncio.to_thread(informers.start)
    operator = memo.runtime.operator
    operator.indexed_reads = IndexedReads(operator.api, informers)


@kopf.on.cleanup(id="target_informers")
async def stop_informers(memo: Any, **_: Any) -> None:
    """Stop following the targets (their watches are closed)."""
    informers: TargetInformers | None = getattr(memo, "informers", None)
    if informers is not None:
        await asyncio.to_thread(informers.stop)
