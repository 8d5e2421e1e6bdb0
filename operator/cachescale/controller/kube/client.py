"""A small, raw-JSON Kubernetes API client with the retries an operator needs.

The operator reads and patches a handful of objects by path (Deployments, Pods, HPAs,
Secrets, its own policies' status, Events). Raw dicts keep those paths and patches
explicit and let one client serve built-in kinds and the CRD alike; the official
``kubernetes`` client does the transport, authentication and TLS (kubeconfig or
in-cluster). Errors are typed so callers can tell "not there" from "someone else
changed it" from "the API server is struggling"; 429, 5xx and requests that got no answer
at all (a restarting API server) are retried with backoff.
Every call blocks: the evaluation loop runs them in worker threads. Each HTTP request
sent (retries included) is reported to an optional ``on_request`` callback by its
Kubernetes verb (get, list, patch, create, watch): the operator counts them
(``cachescale_kube_requests_total``), which is how a steady state with no reads is seen.
Reading a target needs only :class:`Reads`: the operator serves it from watch-fed indexes
(``controller/kube/indexes.py``), tools and tests from a :class:`KubeApi`. Those indexes are
filled by informers (``controller/kube/informer.py``) through :meth:`KubeApi.list_page` and
:meth:`KubeApi.watch`, which streams a watch's events line by line as they arrive and is
never retried here: an informer decides whether to watch again or list anew.
"""

from __future__ import annotations

import contextlib
import copy
import json
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import yaml
from kubernetes import client, config
from urllib3 import BaseHTTPResponse
from urllib3.exceptions import HTTPError as TransportError
from urllib3.util.ssl_ import create_urllib3_context

JsonPatch = Sequence[Mapping[str, Any]]

RETRIES = 3
BACKOFF_S = 0.5
TIMEOUT_S = 10.0
UNREACHABLE = 599
"""The status given to a request that got no HTTP answer at all (connection refused or
reset, TLS failure, timeout): the API server restarting, or etcd behind it. Retried like
a 5xx, then a :class:`KubeError` like any other, never an untyped transport exception."""
RETRIED = (429, 500, 502, 503, 504, UNREACHABLE)
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Asks a list for its items' metadata only (``metadata_items``)."""


