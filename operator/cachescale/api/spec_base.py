"""What every model of ``CacheScalingPolicy.spec`` shares: strictness, names, sizes.

``SpecModel`` is the API server's strictness in pydantic (no coercion between strings,
numbers and booleans; no Inf or NaN; ``null`` counts as left out). The patterns and the
``MAX_*`` limits bound every string, list, map and number a policy author writes, and
each appears twice on purpose: checked by pydantic and published in the CRD (``pattern``,
``maxLength``, ``maximum`` or a CEL rule), so ``cachescale validate`` and the API server
refuse the same policies. ``Duration`` is a duration string checked both ways too.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from cachescale.api.base import ApiModel
from cachescale.api.durations import DURATION_PATTERN, parse_duration_seconds

# Kubernetes object names (DNS-1123 subdomain for Deployments/HPAs, label for containers).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Prometheus label names; values are escaped by the gather layer, never interpolated raw.
PROMETHEUS_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
PROMETHEUS_LABEL_NAME_RE = re.compile(PROMETHEUS_LABEL_NAME)
# A Prometheus base URL as the HTTP client will connect to it: http(s), an authority of
# host (name, IPv4 or [IPv6]) and port only, then an optional path. No userinfo (``@``),
# query, fragment, backslash, percent-escape, whitespace, control or
# non-ASCII character: each is a place where two URL parsers disagree on the host.
# The operator checks the URL again as urllib3 parses it
# (``gather/egress.py``); this pattern is the API server's first gate.
PROMETHEUS_URL_PATTERN = r"^https?://[-A-Za-z0-9._:\[\]]+(/[-A-Za-z0-9._~/]*)?$"

# Size limits (docs/security.md, "Size limits"): every string, list and map a policy
# author writes is bounded, so the largest admissible spec stays small (see
# tests/api/test_size_limits.py) and so do kopf's annotations and the status quoting it.
MAX_NAME = 253
"""Kubernetes object names (DNS-1123 subdomains)."""
MAX_LABEL = 63
"""DNS-1123 labels (namespaces, container names)."""
MAX_SELECTOR_LABELS = 16
"""Label matchers in ``spec.metrics.selector``."""
MAX_SELECTOR_KEY = 63
"""A selector key (a Prometheus label name)."""
MAX_SELECTOR_VALUE = 253
"""A selector value: room for any Kubernetes object name or a model's path."""
MAX_URL = 2048
"""``spec.metrics.prometheusUrl``."""
MAX_DEMAND_QUERY = 2048
"""``spec.metrics.demandQuery``: a PromQL expression, not a program."""
MAX_LABEL_SELECTOR = 256
"""A prompt source's Kubernetes label selector."""

MIN_WINDOW_SECONDS = 60.0
"""Rates over less than a minute are dominated by scrape jitter."""
MIN_INTERVAL_SECONDS = 10.0
"""Evaluating faster than Prometheus scrapes only re-reads the same samples."""
MAX_WINDOW = "24h"
"""A rate over more than a day no longer describes the present, and costs Prometheus."""
MAX_EVALUATIONS_PER_WINDOW = 360
"""At most this many evaluations in one window: the status keeps a mark per evaluation of
the last window (``LearnedState.recent_replicas``), so the ratio bounds the status's size."""
TOO_MANY_EVALUATIONS = (
    f"window must be at most {MAX_EVALUATIONS_PER_WINDOW} intervals (the status keeps a mark "
    "per evaluation of the window): lengthen the interval or shorten the window"
)
"""Why a window of more than ``MAX_EVALUATIONS_PER_WINDOW`` intervals is refused."""
MAX_COOLDOWN = "168h"
"""A week: past that, the ceiling is effectively never changed; turn management off instead."""
MAX_GIB = 16_384.0
"""Upper bound for a replica's GiB figures (16 TiB: far above any node today)."""
MAX_GPU_SECONDS_PER_1K = 10_000_000.0
"""Upper bound for the budget: 10,000 GPU-seconds per request."""
MAX_REPLICAS = 10_000
"""Upper bound for the budget's replica range."""


def _check_duration(text: str) -> str:
    parse_duration_seconds(text)
    return text


# The pattern is checked by the validator (with a message that shows the right form) and
# published in the schema for the API server.
Duration = Annotated[
    str,
    AfterValidator(_check_duration),
    Field(json_schema_extra={"pattern": DURATION_PATTERN, "minLength": 2, "maxLength": 32}),
]
"""A duration string such as ``30s``, ``5m`` or ``1h30m``."""


def cel_or_default(field: str, default: str | int | float | bool) -> str:
    """CEL for ``self.<field>`` or, when the policy leaves it out, ``default``.

    The CRD stores no defaults (what a policy leaves out stays out, so ``kubectl describe``
    shows what its author wrote; pydantic fills the defaults in when the operator reads
    it), so a rule must not read a field that may be absent: this is how it reads one.
    ``field`` may be a path (``gpu.gpuMemoryUtilization``) whose parents are present."""
    if isinstance(default, bool):
        literal = "true" if default else "false"
    elif isinstance(default, str):
        literal = f"'{default}'"  # durations and names: no quote to escape
    else:
        literal = repr(default)
    return f"(has(self.{field}) ? self.{field} : {literal})"


class SpecModel(ApiModel):
    """An ``ApiModel`` with the API server's strictness: no string-to-number or
    number-to-bool coercion, no Inf or NaN. Enum fields opt back out (``strict=False``)
    so that their wire strings, ``Enforce`` or ``vllm``, are accepted."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data: Any) -> Any:
        """``field: null`` counts as not written, as in the API server, which prunes the
        nulls of fields not marked nullable (none is) before applying defaults."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data
