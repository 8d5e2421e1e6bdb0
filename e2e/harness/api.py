"""A tiny JSON client for the Kubernetes API, for the harness itself.

The harness (readiness checks, the node stand-in) must not depend on the code it tests, so
it talks to the API server with the standard library: HTTPS with the admin's client
certificate or a bearer token, JSON in and out, an :class:`ApiError` carrying the status.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer: ``status`` and the server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Credentials:
    """Where the server is and who we are to it."""

    server: str
    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None


class Api:
    """GET/POST/PATCH/PUT/DELETE on API paths, with JSON bodies."""

    def __init__(self, credentials: Credentials, timeout_s: float = 10.0) -> None:
        self.credentials = credentials
        self.timeout_s = timeout_s
        context = ssl.create_default_context(cafile=str(credentials.ca_file))
        if credentials.cert_file is not None:
            context.load_cert_chain(str(credentials.cert_file), str(credentials.key_file))
        self._context = context

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request; the decoded JSON answer (``ApiError`` on a non-2xx status)."""
        raw = self.raw(method, path, body, content_type)
        return json.loads(raw) if raw else None

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> bytes:
        """Send one request; the answer's bytes (``ApiError`` on a non-2xx status)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self.credentials.token:
            headers["Authorization"] = f"Bearer {self.credentials.token}"
        url = self.credentials.server.rstrip("/") + path
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self._context
            ) as response:
                answer: bytes = response.read()
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace")) from None
        return answer

    def get(self, path: str) -> Any:
        """GET ``path``."""
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        """POST ``body`` to ``path``."""
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> Any:
        """PATCH ``path`` (a JSON merge patch unless told otherwise)."""
        return self.request("PATCH", path, body, content_type)

    def put(self, path: str, body: Any) -> Any:
        """PUT ``body`` at ``path``."""
        return self.request("PUT", path, body)

    def delete(self, path: str, body: Any = None) -> Any:
        """DELETE ``path`` (with DeleteOptions as the body when given)."""
        return self.request("DELETE", path, body)