class KubeError(Exception):
    """An API error with the HTTP status and the server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class NotFoundError(KubeError):
    """404: the object (or resource) does not exist."""


class ConflictError(KubeError):
    """409 (or 422 from a failed JSON-patch ``test``): the object changed underneath us."""


class GoneError(KubeError):
    """410: the resourceVersion (or a list's ``continue`` token) is older than the API
    server keeps: list again."""


def load_config(kubeconfig: str | None = None, connections: int | None = None) -> client.ApiClient:
    """An API client from ``kubeconfig`` when given, else in-cluster (a pod's
    ServiceAccount), else ``$KUBECONFIG`` or ``~/.kube/config``. ``connections``: the
    connections it keeps open, one per thread that sends at once (the client's default,
    5 per CPU, makes the operator's evaluation threads open, handshake and discard TLS
    connections all the time)."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return _client(connections)
        except config.ConfigException:
            pass
    config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return _client(connections)


def _client(connections: int | None) -> client.ApiClient:
    configuration = client.Configuration.get_default_copy()
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    api_client = client.ApiClient(configuration)
    _pool_kw(api_client)["ssl_context"] = _tls_context(_pool_kw(api_client))
    return api_client


def with_connections(api_client: client.ApiClient, connections: int) -> client.ApiClient:
    """A client of the same cluster and credentials with a connection pool of its own, of
    ``connections``: watches hold their connection for minutes, so they get their own pool
    and never take one from the evaluation threads'. It shares ``api_client``'s TLS
    context (``_tls_context``)."""
    configuration = copy.deepcopy(api_client.configuration)
    configuration.connection_pool_maxsize = connections
    copied = client.ApiClient(configuration)
    kw = _pool_kw(copied)
    shared = _pool_kw(api_client).get("ssl_context")
    if shared is None:  # a client made outside ``load_config``
        kw["ssl_context"] = _tls_context(kw)
    else:  # the files are in the shared context already: not read again
        kw["ssl_context"] = shared
        for key in _TLS_FILES:
            del kw[key]
    return copied


_TLS_FILES = ("ca_certs", "ca_cert_data", "cert_file", "key_file")
"""The pool settings a TLS context replaces (``_tls_context`` reads and removes them)."""


def _pool_kw(api_client: client.ApiClient) -> dict[str, Any]:
    """The settings every connection of ``api_client``'s pool is made with."""
    kw: dict[str, Any] = api_client.rest_client.pool_manager.connection_pool_kw
    return kw


def _tls_context(kw: dict[str, Any]) -> ssl.SSLContext:
    """One TLS context for every connection of a client and of the clients copied from it
    (``with_connections``), with the CA and client certificate its pool settings name, which
    it takes out of them.

    Given none, urllib3 makes a context per connection and loads the CA and the client
    certificate into each (memory and a file read per connection; the informers of a
    shard hold one watch per kind and namespace). Verification is unchanged: urllib3 still
    sets the verify mode from the pool's ``cert_reqs`` and checks the host name, as it does
    with its own context. The files are read once, when the client is made; a CA rotated
    later is read by clients made after it."""
    context = create_urllib3_context(cert_reqs=kw["cert_reqs"])
    ca_certs, ca_cert_data = kw.pop("ca_certs"), kw.pop("ca_cert_data")
    if ca_certs or ca_cert_data:
        context.load_verify_locations(cafile=ca_certs, cadata=ca_cert_data)
    elif kw["cert_reqs"] != ssl.CERT_NONE:
        context.load_default_certs()  # as urllib3 does when no CA is named
    cert_file, key_file = kw.pop("cert_file"), kw.pop("key_file")
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


def api_client_or_reason(
    kubeconfig: str | None, connections: int | None = None
) -> client.ApiClient | str:
    """The cluster's API client, or why there is none (one line, naming the source)."""
    source = f"--kubeconfig {kubeconfig}" if kubeconfig else "the kubeconfig"
    try:
        return load_config(kubeconfig, connections)
    except ssl.SSLError as error:
        return f"{source}: its CA or client certificate is not usable: {error.reason or error}"
    except OSError as error:
        return f"{source}: cannot read: {error.strerror}"
    except (config.ConfigException, yaml.YAMLError, ValueError, TypeError, AttributeError) as error:
        # the kubernetes client reports a malformed file as any of these
        return f"{source}: not a usable kubeconfig: {str(error).splitlines()[0]}"


class Reads(Protocol):
    """The reads of a target (``workload.read_target``): one object, or a collection
    filtered by a label selector; ``NotFoundError`` when the object is not there."""

    def get(self, path: str) -> dict[str, Any]:
        """The object at ``path``."""
        ...

    def items(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The items of the collection at ``path``, optionally filtered by labels."""
        ...


class KubeApi:
    """GET/LIST/PATCH/POST by API path, returning parsed JSON."""

    def __init__(
        self, api_client: client.ApiClient, on_request: Callable[[str], None] | None = None
    ) -> None:
        self._client = api_client
        self._on_request = on_request
        """Told the Kubernetes verb of every request sent (retries included)."""

    def get(self, path: str) -> dict[str, Any]:
        """The object at ``path``."""
        return self._call("GET", path)

    def items(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The items of the collection at ``path``, optionally filtered by labels."""
        query = [("labelSelector", label_selector)] if label_selector else []
        return list(self._call("GET", path, query=query, verb="list").get("items", []))

    def metadata_items(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """Only the metadata of the items at ``path`` (a ``PartialObjectMetadataList``):
        how Secrets are listed, so their contents are never even sent."""
        query = [("labelSelector", label_selector)] if label_selector else []
        listed = self._call("GET", path, query=query, accept=METADATA_ONLY, verb="list")
        return [{"metadata": dict(item.get("metadata") or {})} for item in listed.get("items", [])]

    def list_page(self, path: str, query: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """One page of the collection at ``path`` as the API server sends it: ``items``,
        and ``metadata`` with the list's ``resourceVersion`` and the ``continue`` token of
        the next page (``query``: ``limit``, ``continue``, ...)."""
        return self._call("GET", path, query=list(query), verb="list")

    def watch(
        self, path: str, query: Sequence[tuple[str, str]], idle_timeout_s: float
    ) -> WatchStream:
        """Open a watch of the collection at ``path`` (``query``: ``resourceVersion``,
        ``timeoutSeconds``, ...); a :class:`KubeError` if it is refused or not answered
        (not retried). A stream that receives nothing for ``idle_timeout_s`` fails, so a
        connection that died silently is not waited on for ever."""
        if self._on_request is not None:
            self._on_request("watch")
        try:
            response = self._open(
                "GET",
                path,
                [*query, ("watch", "true")],
                None,
                "application/json",
                "application/json",
                (TIMEOUT_S, idle_timeout_s),
            )
        except (client.ApiException, TransportError, OSError) as error:
            raise status_error(*_unsent(error)) from None
        if response.status >= 400:
            response.read()
            status = int(response.status)
            raise status_error(status, _message(bytes(response.data or b""), status))
        return WatchStream(response.response)

    def patch(self, path: str, body: Any, content_type: str = JSON_PATCH) -> dict[str, Any]:
        """Apply a JSON patch (default) or a merge patch to the object at ``path``."""
        return self._call("PATCH", path, body=body, content_type=content_type, verb="patch")

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object in the collection at ``path``."""
        return self._call("POST", path, body=body, verb="create")

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        verb: str = "get",
    ) -> dict[str, Any]:
        for attempt in range(RETRIES + 1):
            if self._on_request is not None:
                self._on_request(verb)
            status, data = self._send(method, path, query or [], body, content_type, accept)
            if status < 400:
                return dict(json.loads(data)) if data else {}
            if status in RETRIED and attempt < RETRIES:
                time.sleep(BACKOFF_S * 2**attempt)
                continue
            raise status_error(status, _message(data, status))
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: Any,
        content_type: str,
        accept: str,
    ) -> tuple[int, bytes]:
        try:
            response = self._open(method, path, query, body, content_type, accept, TIMEOUT_S)
        except (client.ApiException, TransportError, OSError) as error:
            status, message = _unsent(error)
            return status, message.encode()
        response.read()
        return int(response.status), bytes(response.data or b"")

    def _open(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: Any,
        content_type: str,
        accept: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        """The client's response, its body not read yet (``kubernetes.client.rest``)."""
        verb, url, headers, payload, _ = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query,
            header_params={"Accept": accept, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._client.call_api(
            verb, url, header_params=headers, body=payload, _request_timeout=timeout
        )


class WatchStream:
    """An open watch: its events (``{"type", "object"}``), parsed one a line as the API
    server sends them. Iterated in one thread; :meth:`close` may be called from any other,
    and ends the iteration at once."""

    def __init__(self, response: BaseHTTPResponse) -> None:
        self._response = response
        self._closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        finished = False
        try:
            for line in self._response:
                if line.strip():
                    yield dict(json.loads(line))
            finished = True
        except (TransportError, OSError) as error:
            if not self._closed:
                raise KubeError(UNREACHABLE, f"watch cut: {type(error).__name__}") from None
        finally:
            if self._closed or not finished:
                self._response.close()  # a cut connection is not reused
            self._response.release_conn()

    def close(self) -> None:
        """End the stream; a read blocked in another thread returns."""
        self._closed = True
        with contextlib.suppress(ValueError, RuntimeError, OSError):  # not open (any more)
            self._response.shutdown()


def _unsent(error: Exception) -> tuple[int, str]:
    """The status and message of a request the client raised on instead of returning: an
    ``ApiException`` (Retry-After responses, among others) carries the API server's; no
    answer at all (the server is down or gone) is :data:`UNREACHABLE`."""
    if isinstance(error, client.ApiException):
        return int(error.status or UNREACHABLE), str(error.body or error.reason or "")
    return UNREACHABLE, f"no answer from the API server: {type(error).__name__}"


def status_error(status: int, message: str) -> KubeError:
    """The typed error for an HTTP status (a response's, or a watch's ERROR event's)."""
    if status == 404:
        return NotFoundError(status, message)
    if status == 409 or (status == 422 and "test" in message.lower()):
        return ConflictError(status, message)
    if status == 410:
        return GoneError(status, message)
    return KubeError(status, message)


def _message(data: bytes, status: int) -> str:
    try:
        return str(json.loads(data).get("message") or f"HTTP {status}")
    except (ValueError, AttributeError):
        return data.decode(errors="replace")[:300] or f"HTTP {status}"


def resource_version_test(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-patch op that fails (409/422) if ``obj`` changed since it was read."""
    version = obj.get("metadata", {}).get("resourceVersion")
    return {"op": "test", "path": "/metadata/resourceVersion", "value": version}
