"""The desired state a user writes: ``CacheScalingPolicy.spec`` (cachescale.dev/v1alpha1).

Every field carries its unit in its name and a docstring that becomes the CRD's field
description, so ``kubectl explain csp.spec`` documents the API. Cross-field rules are
written twice on purpose: as pydantic validators (used by ``cachescale validate`` and by
the operator) and as CEL ``x-kubernetes-validations`` on the same model (used by the API
server, so ``kubectl apply`` rejects a bad policy before the operator ever sees it). The
tests evaluate both against the same cases.

Types are strict, as the API server's are: ``maxReplicas: "20"`` is a string, not 20, and
``true`` is not 1. Numbers must be finite, and every number and duration has an upper
bound, so an infinite budget (``.inf``) or a window of a million hours fails here and, by
the published ``maximum`` or CEL rule, in the API server too.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from cachescale.api.base import ApiModel
from cachescale.api.durations import DURATION_PATTERN, parse_duration_seconds
from cachescale.api.label_selector import LabelSelector

# Kubernetes object names (DNS-1123 subdomain for Deployments/HPAs, label for containers).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Prometheus label names; values are escaped by the gather layer, never interpolated raw.
PROMETHEUS_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
_PROMETHEUS_LABEL_NAME_RE = re.compile(PROMETHEUS_LABEL_NAME)
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
MAX_EVALUATIONS_PER_WINDOW = 360
"""At most this many evaluations in one window: the status keeps a mark per evaluation of
the last window (``LearnedState.recent_replicas``), so the ratio bounds the status's size."""
TOO_MANY_EVALUATIONS = (
    f"window must be at most {MAX_EVALUATIONS_PER_WINDOW} intervals (the status keeps a mark "
    "per evaluation of the window): lengthen the interval or shorten the window"
)
"""A rate over more than a day no longer describes the present, and costs Prometheus."""
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


class Mode(StrEnum):
    """Whether the operator changes anything."""

    ENFORCE = "Enforce"
    """Patch the HPA envelope and ``--max-num-seqs`` as decided."""
    ADVISE = "Advise"
    """Only record decisions in status, Events and metrics (dry run)."""


class Engine(StrEnum):
    """The inference engine serving the Deployment (selects metric names and flags)."""

    VLLM = "vllm"
    SGLANG = "sglang"


class CollapseAction(StrEnum):
    """What happens to the HPA envelope during a prefix-cache collapse (always alerted)."""

    HOLD = "Hold"
    """Pin maxReplicas at the pre-collapse level; the SLO guard may still scale within budget."""
    CAP_AT_BUDGET = "CapAtBudget"
    """Cap maxReplicas at what the GPU-seconds budget allows."""
    SCALE_AS_USUAL = "ScaleAsUsual"
    """Leave the envelope alone; only alert."""


class Tenancy(StrEnum):
    """Who shares the engines' prefix cache (``CacheIsolation`` in docs/decisions.md)."""

    SINGLE_TENANT = "SingleTenant"
    """One tenant: any prompt may reuse any other's cached prefix."""
    MULTI_TENANT = "MultiTenant"
    """Several tenants share the engines: a block-hash collision between their prompts
    would serve one tenant's KV blocks to another, so the hash must be cryptographic."""


ONE_AUTOSCALER = (
    "set exactly one of hpaName (an autoscaling/v2 HorizontalPodAutoscaler) and "
    "scaledObjectName (a KEDA ScaledObject, which owns the HPA it generates)"
)


class AutoscalerKind(StrEnum):
    """What scales the Deployment: the object the policy reads and patches."""

    HPA = "HorizontalPodAutoscaler"
    SCALED_OBJECT = "ScaledObject"


