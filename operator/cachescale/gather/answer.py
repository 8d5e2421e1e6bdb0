"""An instant-vector answer as decoded, and a combined query's answer split back by tag.

An answer is decoded and checked in one pass (``msgspec``, into ``Answer``): a group's
answer holds tens of thousands of series, and building every JSON object as a dict to
check it afterwards was the largest share of an evaluation's CPU. Each sample becomes a
``Series`` (its labels, this answer's own parse, and its value as a float: NaN and ±Inf
allowed), and a combined query's series are handed back to their queries by tag
(``by_tag``); what an answer that breaks either rule is, ``gather.prometheus`` says.

Pure: decoded structures in, series out.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import msgspec

from cachescale.gather.selector import QUERY_TAG_LABEL

_K = TypeVar("_K", bound=Hashable)
_new = tuple.__new__
"""Makes a ``Series`` without the Python-level ``__new__`` of a named tuple."""


class Series(NamedTuple):
    """One element of an instant vector: its labels and its value (possibly NaN/±Inf).
    A named tuple: a group's answer holds thousands, each made once (``query_many`` takes
    its query tag out of the labels in place)."""

    labels: Mapping[str, str]
    value: float


class Value(msgspec.Struct, array_like=True, gc=False):
    """A sample's ``[time, "text"]``: the text may be ``NaN``, ``+Inf`` or ``-Inf``,
    which JSON numbers cannot be."""

    at: float
    text: str


class Sample(msgspec.Struct, gc=False):
    """An instant-vector element as Prometheus sends it. Neither struct is tracked by the
    garbage collector (``gc=False``): they hold strings and numbers only, so they cannot
    form a cycle, and the tens of thousands a group's answer makes at once would
    otherwise be promoted through its generations while it is decoded (``gc_pace.py``)."""

    metric: dict[str, str]
    value: Value


class Data(msgspec.Struct):
    """An answer's ``data``: its ``result`` (``resultType`` is not read)."""

    result: list[Sample]


class Answer(msgspec.Struct):
    """What is read of an answer (other fields are ignored)."""

    data: Data


def series_of(result: list[Sample]) -> list[Series]:
    """Each sample's labels (not copied: they are this answer's own parse) and value;
    ``ValueError`` at a value that is no number (NaN and ±Inf are numbers)."""
    return [_new(Series, (sample.metric, float(sample.value.text))) for sample in result]


def by_tag(vector: list[Series], keys: Sequence[_K]) -> dict[_K, list[Series]] | None:
    """A combined query's series under the key of their query tag, the tag taken out of
    their labels in place (``series_of``'s own dicts); None at a series without a valid
    tag: ``str`` of a position in ``keys``, or any decimal number below their count."""
    results: dict[_K, list[Series]] = {key: [] for key in keys}
    slots = {str(position): results[key] for position, key in enumerate(keys)}
    for series in vector:
        labels = series.labels
        assert isinstance(labels, dict)  # this answer's own parse: no copy
        tag = labels.pop(QUERY_TAG_LABEL, "")
        slot = slots.get(tag)
        if slot is None:
            if not tag.isdecimal() or int(tag) >= len(keys):
                return None
            slot = results[keys[int(tag)]]  # a position written otherwise, e.g. "01"
        slot.append(series)
    return results
