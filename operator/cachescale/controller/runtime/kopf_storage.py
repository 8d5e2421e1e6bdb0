"""kopf's bookkeeping annotations, bounded: a policy's size can never hold its finalizer.

kopf stores the last spec it handled (its "diff base", ``cachescale.dev/
last-handled-configuration``) as an annotation on the policy, and writes it in the same
PATCH that removes the finalizer once the delete handler is done. The API server refuses
an object whose annotations total more than ``ANNOTATIONS_LIMIT``, so a spec that does not
fit (a large policy admitted before the CRD bounded its fields, or one whose author filled
its own annotations) would make that PATCH fail at every attempt: the finalizer would
never come off and the policy would stay Terminating.

The rule: the diff base is written only when the policy's annotations, with it, stay under
``ANNOTATION_BUDGET`` (the API server's limit less room for kopf's progress records);
otherwise it is left out, and an older one is removed. Nothing depends on it: kopf's diff
base tells ``on.create``/``on.update``/``on.resume`` handlers what changed, and this
operator registers none (``tests/controller/runtime/test_kopf_storage.py`` checks the
registry), only ``on.delete``, which kopf runs from ``deletionTimestamp`` and the finalizer
alone. A policy without a diff base is "not handled yet" to kopf, which then has no handler
to run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

log = logging.getLogger("cachescale.operator")

ANNOTATIONS_LIMIT: Final = 256 * 1024
"""The API server's limit on an object's annotations: keys and values, in bytes."""
PROGRESS_ROOM: Final = 16 * 1024
"""Kept free for kopf's progress records (a few hundred bytes per handler)."""
ANNOTATION_BUDGET: Final = ANNOTATIONS_LIMIT - PROGRESS_ROOM
"""What the policy's annotations may total once the diff base is written."""


def annotations_bytes(annotations: Mapping[str, Any], leaving_out: frozenset[str]) -> int:
    """Bytes the API server counts for ``annotations`` (keys and values, UTF-8), those in
    ``leaving_out`` left out."""
    return sum(
        len(key.encode()) + len(str(value).encode())
        for key, value in annotations.items()
        if key not in leaving_out and value is not None
    )


def annotation_headroom(body: Mapping[str, Any]) -> int:
    """Bytes the policy's annotations may still grow by before the API server refuses
    the object (negative when they already exceed the limit)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return ANNOTATIONS_LIMIT - annotations_bytes(annotations, frozenset())


class BoundedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base, written only when it fits (module docstring)."""

    def store(
        self,
        *,
        body: kopf.Body,
        patch: kopf.Patch,
        essence: kopf.BodyEssence,
    ) -> None:
        """Write ``essence`` as kopf would, unless the annotations would then exceed
        ``ANNOTATION_BUDGET``: then write nothing, and remove a diff base stored before."""
        keys = frozenset(self.make_keys(self.key, body=body))
        encoded = json.dumps(essence, separators=(",", ":")) + "\n"
        pending = {
            key: value for key, value in patch.metadata.annotations.items() if key not in keys
        }
        others = {**dict(body.metadata.annotations), **pending}
        total = annotations_bytes(others, keys) + sum(
            len(key.encode()) + len(encoded.encode()) for key in keys
        )
        if total <= ANNOTATION_BUDGET:
            super().store(body=body, patch=patch, essence=essence)
            return
        log.debug(
            "%s/%s: kopf's diff base not stored (%d bytes of annotations with it)",
            body.metadata.namespace,
            body.metadata.name,
            total,
        )
        for key in keys & frozenset(body.metadata.annotations):
            patch.metadata.annotations[key] = None
