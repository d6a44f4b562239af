"""Cluster calls: an instance calls any instance of the fleet through its
node's front door (PINNEDD_URL), authenticated by its process's
cluster-call credential (plugin protocol 3, section 6)."""

from __future__ import annotations

import asyncio
import http.client
import os
import ssl
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

HEADER_CLUSTER_CALL = "X-Pinned-Cluster-Call"


@dataclass(frozen=True)
class ClusterResponse:
    status: int
    headers: dict[str, str]
    body: bytes


class ClusterClient:
    """Calls instances of the fleet as namespace ns."""

    def __init__(self, ns: str, token: Callable[[], str], url: str | None = None, ca_pem: str | None = None,
                 timeout: float = 30.0) -> None:
        self._ns = ns
        self._token = token
        self._url = url if url is not None else os.environ.get("PINNEDD_URL", "")
        self._ca = ca_pem if ca_pem is not None else os.environ.get("PINNEDD_URL_CA", "")
        self._timeout = timeout

    async def call(self, method: str, path: str, body: bytes | None = None,
                   headers: dict[str, str] | None = None) -> ClusterResponse:
        """Sends method path (e.g. "POST", "/counters/bob/increment") to
        the fleet and returns the whole answer."""
        if not self._url:
            raise RuntimeError("no PINNEDD_URL: cluster calls need pinnedd")
        if not self._token():
            raise RuntimeError("no cluster-call credential yet (Describe has not run)")
        if not path.startswith("/"):
            raise ValueError(f"path {path!r} must start with /")
        return await asyncio.to_thread(self._do, method, path, body, dict(headers or {}))

    def _do(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> ClusterResponse:
        u = urlsplit(self._url)
        conn: http.client.HTTPConnection
        if u.scheme == "https":
            ctx = ssl.create_default_context()
            if self._ca:
                ctx.load_verify_locations(cadata=self._ca)
            conn = http.client.HTTPSConnection(u.netloc, timeout=self._timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(u.netloc, timeout=self._timeout)
        headers[HEADER_CLUSTER_CALL] = f"{self._ns} {self._token()}"
        try:
            conn.request(method, u.path.rstrip("/") + path, body=body, headers=headers)
            r = conn.getresponse()
            return ClusterResponse(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()
