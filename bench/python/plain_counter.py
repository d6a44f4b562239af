"""The benchmark's baseline: the counter's HTTP contract as a plain ASGI
app that uvicorn serves over TCP, the value in memory (nothing durable, no
pinnedd in the way). Paths carry the id: /counters/<id>/increment."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

values: dict[str, int] = {}


async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
              send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    parts = scope["path"].split("/")
    status, body = 404, {"error": "not found"}
    if len(parts) == 4 and parts[1] == "counters":
        cid, op = parts[2], parts[3]
        if op == "increment" and scope["method"] == "POST":
            values[cid] = values.get(cid, 0) + 1
            status, body = 200, {"value": values[cid]}
        elif op == "value" and scope["method"] == "GET":
            status, body = 200, {"value": values.get(cid, 0)}
    data = (json.dumps(body, separators=(",", ":")) + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
