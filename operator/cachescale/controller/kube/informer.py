"""Informers: the targets' Deployments, HPAs, pods and ScaledObjects listed and watched
into the stores (``store.py``) that ``controller/kube/indexes.py`` serves evaluations from.

Why not kopf: kopf runs its whole per-object machinery (a worker, its raw event held until
every index is filled, the handler chain) for each object it watches, and the targets of
a large fleet are several objects per policy, so that machinery, not the projections,
would be the operator's peak memory (the evidence: ``docs/design/operator-scale.md``). An
informer here keeps only each object's projection (``indexes.py``) and drops the object it
came in at once. kopf still serves the policies: their watch, finalizers and peering.

One :class:`Informer` per kind and scope (the cluster, or a namespace: each is an exact
name, as ``--namespace`` takes only a DNS label, never one of kopf's glob patterns) runs
in a thread of its own, as client-go's reflector does: it lists the scope page by page
(``limit``, ``continue``), replaces the scope's objects in its :class:`Store` at once,
then watches from the list's resourceVersion (``allowWatchBookmarks``, a server
``timeoutSeconds``) and applies each event: ADDED and MODIFIED put the object's entries
(those of an older version go, so a pod no longer carries a label it lost), DELETED
removes them, BOOKMARK only moves the resourceVersion on. A watch the server ends is
opened again from the last resourceVersion; 410 Gone (an answer or an ERROR event) lists
again; any other failure waits (exponential, at most :data:`MAX_BACKOFF_S`, jittered)
and watches again, or lists again if it had never listed.

Which informers run, in which scopes, and how evaluations are served from them:
``target_informers.py``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from cachescale.controller.kube.client import (
    GoneError,
    KubeError,
    NotFoundError,
    status_error,
)
from cachescale.controller.kube.indexes import (
    Entries,
    IndexName,
    ObjectKey,
    deployment_entries,
    hpa_entries,
    object_key,
    pod_entries,
    scaled_object_entries,
)
from cachescale.controller.kube.store import Store

PAGE: Final = 500
"""Objects per list page (client-go's): a page is parsed, projected and dropped before the
next is asked for."""
WATCH_TIMEOUT_S: Final = 300
"""The server ends a watch after this (``timeoutSeconds``); it is opened again at once."""
IDLE_MARGIN_S: Final = 30.0
"""A watch that has sent nothing for this long past its timeout is a dead connection."""
FIRST_BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 60.0
"""The wait after a failure doubles from the first to this, each drawn in its upper half."""

log = logging.getLogger("cachescale.operator")


# -- what is watched -------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A watched kind: where its collections are, and what its store keeps of an object."""

    prefix: str
    """``/api/v1`` or ``/apis/GROUP/VERSION``."""
    plural: str
    entries: Callable[[Mapping[str, Any]], Entries]
    index: IndexName
    """The index its store is (``indexes.TargetIndexes``)."""

    def path(self, namespace: str | None) -> str:
        """The collection of one namespace, or of the cluster (None)."""
        if namespace is None:
            return f"{self.prefix}/{self.plural}"
        return f"{self.prefix}/namespaces/{namespace}/{self.plural}"


DEPLOYMENTS: Final = Kind("/apis/apps/v1", "deployments", deployment_entries, "deployments")
HPAS: Final = Kind("/apis/autoscaling/v2", "horizontalpodautoscalers", hpa_entries, "hpas")
PODS: Final = Kind("/api/v1", "pods", pod_entries, "pods")
SCALED_OBJECTS: Final = Kind(
    "/apis/keda.sh/v1alpha1", "scaledobjects", scaled_object_entries, "scaled_objects"
)


def target_kinds(keda: bool) -> tuple[Kind, ...]:
    """The kinds a target is read from; ScaledObjects only with ``--keda``."""
    return (DEPLOYMENTS, HPAS, PODS, SCALED_OBJECTS) if keda else (DEPLOYMENTS, HPAS, PODS)


# -- one informer ------------------------------------------------------------------------------


class Events(Protocol):
    """An open watch (``client.WatchStream``)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The events as they arrive, until the server ends the watch."""
        ...

    def close(self) -> None:
        """End it from another thread."""
        ...


class ListWatch(Protocol):
    """The two requests an informer sends (``client.KubeApi``)."""

    def list_page(self, path: str, query: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """One page of a collection."""
        ...

    def watch(self, path: str, query: Sequence[tuple[str, str]], idle_timeout_s: float) -> Events:
        """A watch of a collection."""
        ...


def backoff_s(failures: int, draw: Callable[[], float] = random.random) -> float:
    """The wait after ``failures`` failures in a row: doubling from
    :data:`FIRST_BACKOFF_S`, at most :data:`MAX_BACKOFF_S`, drawn in the upper half so
    that informers failing together do not retry together."""
    ceiling = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** min(failures - 1, 16))
    return ceiling * (0.5 + 0.5 * draw())


class Informer:
    """One kind in one scope (a namespace, or the cluster: None), listed into its store
    and followed by a watch, in a thread of its own (module docstring)."""

    def __init__(
        self,
        api: ListWatch,
        kind: Kind,
        namespace: str | None,
        store: Store,
        *,
        page: int = PAGE,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        backoff: Callable[[int], float] = backoff_s,
        announce: bool = True,
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.store = store
        self.scope = store.open(namespace)
        """What it writes in the store: nothing more once it is stopped."""
        self.tried = threading.Event()
        """Set once its first list has succeeded or failed."""
        self.version: str | None = None
        """The resourceVersion it watches from; None: it must list first."""
        self._api = api
        self._page = page
        self._watch_timeout_s = watch_timeout_s
        self._backoff = backoff
        self._announce = announce
        """Whether its first list is logged (at info); a namespace started on demand is
        logged once for all its kinds (``target_informers.TargetInformers.open``)."""
        self._stopping = threading.Event()
        self._stream: Events | None = None
        self._failures = 0
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """E.g. ``pods in team-a``, ``pods cluster-wide``."""
        where = f"in {self.namespace}" if self.namespace is not None else "cluster-wide"
        return f"{self.kind.plural} {where}"

    def start(self) -> None:
        """Run in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self.run, name=f"informer {self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop, without waiting (it may run on the event loop): its objects leave the store
        at once and it writes nothing more; the open watch is closed, and the thread ends
        once a request under way has (:meth:`join`)."""
        self.store.close(self.scope)
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait, at most ``timeout_s``, for the thread of a stopped informer to end."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        """List, then watch, until stopped (the module docstring's loop)."""
        while not self._stopping.is_set():
            self.step()

    def step(self) -> None:
        """One list (if none is in force) and one watch, or the wait after a failure."""
        listing = self.version is None
        try:
            if listing:
                self.version = self.relist()
                listing = False
                self.tried.set()
            self.follow()
            self._failures = 0
        except GoneError as error:
            self.version = None
            if listing:  # a list's continue token expired: not at once again
                self._failed(error, listing)
            else:
                log.info("%s: watch expired (%s); listing again", self.name, error)
        except (KubeError, ValueError) as error:
            self._failed(error, listing)
        except Exception as error:  # a bug must not end the thread: stores would go stale
            log.exception("%s: unexpected failure", self.name)
            self._failed(error, listing)
        finally:
            self.tried.set()

    def relist(self) -> str:
        """List the scope page by page into the store at once; the list's resourceVersion."""
        objects: dict[ObjectKey, Entries] = {}
        query = [("limit", str(self._page))]
        while True:
            page = self._api.list_page(self.kind.path(self.namespace), query)
            for item in page.get("items") or ():
                objects[object_key(item)] = self.kind.entries(item)
            meta = page.get("metadata") or {}
            if not meta.get("continue") or self._stopping.is_set():
                break
            query = [("limit", str(self._page)), ("continue", str(meta["continue"]))]
        told = self._failures > 0 or (self._announce and not self.scope.listed)
        self.store.replace(self.scope, objects)
        self._failures = 0
        (log.info if told else log.debug)("%s: listed %d", self.name, len(objects))
        return str(meta.get("resourceVersion") or "")

    def follow(self) -> None:
        """One watch from :attr:`version`, applied to the store until the server ends it."""
        query = [
            ("resourceVersion", self.version or ""),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self._watch_timeout_s)),
        ]
        idle = self._watch_timeout_s + IDLE_MARGIN_S
        if self._stopping.is_set():  # stopped while it was listing
            return
        stream = self._api.watch(self.kind.path(self.namespace), query, idle)
        self._stream = stream
        try:
            if self._stopping.is_set():  # stopped while it was being opened
                return
            for event in stream:
                self.apply(event)
        finally:
            self._stream = None

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event into the store; an ERROR event is raised as the error it is."""
        kind, body = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise _status_error(body)
        if kind in ("ADDED", "MODIFIED"):
            self.store.put(self.scope, object_key(body), self.kind.entries(body))
        elif kind == "DELETED":
            self.store.remove(self.scope, object_key(body))
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version:
            self.version = str(version)

    def _failed(self, error: Exception, listing: bool) -> None:
        self._failures += 1
        wait = self._backoff(self._failures)
        if listing:
            what = f"list failed ({error})"
            if isinstance(error, NotFoundError):
                what = f"not served by the API server ({error})"
            if not self.scope.listed:
                what += f"; until it lists, {self.kind.plural} are read from the API server"
        else:
            what = f"watch from resourceVersion {self.version} failed ({error})"
        # The first failure in a row is told; the retries that follow it, only in debug.
        (log.warning if self._failures == 1 else log.debug)(
            "%s: %s; again in %.1f s", self.name, what, wait
        )
        self._stopping.wait(wait)


def _status_error(status: Mapping[str, Any]) -> KubeError:
    """The error an ERROR event carries (a ``Status``): 410 is :class:`GoneError`."""
    code = int(status.get("code") or 500)
    message = str(status.get("message") or status.get("reason") or f"HTTP {code}")
    return status_error(code, message)
