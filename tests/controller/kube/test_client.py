"""The API client when the API server gives no answer at all (down, restarting), its
connection pool and the one TLS context its connections share (still verifying the
server), and its watches: a refused one typed, an open one closed from another thread.

e2e/test_faults.py kills the real API server mid-run; this is the same failure at unit
scale: the request must end in a typed ``KubeError`` the evaluation reports
(``ApiError``), after the usual retries, never in a transport exception that escapes the
evaluation as a crash with a traceback.
"""

from __future__ import annotations

import threading
from pathlib import Path

import kmock
import pytest
from kubernetes import client

from cachescale.controller.kube import client as kube
from cachescale.controller.kube.client import (
    UNREACHABLE,
    GoneError,
    KubeApi,
    KubeError,
    api_client_or_reason,
    load_config,
    with_connections,
)
from tests.controller.cluster import NAMESPACE, PODS, Clock, FakeCluster, pods
from tests.gather.gather_fakes import closed_port_url, fake_prometheus, self_signed_certificate
from tests.polling import wait_for


def test_no_answer_is_a_typed_error_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "BACKOFF_S", 0.0)
    configuration = client.Configuration()
    configuration.host = closed_port_url()
    configuration.retries = 0
    api = KubeApi(client.ApiClient(configuration))
    sent = []
    original = api._send

    def counted(*args: object) -> tuple[int, bytes]:
        sent.append(args)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "_send", counted)
    with pytest.raises(KubeError) as failure:
        api.get("/apis/apps/v1/namespaces/llm/deployments/vllm")
    assert failure.value.status == UNREACHABLE
    assert "no answer from the API server" in failure.value.message
    assert len(sent) == kube.RETRIES + 1


def test_the_client_keeps_a_connection_per_sending_thread(tmp_path: Path) -> None:
    """The operator's evaluation threads share one client: with the client's default pool
    (5 per CPU) they opened, handshook and discarded TLS connections all the time."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n",
        encoding="utf-8",
    )
    pool = load_config(str(kubeconfig), connections=32).rest_client.pool_manager
    assert pool.connection_pool_kw["maxsize"] == 32


def _kubeconfig(path: Path, server: str, ca: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}', certificate-authority: '{ca}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n",
        encoding="utf-8",
    )
    return path


def _tls_settings(api_client: client.ApiClient) -> dict[str, object]:
    kw: dict[str, object] = api_client.rest_client.pool_manager.connection_pool_kw
    return kw


def test_clients_of_one_cluster_verify_with_one_tls_context(tmp_path: Path) -> None:
    """Each connection used to get a TLS context of its own, with the CA loaded again
    (a shard holds a watch per kind and namespace): now a client and
    the clients copied from it for watches share one, and still verify the server."""
    served = self_signed_certificate(tmp_path)
    with fake_prometheus(tls=served) as server:
        base = load_config(str(_kubeconfig(tmp_path / "kc", server.url, served[0])), 4)
        watches = with_connections(base, 3)
        context = _tls_settings(base)["ssl_context"]
        assert _tls_settings(watches)["ssl_context"] is context
        for settings in map(_tls_settings, (base, watches)):
            assert not {"ca_certs", "ca_cert_data", "cert_file", "key_file"} & settings.keys()
        assert KubeApi(base).get("/api/v1/namespaces/llm")["status"] == "success"
        assert KubeApi(watches).get("/api/v1/namespaces/llm")["status"] == "success"


@pytest.mark.parametrize("refused", ["another CA", "another host name"])
def test_a_server_the_tls_context_cannot_verify_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str
) -> None:
    monkeypatch.setattr(kube, "BACKOFF_S", 0.0)
    served = self_signed_certificate(tmp_path)
    (tmp_path / "other").mkdir()
    other_ca = refused == "another CA"
    ca = self_signed_certificate(tmp_path / "other")[0] if other_ca else served[0]
    with fake_prometheus(tls=served) as server:
        url = server.url if other_ca else server.url.replace("127.0.0.1", "localhost")
        base = load_config(str(_kubeconfig(tmp_path / "kc", url, ca)), 4)
        for api_client in (base, with_connections(base, 3)):
            with pytest.raises(KubeError) as failure:
                KubeApi(api_client).get("/api/v1/namespaces/llm")
            assert failure.value.status == UNREACHABLE
        assert server.queries == []  # no request was sent over an unverified connection


def test_a_ca_that_is_not_a_certificate_is_named_when_the_client_is_made(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n", encoding="utf-8")
    kubeconfig = _kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", ca)
    reason = api_client_or_reason(str(kubeconfig))
    assert reason == (
        f"--kubeconfig {kubeconfig}: its CA or client certificate is not usable: "
        "NO_CERTIFICATE_OR_CRL_FOUND"
    )


def test_a_refused_watch_is_a_typed_error(cluster: FakeCluster) -> None:
    """A watch answered 410 (its resourceVersion too old) is :class:`GoneError`: the
    informer lists again (``controller/kube/informer.py``)."""
    cluster.react(cluster.emulator["watch", kmock.resource(PODS)][:1], 410)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    with pytest.raises(GoneError):
        cluster.api.watch(path, [("resourceVersion", "1")], idle_timeout_s=5)


def test_a_watch_closed_from_another_thread_ends(cluster: FakeCluster) -> None:
    """An informer being stopped closes its watch while its thread waits for events."""
    cluster.put(PODS, pods("vllm", 1, Clock().now)[0])
    stream = cluster.api.watch(f"/api/v1/namespaces/{NAMESPACE}/pods", [], idle_timeout_s=30)
    seen: list[str] = []

    def follow() -> None:
        seen.extend(event["type"] for event in stream)

    thread = threading.Thread(target=follow)
    thread.start()
    wait_for(lambda: True if seen else None, 5, "the pod's ADDED event")
    stream.close()
    thread.join(5)
    assert not thread.is_alive()
    assert seen == ["ADDED"]
