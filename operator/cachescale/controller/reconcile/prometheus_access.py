"""How the operator reaches a policy's Prometheus: which URL, whether it may, with what.

A policy names a Prometheus (``spec.metrics.prometheusUrl``, else the operator's
``--default-prometheus-url``) and may name Secrets holding a bearer token and a CA bundle
(``spec.metrics.auth``). The policy author chooses both, and the operator acts on them
with its own network and its own RBAC, so both are checked here before anything is
fetched or sent (``docs/security.md``): a URL the strict rules of ``gather/egress.py``
refuse or outside the cluster owner's allow list (``--allowed-prometheus-url``; empty:
no policy-chosen URL), ``insecureSkipVerify`` without the owner's ``--allow-insecure-tls``,
or a Secret without the ``PROMETHEUS_CREDENTIALS`` opt-in label is refused
(``EgressRefused``), and a Secret that cannot be read or decoded is a
``PrometheusCredentialsError``. The client is given the normalized URL that was checked,
and the status names it: what was allowed is what is reached. CA bundles are written to a
private directory of the process, afresh from the Secret each time. The evaluation
pipeline (``evaluation.py``) only asks for a ``PrometheusConfig`` and reports what these
raise; keeping the egress and credential rules apart from it gives them one home that can
be read and reviewed on its own.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import os
import tempfile
import threading
from base64 import b64decode
from typing import TYPE_CHECKING

from cachescale.api.policy import PROMETHEUS_CREDENTIALS
from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec, SecretKeyRef
from cachescale.controller.kube.client import KubeError, Reads
from cachescale.gather.egress import UrlRefused, reached_url, redact_url
from cachescale.gather.prometheus import PrometheusConfig

if TYPE_CHECKING:
    from cachescale.controller.reconcile.context import Operator


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
    """How to read this policy's Prometheus; ``EgressRefused`` when its URL is refused or
    outside the allow list (checked first: no Secret is even read), when it asks for
    unverified TLS the cluster owner does not allow, or when a Secret has not opted in.
    The URL in the config is the normalized one that was checked (``gather/egress.py``),
    so the client connects to exactly what was allowed."""
    url = _checked_url(operator, spec)
    auth = spec.metrics.auth
    insecure = auth is not None and auth.insecure_skip_verify
    if insecure and not operator.allow_insecure_tls:
        raise EgressRefused(
            Problem.INSECURE_TLS_NOT_ALLOWED,
            "spec.metrics.auth.insecureSkipVerify is true but the operator does not allow "
            "unverified TLS, so nothing was fetched or sent: remove it and give the server's "
            "CA in auth.caSecretRef, or ask the operator's admin to set the chart value "
            "prometheus.allowInsecureSkipVerify (--allow-insecure-tls)",
        )
    token = ca_file = None
    if auth is not None and auth.bearer_token_secret_ref is not None:
        token = _secret(operator.reads, namespace, auth.bearer_token_secret_ref).strip()
    if auth is not None and auth.ca_secret_ref is not None:
        ca_file = _ca_file(_secret(operator.reads, namespace, auth.ca_secret_ref))
    return PrometheusConfig(url=url, bearer_token=token, ca_file=ca_file, verify_tls=not insecure)


def _checked_url(operator: Operator, spec: CacheScalingPolicySpec) -> str:
    """The normalized URL this policy's reads connect to; ``EgressRefused`` when there is
    none, or when the policy's own URL is refused by the strict rules or the allow list
    (the operator's default is the cluster owner's choice: no allow list applies)."""
    own = spec.metrics.prometheus_url
    if own is None:
        return _default_url(operator)
    try:
        url = reached_url(own)
        admitted = url if operator.allowed_urls is None else operator.allowed_urls.admits(own)
    except UrlRefused as error:
        raise EgressRefused(
            Problem.METRICS_URL_NOT_ALLOWED,
            f"prometheusUrl is refused because {error}, so nothing was fetched: write it as "
            "http(s)://host[:port][/path] with no user info, query or escapes, e.g. "
            "http://prometheus.monitoring:9090",
        ) from None
    if admitted is None:
        raise EgressRefused(Problem.METRICS_URL_NOT_ALLOWED, _not_allowed(operator, url))
    return admitted


def _not_allowed(operator: Operator, url: str) -> str:
    """Why ``url`` (normalized) is refused by the allow list, with the fix, on one line."""
    allowed = operator.allowed_urls
    assert allowed is not None
    change = "(chart value allowedPrometheusUrls, --allowed-prometheus-url)"
    if allowed.entries:
        return (
            f"prometheusUrl {url} is outside the operator's allowed Prometheus URLs "
            f"({', '.join(allowed.entries)}): nothing was fetched; use an allowed URL or ask "
            f"the operator's admin to add it {change}"
        )
    default = (
        "remove prometheusUrl to read the operator's default Prometheus, or "
        if operator.default_prometheus_url is not None
        else ""
    )
    return (
        f"prometheusUrl {url} is not allowed: the operator allows no policy-chosen Prometheus "
        f"URL, so nothing was fetched; {default}ask the operator's admin to list it {change}"
    )


def _default_url(operator: Operator) -> str:
    """The operator's default Prometheus, normalized; ``EgressRefused`` when unset."""
    default = operator.default_prometheus_url
    if default is None:
        raise EgressRefused(
            Problem.NO_PROMETHEUS_URL,
            "spec.metrics.prometheusUrl is not set and the operator has no default: set "
            "prometheusUrl, or ask the operator's admin to set the chart value prometheus.url "
            "(--default-prometheus-url)",
        )
    try:
        return reached_url(default)
    except UrlRefused as error:  # the flag is checked when parsed: only a caller's own
        raise EgressRefused(
            Problem.NO_PROMETHEUS_URL,
            f"the operator's default Prometheus URL is refused because {error}: ask the "
            "operator's admin to fix the chart value prometheus.url (--default-prometheus-url)",
        ) from None


