"""``cachescale report --around policy/NAME``: where a policy's last collapse was, and
where its metrics live, read from the policy object.

Pure: the CacheScalingPolicy as the API server returned it in, the moment to centre on
and the report's sources out. Reading the object is ``commands/report_policy.py``'s, the
one part that needs the ``kubernetes`` client.

Which moment, most faithful first:

1. an active ``PrefixCollapse`` alert (``status.alerts``): its ``since`` is when the
   operator raised it, acknowledged or not;
2. ``CacheHealthy=False`` with reason ``PrefixCollapse`` (``status.conditions``): its
   ``lastTransitionTime`` is when the condition turned False, the same moment.

Once the alert has cleared the status records no collapse (earlier decisions are Events
and the ``cachescale_alert_active`` series, not status): the time is then the user's to
give. ``CacheHealthy``'s transition after clearing is when it healed, not when it
collapsed, so it is never used.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cachescale.api.reasons import Diagnosis
from cachescale.api.spec import Engine
from cachescale.api.spec_base import DNS_LABEL, DNS_SUBDOMAIN, MAX_LABEL, MAX_NAME
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.exit_codes import ExitCode

_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN)
_DNS_LABEL = re.compile(DNS_LABEL)
COLLAPSE = Diagnosis.PREFIX_COLLAPSE.value


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """``--around policy/NAME``: the policy whose last collapse to centre on."""

    name: str


class PolicyReadError(Exception):
    """Why the policy could not be read, in one line, and the exit code it maps to."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class PolicyRead:
    """The policy object and the namespace it was read from."""

    namespace: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Centre:
    """The moment to centre on and the sentence saying where it came from."""

    at: datetime
    source: str
    """``alert`` or ``condition``: which part of the status gave it."""
    sentence: str


@dataclass(frozen=True, slots=True)
class Sources:
    """Where the policy reads its engine series: the report's defaults."""

    prometheus_url: str | None
    """None when the policy relies on the operator's default Prometheus."""
    selector: dict[str, str]
    engine: Engine


def policy_ref(text: str) -> PolicyRef:
    """``policy/NAME`` (NAME a Kubernetes object name); raises ``ArgumentTypeError``."""
    name = text.removeprefix("policy/")
    if len(name) > MAX_NAME or not _DNS_SUBDOMAIN.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"{text!r}: policy/NAME needs a Kubernetes object name (lowercase letters, "
            "digits, '-' and '.')"
        )
    return PolicyRef(name)


def namespace_name(text: str) -> str:
    """``--namespace``: a Kubernetes namespace name; raises ``ArgumentTypeError``."""
    if len(text) > MAX_LABEL or not _DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        )
    return text


def collapse_centre(policy: str, status: Mapping[str, Any]) -> Centre | None:
    """The collapse ``status`` records now (see the module docstring for the order), or
    None when it records none. ``policy`` is ``namespace/name``, for the sentence."""
    for alert in status.get("alerts") or []:
        if alert.get("reason") == COLLAPSE and (since := _time(alert.get("since"))):
            acked = ", acknowledged" if alert.get("acknowledged") else ""
            return Centre(
                since,
                "alert",
                f"centred on policy {policy}'s PrefixCollapse since {_words(since)} "
                f"(status.alerts{acked})",
            )
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == ConditionType.CACHE_HEALTHY.value
            and condition.get("status") == ConditionStatus.FALSE.value
            and condition.get("reason") == COLLAPSE
            and (since := _time(condition.get("lastTransitionTime")))
        ):
            return Centre(
                since,
                "condition",
                f"centred on policy {policy}'s PrefixCollapse since {_words(since)} "
                "(CacheHealthy=False)",
            )
    return None


def no_collapse(policy: str) -> str:
    """The line for a policy whose status records no collapse."""
    return (
        f"policy {policy} records no PrefixCollapse in its status (no active alert, "
        "CacheHealthy not False for it); give --around a time: its PrefixCollapse Event's, "
        'or where cachescale_alert_active{reason="PrefixCollapse"} rose'
    )


def sources(spec: Mapping[str, Any], namespace: str) -> Sources:
    """The policy's Prometheus URL, selector and engine, with the spec's own defaults (no
    selector: the policy's namespace; no engine: vLLM)."""
    metrics = spec.get("metrics") or {}
    selector = dict(metrics.get("selector") or {}) or {"namespace": namespace}
    engine = (spec.get("target") or {}).get("engine") or Engine.VLLM.value
    url = metrics.get("prometheusUrl") or None
    return Sources(prometheus_url=url, selector=selector, engine=Engine(engine))


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _words(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
