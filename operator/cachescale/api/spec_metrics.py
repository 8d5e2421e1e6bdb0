"""``spec.metrics``: where a policy's engine series live and over which window they are read.

The Prometheus URL, its credentials (references to labelled Secrets, never the secrets
themselves), the label matchers that select one Deployment's series, the rate window and
the evaluation interval, and an optional PromQL for the arrival rate. Label names are
checked as Prometheus label names and values may not be empty (in PromQL an empty value
also matches series without the label); the gather layer escapes every value, never
splicing it raw. Window and interval are bounded so the status, which keeps a mark per
evaluation of the window, stays small.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from cachescale.api.durations import parse_duration_seconds
from cachescale.api.spec_base import (
    DNS_SUBDOMAIN,
    MAX_DEMAND_QUERY,
    MAX_EVALUATIONS_PER_WINDOW,
    MAX_NAME,
    MAX_SELECTOR_KEY,
    MAX_SELECTOR_LABELS,
    MAX_SELECTOR_VALUE,
    MAX_URL,
    MAX_WINDOW,
    MIN_INTERVAL_SECONDS,
    MIN_WINDOW_SECONDS,
    PROMETHEUS_LABEL_NAME_RE,
    PROMETHEUS_URL_PATTERN,
    TOO_MANY_EVALUATIONS,
    Duration,
    SpecModel,
    cel_or_default,
)


class SecretKeyRef(SpecModel):
    """A key in a Secret in the policy's namespace. The operator uses the Secret only if it
    carries the label cachescale.dev/prometheus-credentials: "true" (docs/security.md)."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=MAX_NAME)
    """Secret name."""
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=MAX_NAME)
    """Key within the Secret."""


class PrometheusAuth(SpecModel):
    """How to authenticate to Prometheus and verify its certificate."""

    bearer_token_secret_ref: SecretKeyRef | None = None
    """Secret key holding a bearer token sent as ``Authorization: Bearer``; never logged.
    The Secret must carry the label cachescale.dev/prometheus-credentials: "true"."""
    ca_secret_ref: SecretKeyRef | None = None
    """Secret key holding a PEM CA bundle to verify Prometheus' TLS certificate.
    The Secret must carry the label cachescale.dev/prometheus-credentials: "true"."""
    insecure_skip_verify: bool = False
    """Skip TLS verification. Off by default; only for test clusters."""


EMPTY_LABEL_VALUE = (
    "selector values must not be empty: in PromQL an empty value also matches every series "
    "that lacks the label"
)


def _check_selector(selector: dict[str, str]) -> dict[str, str]:
    for name, value in selector.items():
        if len(name) > MAX_SELECTOR_KEY:
            raise ValueError(
                f"selector key {name[:MAX_SELECTOR_KEY]!r}... is longer than "
                f"{MAX_SELECTOR_KEY} characters"
            )
        if not PROMETHEUS_LABEL_NAME_RE.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a Prometheus label name "
                "(letters, digits and underscores, not starting with a digit)"
            )
        if not value:
            raise ValueError(f"{name}: {EMPTY_LABEL_VALUE}")
    return selector


DEFAULT_WINDOW = "5m"
"""``metrics.window`` when a policy leaves it out."""
DEFAULT_INTERVAL = "30s"
"""``metrics.interval`` when a policy leaves it out."""
WINDOW = cel_or_default("window", DEFAULT_WINDOW)
INTERVAL = cel_or_default("interval", DEFAULT_INTERVAL)


