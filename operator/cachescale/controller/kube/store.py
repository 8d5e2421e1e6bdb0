"""An informer's store: one kind's objects as index entries, read from evaluation threads
while the informers change it.

Each object is kept as its projections (``indexes.py``), under the keys its entries name;
the object's own keys are remembered, so a new version of it drops the keys the old one
had (a pod no longer carries a label it lost). Its informers write it through their
:class:`Scope`, one per namespace (or the cluster): a scope's list replaces that scope's
objects at once, and closing a scope drops them at once, so a reader sees all of the old
or all of the new. A scope closed (or opened again since) writes nothing more: the thread
of a stopped informer may still be finishing a list or a watch event. Reads are served
per namespace: :meth:`Store.listed` says whether a namespace's objects are all here. One
lock covers every read and change (``indexes.py`` explains the copies).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from cachescale.controller.kube.indexes import Entries, ObjectKey, Projection


class Scope:
    """An informer's share of a store: the objects of one namespace, or of the cluster
    (None), written only while it is the store's scope for that namespace."""

    __slots__ = ("listed", "namespace")

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self.listed = False
        """Whether its objects have been listed into the store (set under the store's lock)."""


class Store(Mapping[Any, Collection[Projection]]):
    """One kind's objects as index entries: key → the projections under it (an ``Index``).

    Each object's keys are kept, so a new version of it drops the keys the old one had.
    Its scopes (:meth:`open`) are the namespaces (None: the cluster) its informers list."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index: dict[Any, dict[ObjectKey, Projection]] = {}
        self._keys: dict[str, dict[ObjectKey, tuple[Any, ...]]] = {}
        """Per namespace, each object's index keys: a namespace's objects go without a scan."""
        self._scopes: dict[str | None, Scope] = {}

    def open(self, namespace: str | None) -> Scope:
        """A scope for ``namespace`` (None: the cluster), not listed yet; one open before
        for it writes nothing more (its objects stay until the new one lists)."""
        scope = Scope(namespace)
        with self._lock:
            self._scopes[namespace] = scope
        return scope

    def close(self, scope: Scope) -> None:
        """``scope`` ends: its objects go at once (a reader sees all of them or none), and
        it writes nothing more."""
        with self._lock:
            if self._scopes.get(scope.namespace) is scope:
                del self._scopes[scope.namespace]
                self._drop(scope.namespace)

    def listed(self, namespace: str) -> bool:
        """Whether every object of ``namespace`` is here: its scope, or the cluster's, has
        listed (until then an absent object may only not be listed yet)."""
        with self._lock:
            return any(
                scope is not None and scope.listed
                for scope in (self._scopes.get(namespace), self._scopes.get(None))
            )

    def __getitem__(self, key: Any) -> tuple[Projection, ...]:
        with self._lock:
            return tuple(self._index[key].values())

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            return iter(list(self._index))

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def objects(self) -> int:
        """How many objects it holds."""
        with self._lock:
            return sum(len(held) for held in self._keys.values())

    def put(self, scope: Scope, key: ObjectKey, entries: Entries) -> None:
        """The object ``key`` is now ``entries``, whatever it was before."""
        with self._lock:
            if self._scopes.get(scope.namespace) is scope:
                self._unlink(key)
                self._link(key, entries)

    def remove(self, scope: Scope, key: ObjectKey) -> None:
        """The object ``key`` is gone."""
        with self._lock:
            if self._scopes.get(scope.namespace) is scope:
                self._unlink(key)

    def replace(self, scope: Scope, objects: Mapping[ObjectKey, Entries]) -> None:
        """Every object of ``scope`` replaced by ``objects`` at once: a reader sees all of
        the old or all of the new. The scope is then listed."""
        with self._lock:
            if self._scopes.get(scope.namespace) is not scope:
                return
            self._drop(scope.namespace)
            for key, entries in objects.items():
                self._link(key, entries)
            scope.listed = True

    def _drop(self, namespace: str | None) -> None:
        """Every object of ``namespace`` (None: all) unlinked; the lock is held."""
        if namespace is None:
            self._index.clear()
            self._keys.clear()
            return
        for key, index_keys in self._keys.pop(namespace, {}).items():
            self._unindex(key, index_keys)

    def _link(self, key: ObjectKey, entries: Entries) -> None:
        for index_key, projection in entries.items():
            self._index.setdefault(index_key, {})[key] = projection
        self._keys.setdefault(key[0], {})[key] = tuple(entries)

    def _unlink(self, key: ObjectKey) -> None:
        held = self._keys.get(key[0])
        if held is None or key not in held:
            return
        self._unindex(key, held.pop(key))
        if not held:
            del self._keys[key[0]]

    def _unindex(self, key: ObjectKey, index_keys: tuple[Any, ...]) -> None:
        for index_key in index_keys:
            holders = self._index[index_key]
            del holders[key]
            if not holders:
                del self._index[index_key]
