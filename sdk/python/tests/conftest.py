"""Helpers for the SDK's tests: drive the runtime's ASGI entry and its
Control service in-process, on a real asyncio loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from pinnedd_sdk.runtime import Runtime


class Answer:
    def __init__(self, msgs: list[dict[str, Any]]) -> None:
        start = next(m for m in msgs if m["type"] == "http.response.start")
        self.status: int = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.body = b"".join(m.get("body", b"") for m in msgs if m["type"] == "http.response.body")

    def json(self) -> Any:
        return json.loads(self.body)


async def request(rt: Runtime, method: str, path: str, headers: dict[str, str] | list[tuple[str, str]] | None = None,
                  body: bytes = b"") -> Answer:
    """One HTTP request through the data socket's ASGI entry."""
    items = headers.items() if isinstance(headers, dict) else (headers or [])
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "http_version": "1.1",
             "headers": [(k.lower().encode(), v.encode()) for k, v in items]}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    msgs: list[dict[str, Any]] = []

    async def send(m: dict[str, Any]) -> None:
        msgs.append(m)

    await rt(scope, receive, send)
    return Answer(msgs)


def routed(ns: str, id_: str, secret: str | None) -> list[tuple[str, str]]:
    h = [("X-Pinned-Namespace", ns), ("X-Pinned-Id", id_)]
    if secret is not None:
        h.append(("X-Pinned-Socket-Secret", secret))
    return h


@pytest.fixture
def run():
    """Runs a coroutine on a fresh event loop."""
    def go(coro: Any) -> Any:
        return asyncio.run(coro)
    return go