class TargetSpec(SpecModel):
    """The serving workload this policy manages, in the policy's namespace, and the one
    autoscaler that scales it: an HPA or a KEDA ScaledObject."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.hpaName) != has(self.scaledObjectName)",
                    "message": ONE_AUTOSCALER,
                }
            ]
        }
    )

    deployment_name: str = Field(pattern=_DNS_SUBDOMAIN, max_length=MAX_NAME)
    """Name of the Deployment that runs the inference engine."""
    container_name: str = Field(default="vllm", pattern=_DNS_LABEL, max_length=MAX_LABEL)
    """Container in that Deployment whose args carry the engine flags."""
    hpa_name: str | None = Field(default=None, pattern=_DNS_SUBDOMAIN, max_length=MAX_NAME)
    """HorizontalPodAutoscaler (autoscaling/v2) that scales the Deployment. Exactly one of
    hpaName and scaledObjectName."""
    scaled_object_name: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, max_length=MAX_NAME
    )
    """KEDA ScaledObject (keda.sh/v1alpha1) that scales the Deployment; cachescale patches
    its maxReplicaCount, minReplicaCount and queue trigger threshold, never the HPA KEDA
    generates from it. Exactly one of hpaName and scaledObjectName."""
    engine: Engine = Field(default=Engine.VLLM, strict=False)
    """Inference engine: vllm or sglang."""

    @model_validator(mode="after")
    def _one_autoscaler(self) -> Self:
        if (self.hpa_name is None) == (self.scaled_object_name is None):
            both = self.hpa_name is not None
            raise ValueError(f"{ONE_AUTOSCALER}; {'both are' if both else 'neither is'} set")
        return self

    @property
    def autoscaler_kind(self) -> AutoscalerKind:
        """Which kind of autoscaler the policy names."""
        return AutoscalerKind.HPA if self.hpa_name is not None else AutoscalerKind.SCALED_OBJECT

    @property
    def autoscaler_name(self) -> str:
        """The name of that autoscaler (the validator guarantees exactly one is set)."""
        name = self.hpa_name if self.hpa_name is not None else self.scaled_object_name
        assert name is not None
        return name

    @property
    def autoscaler(self) -> str:
        """``HorizontalPodAutoscaler vllm`` or ``ScaledObject vllm``, for messages."""
        return f"{self.autoscaler_kind.value} {self.autoscaler_name}"


class SecretKeyRef(SpecModel):
    """A key in a Secret in the policy's namespace. The operator uses the Secret only if it
    carries the label cachescale.dev/prometheus-credentials: "true" (docs/security.md)."""

    name: str = Field(pattern=_DNS_SUBDOMAIN, max_length=MAX_NAME)
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
        if not _PROMETHEUS_LABEL_NAME_RE.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a Prometheus label name "
                "(letters, digits and underscores, not starting with a digit)"
            )
        if not value:
            raise ValueError(f"{name}: {EMPTY_LABEL_VALUE}")
    return selector


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
                    "rule": "duration(self.window) >= duration('1m')",
                    "message": "window must be at least 1m; shorter rates are scrape noise",
                },
                {
                    "rule": f"duration(self.window) <= duration('{MAX_WINDOW}')",
                    "message": f"window must be at most {MAX_WINDOW}",
                },
                {
                    "rule": "duration(self.interval) >= duration('10s')",
                    "message": "interval must be at least 10s",
                },
                {
                    "rule": "duration(self.interval) <= duration(self.window)",
                    "message": "interval must not be longer than window",
                },
                {
                    "rule": "duration(self.window).getSeconds() <= "
                    f"{MAX_EVALUATIONS_PER_WINDOW} * duration(self.interval).getSeconds()",
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
    window: Duration = "5m"
    """Window over which rates and quantiles are computed (at least 1m, at most 24h)."""
    interval: Duration = "30s"
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


class SLOSpec(SpecModel):
    """The latency objective the serving Deployment must meet."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.ttftP99Seconds) || "
                    "self.ttftP99Seconds >= self.ttftP95Seconds",
                    "message": "ttftP99Seconds must be at least ttftP95Seconds",
                }
            ]
        }
    )

    ttft_p95_seconds: float = Field(gt=0, le=600)
    """Time-to-first-token 95th percentile objective, in seconds (queueing included)."""
    ttft_p99_seconds: float | None = Field(default=None, gt=0, le=600)
    """Optional TTFT 99th percentile objective, in seconds; at least ttftP95Seconds."""

    @model_validator(mode="after")
    def _p99_not_below_p95(self) -> Self:
        if self.ttft_p99_seconds is not None and self.ttft_p99_seconds < self.ttft_p95_seconds:
            raise ValueError(
                f"ttftP99Seconds ({self.ttft_p99_seconds}) must be at least "
                f"ttftP95Seconds ({self.ttft_p95_seconds})"
            )
        return self


class BudgetSpec(SpecModel):
    """The cost envelope: GPU-seconds per 1k requests and the replica range."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must be less than or equal to maxReplicas",
                }
            ]
        }
    )

    gpu_seconds_per_1k_requests: float = Field(gt=0, le=MAX_GPU_SECONDS_PER_1K)
    """Most GPU-seconds the fleet may spend per 1,000 successful requests."""
    min_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    """Fewest replicas the HPA may run."""
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS)
    """Most replicas the HPA may run."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must be less than or equal to "
                f"maxReplicas ({self.max_replicas})"
            )
        return self


