"""Certificates and keys for a throw-away control plane, made with the openssl CLI.

A loopback kube-apiserver needs a CA, a serving certificate (SANs: 127.0.0.1, localhost
and the first service IP, which in-cluster clients would dial), client certificates for
the admin and the controller-manager (RBAC reads the user from CN and the groups from O),
a front-proxy CA with its client (quiets the controller-manager's "missing CA bundle"
errors) and a key pair that signs ServiceAccount tokens. EC P-256 keys: generated in
milliseconds, and every component accepts them. Everything lives in the run's temp dir.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_IP = "10.0.0.1"
"""The first address of the service range: the ``kubernetes`` Service's ClusterIP."""
DAYS = "2"


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    """Every file the control plane's flags point at."""

    ca: Pair
    serving: Pair
    admin: Pair
    controller_manager: Pair
    front_proxy_ca: Pair
    front_proxy_client: Pair
    service_account_key: Path
    service_account_pub: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _key(path: Path) -> Path:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    return path


def _ca(directory: Path, name: str) -> Pair:
    key = _key(directory / f"{name}.key")
    cert = directory / f"{name}.crt"
    _openssl(
        "req", "-x509", "-new", "-key", str(key), "-out", str(cert), "-days", DAYS,
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    return Pair(cert, key)


def _signed(directory: Path, name: str, subject: str, ca: Pair, extensions: str) -> Pair:
    key = _key(directory / f"{name}.key")
    request, cert = directory / f"{name}.csr", directory / f"{name}.crt"
    extfile = directory / f"{name}.ext"
    extfile.write_text(extensions, encoding="utf-8")
    _openssl("req", "-new", "-key", str(key), "-out", str(request), "-subj", subject)
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(cert), "-days", DAYS, "-extfile", str(extfile),
    )  # fmt: skip
    return Pair(cert, key)


CLIENT = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
SERVER = (
    "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    "subjectAltName=IP:127.0.0.1,IP:" + SERVICE_IP + ",DNS:localhost,DNS:kubernetes,"
    "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
)


def make_certificates(directory: Path) -> Certificates:
    """Generate the whole set into ``directory`` (about a second of openssl)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    front_proxy_ca = _ca(directory, "front-proxy-ca")
    sa_key = _key(directory / "sa.key")
    sa_pub = directory / "sa.pub"
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return Certificates(
        ca=ca,
        serving=_signed(directory, "apiserver", "/CN=kube-apiserver", ca, SERVER),
        admin=_signed(directory, "admin", "/O=system:masters/CN=admin", ca, CLIENT),
        controller_manager=_signed(
            directory, "controller-manager", "/CN=system:kube-controller-manager", ca, CLIENT
        ),
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=_signed(
            directory, "front-proxy-client", "/CN=front-proxy-client", front_proxy_ca, CLIENT
        ),
        service_account_key=sa_key,
        service_account_pub=sa_pub,
    )
