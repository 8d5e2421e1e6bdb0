"""The base model every CacheScalingPolicy type derives from.

Kubernetes APIs are camelCase on the wire; Python is snake_case. One base class sets that
convention, forbids unknown fields (a typo in a policy must be an error, not a silently
ignored key) and freezes instances (a policy or a snapshot is a value, never mutated in
place by the code that reads it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Unit words keep their conventional spelling inside camelCase names.
_UNIT_SPELLING = {"gib": "GiB"}


def to_wire_name(python_name: str) -> str:
    """Python name → wire name: ``gpu_seconds_per_1k_requests`` → ``gpuSecondsPer1kRequests``,
    ``memory_gib`` → ``memoryGiB``."""
    first, *rest = python_name.split("_")
    return first + "".join(_UNIT_SPELLING.get(word, word[:1].upper() + word[1:]) for word in rest)


class ApiModel(BaseModel):
    """Frozen, camelCase-on-the-wire, unknown-fields-forbidden pydantic model."""

    model_config = ConfigDict(
        alias_generator=to_wire_name,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict[str, object]:
        """Serialise as the API server stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
