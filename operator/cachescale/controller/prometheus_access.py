"""How the operator reaches a policy's Prometheus: which URL, whether it may, with what.

A policy names a Prometheus (``spec.metrics.prometheusUrl``, else the operator's
``--default-prometheus-url``) and may name Secrets holding a bearer token and a CA bundle
(``spec.metrics.auth``). The policy author chooses both, and the operator acts on them
with its own network and its own RBAC, so both are checked here before anything is
fetched or sent (``docs/security.md``): a URL outside the cluster owner's allow list
(``--allowed-prometheus-url``) or a Secret without the ``PROMETHEUS_CREDENTIALS`` opt-in
label is refused (``EgressRefused``), and a Secret that cannot be read or decoded is a
``PrometheusCredentialsError``. The evaluation pipeline (``evaluation.py``) only asks for
a ``PrometheusConfig`` and reports what these raise; keeping the egress and credential
rules apart from it gives them one home that can be read and reviewed on its own.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import tempfile
from base64 import b64decode
from typing import TYPE_CHECKING

from cachescale.api.policy import PROMETHEUS_CREDENTIALS
from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec, SecretKeyRef
from cachescale.controller.kube import KubeError, Reads
from cachescale.gather.prometheus import PrometheusConfig, redact_url

if TYPE_CHECKING:
    from cachescale.controller.evaluation import Operator


class PrometheusCredentialsError(Exception):
    """A Secret named in ``spec.metrics.auth`` could not be read, lacks the key, or holds
    no base64 text: the policy freezes as ``PrometheusCredentialsUnreadable``."""


class EgressRefused(Exception):  # noqa: N818 (a refusal, not a failure)
    """The policy asks for a Prometheus URL or a Secret the operator may not use: nothing
    is fetched or sent, and the policy reports ``reason`` with a one-line fix."""

    def __init__(self, reason: Problem, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(message)


def prometheus_config(
    operator: Operator, namespace: str, spec: CacheScalingPolicySpec
) -> PrometheusConfig:
    """How to read this policy's Prometheus; ``EgressRefused`` when its URL is outside the
    allow list (checked first: no Secret is even read) or a Secret has not opted in."""
    url = prometheus_url(operator, spec)
    if url is None:
        raise EgressRefused(
            Problem.NO_PROMETHEUS_URL,
            "spec.metrics.prometheusUrl is not set and the operator has no default: set "
            "prometheusUrl, or ask the operator's admin to set the chart value prometheus.url "
            "(--default-prometheus-url)",
        )
    allowed = operator.allowed_urls
    if spec.metrics.prometheus_url is not None and allowed is not None and not allowed.allows(url):
        raise EgressRefused(
            Problem.METRICS_URL_NOT_ALLOWED,
            f"prometheusUrl {redact_url(url)} is outside the operator's allowed Prometheus "
            f"URLs ({', '.join(allowed.entries)}): nothing was fetched; use an allowed URL or "
            "ask the operator's admin to add it (--allowed-prometheus-url, chart value "
            "allowedPrometheusUrls)",
        )
    auth = spec.metrics.auth
    token = ca_file = None
    if auth is not None and auth.bearer_token_secret_ref is not None:
        token = _secret(operator.reads, namespace, auth.bearer_token_secret_ref).strip()
    if auth is not None and auth.ca_secret_ref is not None:
        ca_file = _ca_file(_secret(operator.reads, namespace, auth.ca_secret_ref))
    verify = not (auth is not None and auth.insecure_skip_verify)
    return PrometheusConfig(url=url, bearer_token=token, ca_file=ca_file, verify_tls=verify)


def prometheus_url(operator: Operator, spec: CacheScalingPolicySpec) -> str | None:
    """The Prometheus a policy reads: its own ``prometheusUrl``, else the operator's
    default (None: neither is set)."""
    return spec.metrics.prometheus_url or operator.default_prometheus_url


def prometheus_source(operator: Operator, spec: CacheScalingPolicySpec) -> str | None:
    """Where the signals were read, for the status: the URL without credentials or query,
    and whether it is the policy's or the operator's default."""
    url = prometheus_url(operator, spec)
    if url is None:
        return None
    origin = "the policy's" if spec.metrics.prometheus_url is not None else "the operator's default"
    return f"{redact_url(url)} ({origin})"


def _secret(api: Reads, namespace: str, ref: SecretKeyRef) -> str:
    """The decoded value of ``ref`` in the policy's namespace, if the Secret opted in with
    the ``PROMETHEUS_CREDENTIALS`` label: a policy author who may not read a Secret must
    not get it sent to a server of their choice (a confused deputy)."""
    try:
        secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/{ref.name}")
    except KubeError as error:
        raise PrometheusCredentialsError(f"Secret {ref.name}: {error}") from error
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(PROMETHEUS_CREDENTIALS) != "true":
        raise EgressRefused(
            Problem.CREDENTIALS_NOT_ALLOWED,
            f"Secret {ref.name} is not labelled {PROMETHEUS_CREDENTIALS}=true, so it is not "
            f"used and nothing was sent; if it is meant for Prometheus, run: kubectl label "
            f"secret {ref.name} -n {namespace} {PROMETHEUS_CREDENTIALS}=true",
        )
    value = secret.get("data", {}).get(ref.key)
    if value is None:
        raise PrometheusCredentialsError(f"Secret {ref.name} has no key {ref.key!r}")
    try:
        return b64decode(value).decode()
    except (binascii.Error, UnicodeDecodeError) as error:
        raise PrometheusCredentialsError(
            f"Secret {ref.name} key {ref.key!r} is not base64-encoded text"
        ) from error


def _ca_file(pem: str) -> str:
    """The CA bundle as a file (requests wants a path), one per distinct content."""
    digest = hashlib.sha256(pem.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"cachescale-ca-{digest}.pem")
    if not os.path.exists(path):
        with open(path, "w", encoding="ascii") as handle:
            handle.write(pem)
    return path
