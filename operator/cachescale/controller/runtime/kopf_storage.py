"""kopf's diff base, not kept: kopf writes nothing to a policy but its finalizer and, during
a deletion, the delete handler's progress.

kopf's "diff base" is the last essence (spec, labels, annotations) it handled; by default
it stores it in an annotation (``cachescale.dev/last-handled-configuration``, beside a
``cachescale.dev/kopf-managed`` marker) and compares each event's policy with it to tell
``on.create``/``on.update``/``on.resume`` handlers what changed.

The rule: no diff base is kept. :class:`NoDiffBaseStorage` answers every policy's current
essence as the one last handled, so kopf sees no change (a no-op: no handling cycle; once
per policy at start-up, a resume with no handler to run), and writes nothing when kopf asks
it to store one.

Why that is safe: nothing reads the diff base. The operator registers no create, update or
resume handler, and no handler asks for extra fields (``field=``), which kopf would add to
the essence it compares (``tests/controller/runtime/test_kopf_storage.py`` checks the
registry). kopf runs ``on.delete`` from ``deletionTimestamp`` and the finalizer alone,
before it looks at the diff base, and adds the finalizer whenever a delete handler matches
the policy, whatever the cause.

A policy written by an older version keeps its diff base, unread, until removed (with
``cachescale.dev/kopf-managed-`` too, for the marker)::

    kubectl annotate csp NAME cachescale.dev/last-handled-configuration-

The operator does not remove it: the annotation is inert, and removing it would cost a
PATCH per policy for three lines of ``kubectl describe``.

The delete handler's progress is an annotation (``AnnotationsProgressStorage``, which also
writes the marker): a policy whose annotations leave no room for it is not retried
(:func:`annotation_headroom`, ``handlers.restore_on_delete``), so its finalizer always
comes off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import kopf

ANNOTATIONS_LIMIT: Final = 256 * 1024
"""The API server's limit on an object's annotations: keys and values, in bytes."""


def annotation_headroom(body: Mapping[str, Any]) -> int:
    """Bytes the policy's annotations may still grow by before the API server refuses
    the object (negative when they already exceed the limit)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return ANNOTATIONS_LIMIT - sum(
        len(key.encode()) + len(str(value).encode())
        for key, value in annotations.items()
        if value is not None
    )


class NoDiffBaseStorage(kopf.DiffBaseStorage):
    """kopf's diff base, never kept: every policy is as last handled (module docstring)."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence:
        """The policy's current essence, as kopf builds it: nothing changed."""
        return self.build(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing: no annotation, no marker."""