MAX_PROMPT_SOURCES = 16
"""Declared prompt sources: each costs one or two list calls when a collapse is suspected."""


class PromptSourceKind(StrEnum):
    """What kind of object builds or holds the prompts (read for changes, never written)."""

    DEPLOYMENT = "Deployment"
    """A service that builds prompts (a RAG API, a gateway): its ReplicaSet revisions."""
    CONFIG_MAP = "ConfigMap"
    """Prompt templates: when and by which manager they were last written."""
    SECRET = "Secret"
    """Metadata only (when and by whom written), never the contents."""


class PromptSource(SpecModel):
    """Where this policy's prompts come from: a namespace, a kind and the labels of the
    objects. When a collapse is suspected or raised, changes to them in the hour before
    the drop are named (``docs/decisions.md``, "PrefixCollapse")."""

    namespace: str = Field(pattern=_DNS_LABEL, max_length=MAX_LABEL)
    """The namespace of the objects."""
    kind: PromptSourceKind = Field(strict=False)
    """Deployment, ConfigMap or Secret (Secrets are read as metadata only)."""
    label_selector: str = Field(min_length=1, max_length=MAX_LABEL_SELECTOR)
    """A Kubernetes label selector, e.g. app=rag-api (required: never a whole namespace; at
    most 256 characters)."""

    @field_validator("label_selector")
    @classmethod
    def _selector_parses(cls, text: str) -> str:
        try:
            LabelSelector.parse(text)
        except ValueError as error:
            raise ValueError(f"labelSelector {text!r} is not a label selector: {error}") from None
        return text


class CacheSpec(SpecModel):
    """When a prefix-cache hit-rate drop counts as a collapse, and what to do about it."""

    collapse_relative_drop: float = Field(default=0.5, gt=0, lt=1)
    """A collapse needs the warm-pod token hit rate to fall by more than this fraction of
    its baseline (0.5: a baseline of 0.85 must fall below 0.425)..."""
    collapse_absolute_drop: float = Field(default=0.2, gt=0, lt=1)
    """...and by at least this many points (0.2: 0.85 must fall below 0.65). Together with
    the relative drop this keeps a low-hit workload (baseline under 0.2: nothing worth
    protecting) from ever being called a collapse."""
    collapse_windows: int = Field(default=3, ge=1, le=100)
    """Consecutive evaluation windows the drop must persist before it is a collapse."""
    pod_warmup_seconds: int = Field(default=600, ge=0, le=86_400)
    """Pods younger than this are warming up: excluded from the collapse test."""
    on_collapse: CollapseAction = Field(default=CollapseAction.HOLD, strict=False)
    """Hold, CapAtBudget or ScaleAsUsual; an alert is raised in every case."""
    tenancy: Tenancy = Field(default=Tenancy.SINGLE_TENANT, strict=False)
    """SingleTenant or MultiTenant: with MultiTenant, the CacheIsolation condition is False
    while an engine hashes prefix blocks with a non-cryptographic hash (xxhash, builtin)."""
    prompt_sources: list[PromptSource] = Field(default=[], max_length=MAX_PROMPT_SOURCES)
    """Where the prompts come from (RAG APIs, gateways, template ConfigMaps): when a
    collapse is suspected or raised, their changes in the hour before the drop are named,
    besides those in the policy's own namespace. At most 16."""


class ModelShape(SpecModel):
    """The served model's attention shape: sizes the KV cache (values from config.json)."""

    layers: int = Field(ge=1, le=1024)
    """Transformer layers (num_hidden_layers)."""
    kv_heads: int = Field(ge=1, le=1024)
    """Key/value heads (num_key_value_heads; equals attention heads without GQA)."""
    head_dim: int = Field(ge=1, le=4096)
    """Dimension of one attention head (hidden_size / num_attention_heads)."""
    kv_dtype_bytes: int = Field(default=2, ge=1, le=4)
    """Bytes per KV element: 2 for fp16/bf16, 1 for fp8."""
    weights_gib: float = Field(gt=0, le=MAX_GIB)
    """Model weights resident per replica, in GiB (summed over tensor-parallel GPUs); they
    must fit in the engine's share of GPU memory (memoryGiB × gpuMemoryUtilization)."""


class GpuShape(SpecModel):
    """The memory a replica gives the engine."""

    memory_gib: float = Field(gt=0, le=MAX_GIB)
    """GPU memory per replica, in GiB (summed over tensor-parallel GPUs)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """The engine's --gpu-memory-utilization (vLLM default 0.9; 0.92 from vLLM 0.20)."""