def prometheus_url(operator: Operator, spec: CacheScalingPolicySpec) -> str | None:
    """The Prometheus a policy reads, as written: its own ``prometheusUrl``, else the
    operator's default (None: neither is set)."""
    return spec.metrics.prometheus_url or operator.default_prometheus_url


def prometheus_source(operator: Operator, spec: CacheScalingPolicySpec) -> str | None:
    """Where the signals were read, for the status: the normalized URL connected to
    (without credentials or query), and whether it is the policy's or the operator's
    default."""
    url = prometheus_url(operator, spec)
    if url is None:
        return None
    origin = "the policy's" if spec.metrics.prometheus_url is not None else "the operator's default"
    try:
        shown = reached_url(url)
    except UrlRefused:
        shown = redact_url(url)
    return f"{shown} ({origin})"


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


class _PrivateDirectory:
    """A directory only this process' user can enter (``mkdtemp``: mode 0700, a fresh
    unpredictable name), made on first use and again if it disappeared."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._path: str | None = None
        self._lock = threading.Lock()

    def path(self) -> str:
        """The directory, made if it is not there."""
        with self._lock:
            if self._path is None or not os.path.isdir(self._path):
                self._path = tempfile.mkdtemp(prefix=self._prefix)
            return self._path


CA_DIRECTORY = _PrivateDirectory("cachescale-ca-")
"""Where this process writes the CA bundles of ``spec.metrics.auth.caSecretRef``."""


def _ca_file(pem: str) -> str:
    """The CA bundle as a file (requests wants a path), one per distinct content, in the
    process' private directory. Written every time from the Secret's content, atomically
    (a private temporary file renamed over it, mode 0600): an existing file is never
    trusted, and a reader never sees a partial one."""
    digest = hashlib.sha256(pem.encode()).hexdigest()[:16]
    directory = CA_DIRECTORY.path()
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".ca-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="ascii") as stream:
            stream.write(pem)
        path = os.path.join(directory, f"ca-{digest}.pem")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