class MetricsSpec(SpecModel):
    """Where the engine's metrics live and over which window they are read."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.selector) || "
                    "self.selector.all(k, k.matches('^[a-zA-Z_][a-zA-Z0-9_]*$'))",
                    "message": "selector keys must be Prometheus label names",
                },
                {
                    "rule": "!has(self.selector) || "
                    f"self.selector.all(k, size(k) <= {MAX_SELECTOR_KEY})",
                    "message": f"selector keys must be at most {MAX_SELECTOR_KEY} characters",
                },
                {
                    "rule": "!has(self.selector) || "
                    "self.selector.all(k, size(self.selector[k]) > 0)",
                    "message": EMPTY_LABEL_VALUE,
                },
                {
                    "rule": f"duration({WINDOW}) >= duration('1m')",
                    "message": "window must be at least 1m; shorter rates are scrape noise",
                },
                {
                    "rule": f"duration({WINDOW}) <= duration('{MAX_WINDOW}')",
                    "message": f"window must be at most {MAX_WINDOW}",
                },
                {
                    "rule": f"duration({INTERVAL}) >= duration('10s')",
                    "message": "interval must be at least 10s",
                },
                {
                    "rule": f"duration({INTERVAL}) <= duration({WINDOW})",
                    "message": "interval must not be longer than window",
                },
                {
                    "rule": f"duration({WINDOW}).getSeconds() <= "
                    f"{MAX_EVALUATIONS_PER_WINDOW} * duration({INTERVAL}).getSeconds()",
                    "message": TOO_MANY_EVALUATIONS,
                },
            ]
        }
    )

    prometheus_url: str | None = Field(
        default=None, pattern=PROMETHEUS_URL_PATTERN, max_length=MAX_URL
    )
    """Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090: http or
    https, a host and port, an optional path; no user:password@, query or fragment. Left
    out, the operator's default (``--default-prometheus-url``, chart value
    ``prometheus.url``); status.signals.prometheus says which was used."""
    auth: PrometheusAuth | None = None
    """Optional bearer token and CA bundle, both read from Secrets."""
    selector: Annotated[
        dict[str, Annotated[str, Field(max_length=MAX_SELECTOR_VALUE)]],
        AfterValidator(_check_selector),
    ] = Field(default_factory=dict, max_length=MAX_SELECTOR_LABELS)
    """Label matchers (name: exact value) selecting this Deployment's engine series,
    e.g. {namespace: llm, model_name: llama-3-8b}. Values are escaped, never spliced, and
    must not be empty; at most 16 matchers, names of at most 63 characters, values of at
    most 253. Left out or {}, it is {namespace: <the policy's namespace>}: a policy
    never reads every engine in Prometheus."""
    window: Duration = DEFAULT_WINDOW
    """Window over which rates and quantiles are computed (at least 1m, at most 24h)."""
    interval: Duration = DEFAULT_INTERVAL
    """How often the policy is evaluated (at least 10s, at most the window)."""
    demand_query: str | None = Field(default=None, min_length=1, max_length=MAX_DEMAND_QUERY)
    """Optional PromQL giving the arrival rate in requests per second as exactly one series,
    e.g. sum(rate(nginx_ingress_controller_requests{ingress="llm"}[5m])). Replaces the
    estimate from the engines' own series (finished requests plus queue growth); use it
    when a gateway or ingress counts requests the engines never see. Sent verbatim with
    this policy's Prometheus credentials; any other answer leaves the arrival rate
    unknown, with the reason in status. At most 2048 characters."""

    def selector_in(self, namespace: str) -> dict[str, str]:
        """The selector a policy in ``namespace`` reads with: its own, or when it gives
        none, ``{namespace: <namespace>}``."""
        return dict(self.selector) or {"namespace": namespace}

    @field_validator("window")
    @classmethod
    def _window_long_enough(cls, window: str) -> str:
        if parse_duration_seconds(window) < MIN_WINDOW_SECONDS:
            raise ValueError(f"window {window} is shorter than 1m; rates would be noise")
        if parse_duration_seconds(window) > parse_duration_seconds(MAX_WINDOW):
            raise ValueError(f"window {window} is longer than {MAX_WINDOW}")
        return window

    @field_validator("interval")
    @classmethod
    def _interval_long_enough(cls, interval: str) -> str:
        if parse_duration_seconds(interval) < MIN_INTERVAL_SECONDS:
            raise ValueError(f"interval {interval} is shorter than 10s")
        return interval

    @model_validator(mode="after")
    def _interval_within_window(self) -> Self:
        interval = parse_duration_seconds(self.interval)
        if interval > parse_duration_seconds(self.window):
            raise ValueError(
                f"interval ({self.interval}) must not be longer than window ({self.window})"
            )
        if parse_duration_seconds(self.window) > MAX_EVALUATIONS_PER_WINDOW * interval:
            raise ValueError(
                f"{TOO_MANY_EVALUATIONS} (window {self.window}, interval {self.interval})"
            )
        return self

    @property
    def window_seconds(self) -> float:
        """The window in seconds."""
        return parse_duration_seconds(self.window)

    @property
    def interval_seconds(self) -> float:
        """The evaluation interval in seconds."""
        return parse_duration_seconds(self.interval)
