"""An informer's store: one kind's objects as index entries, read from evaluation threads
while the informers change it.

Each object is kept as its projections (``indexes.py``), under the keys its entries name;
the object's own keys are remembered, so a new version of it drops the keys the old one
had (a pod no longer carries a label it lost). A scope's list replaces that scope's
objects at once: a reader sees all of the old or all of the new. One lock covers every
read and change (``indexes.py`` explains the copies).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from cachescale.controller.kube.indexes import Entries, ObjectKey, Projection


class Store(Mapping[Any, Collection[Projection]]):
    """One kind's objects as index entries: key → the projections under it (an ``Index``).

    Each object's keys are kept, so a new version of it drops the keys the old one had.
    ``scopes`` are the namespaces (None: the cluster) its informers list; it is
    :attr:`synced` once each has been listed."""

    def __init__(self, scopes: Iterable[str | None]) -> None:
        self._lock = threading.Lock()
        self._index: dict[Any, dict[ObjectKey, Projection]] = {}
        self._keys: dict[ObjectKey, tuple[Any, ...]] = {}
        self._unlisted = set(scopes)

    @property
    def synced(self) -> bool:
        """Whether every scope has been listed once."""
        with self._lock:
            return not self._unlisted

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
            return len(self._keys)

    def put(self, key: ObjectKey, entries: Entries) -> None:
        """The object ``key`` is now ``entries``, whatever it was before."""
        with self._lock:
            self._unlink(key)
            self._link(key, entries)

    def remove(self, key: ObjectKey) -> None:
        """The object ``key`` is gone."""
        with self._lock:
            self._unlink(key)

    def replace(self, scope: str | None, objects: Mapping[ObjectKey, Entries]) -> None:
        """Every object of ``scope`` (a namespace; None: all) replaced by ``objects`` at
        once: a reader sees all of the old or all of the new. The scope is then listed."""
        with self._lock:
            for key in [k for k in self._keys if scope is None or k[0] == scope]:
                self._unlink(key)
            for key, entries in objects.items():
                self._link(key, entries)
            self._unlisted.discard(scope)

    def _link(self, key: ObjectKey, entries: Entries) -> None:
        for index_key, projection in entries.items():
            self._index.setdefault(index_key, {})[key] = projection
        self._keys[key] = tuple(entries)

    def _unlink(self, key: ObjectKey) -> None:
        for index_key in self._keys.pop(key, ()):
            holders = self._index[index_key]
            del holders[key]
            if not holders:
                del self._index[index_key]