class BatchingSpec(SpecModel):
    """Whether and how the engine's batch ceiling (--max-num-seqs) is managed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minNumSeqs <= self.maxNumSeqs",
                    "message": "minNumSeqs must be less than or equal to maxNumSeqs",
                },
                {
                    "rule": "!self.manageMaxNumSeqs || (has(self.model) && has(self.gpu))",
                    "message": "manageMaxNumSeqs needs model and gpu to compute the ceiling",
                },
                {
                    "rule": "!has(self.model) || !has(self.gpu) || self.model.weightsGiB < "
                    "self.gpu.memoryGiB * self.gpu.gpuMemoryUtilization",
                    "message": "model.weightsGiB must fit in gpu.memoryGiB × "
                    "gpu.gpuMemoryUtilization (the engine's share of GPU memory)",
                },
                {
                    "rule": f"duration(self.cooldown) <= duration('{MAX_COOLDOWN}')",
                    "message": f"cooldown must be at most {MAX_COOLDOWN}",
                },
            ]
        }
    )

    manage_max_num_seqs: bool = False
    """Let the operator change --max-num-seqs (vLLM) / --max-running-requests (SGLang).
    Each change restarts pods and empties their caches, so it is off by default."""
    min_num_seqs: int = Field(default=8, ge=1, le=65_536)
    """Lowest batch ceiling the operator may set."""
    max_num_seqs: int = Field(default=256, ge=1, le=65_536)
    """Highest batch ceiling the operator may set."""
    model: ModelShape | None = None
    """Model shape for the cache-friendly ceiling; required when managing the ceiling."""
    gpu: GpuShape | None = None
    """GPU memory for the cache-friendly ceiling; required when managing the ceiling."""
    cache_reserve_gib: float = Field(default=0.0, ge=0, le=MAX_GIB)
    """KV memory, in GiB, kept for reusable cached prefixes rather than running sequences."""
    cooldown: Duration = "30m"
    """Least time between two ceiling changes, at most 168h (each change empties caches)."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_num_seqs > self.max_num_seqs:
            raise ValueError(
                f"minNumSeqs ({self.min_num_seqs}) must be less than or equal to "
                f"maxNumSeqs ({self.max_num_seqs})"
            )
        return self

    @field_validator("cooldown")
    @classmethod
    def _cooldown_bounded(cls, cooldown: str) -> str:
        if parse_duration_seconds(cooldown) > parse_duration_seconds(MAX_COOLDOWN):
            raise ValueError(f"cooldown {cooldown} is longer than {MAX_COOLDOWN}")
        return cooldown

    @model_validator(mode="after")
    def _weights_fit(self) -> Self:
        if self.model is None or self.gpu is None:
            return self
        share = self.gpu.memory_gib * self.gpu.gpu_memory_utilization
        if self.model.weights_gib >= share:
            raise ValueError(
                f"model.weightsGiB ({self.model.weights_gib:g}) does not fit in the engine's "
                f"share of GPU memory: gpu.memoryGiB ({self.gpu.memory_gib:g}) × "
                f"gpuMemoryUtilization ({self.gpu.gpu_memory_utilization:g}) = {share:g} GiB, "
                "and the KV cache needs room too"
            )
        return self

    @model_validator(mode="after")
    def _shape_known_when_managed(self) -> Self:
        if self.manage_max_num_seqs and (self.model is None or self.gpu is None):
            raise ValueError(
                "manageMaxNumSeqs is true but model and gpu are not both set; "
                "the cache-friendly ceiling needs them"
            )
        return self

    @property
    def cooldown_seconds(self) -> float:
        """The cooldown in seconds."""
        return parse_duration_seconds(self.cooldown)


class CacheScalingPolicySpec(SpecModel):
    """Desired state: the SLO and cost budget of one serving Deployment, and how to act."""

    mode: Mode = Field(default=Mode.ADVISE, strict=False)
    """Enforce changes the HPA and engine flags; Advise (default) only recommends."""
    target: TargetSpec
    """The Deployment, its engine container and its HPA or KEDA ScaledObject."""
    metrics: MetricsSpec
    """Prometheus location, series selector, window and evaluation interval."""
    slo: SLOSpec
    """Latency objective."""
    budget: BudgetSpec
    """Cost budget and replica range."""
    cache: CacheSpec = Field(default_factory=CacheSpec)
    """Prefix-cache collapse detection and response."""
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    """Management of --max-num-seqs."""
    restore_on_delete: bool = True
    """When the policy is deleted, restore the HPA envelope recorded before the first change."""
