"""A class with handlers: the smallest way to write an instance without an
ASGI framework. Any ASGI app (Starlette, FastAPI, a bare callable) works
as well; this is for hosts that need nothing more.

    class Counter(Handlers):
        def __init__(self, inst: Instance) -> None:
            self.tray = inst.tray("counter", "~")

        @route("POST", "/increment")
        async def increment(self, req: Request) -> Response:
            ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar
from urllib.parse import parse_qs

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Request:
    """An instance request: the path is relative to the instance."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self._receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.query: dict[str, list[str]] = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        self.headers: dict[str, str] = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        self._body: bytes | None = None

    async def body(self) -> bytes:
        if self._body is None:
            chunks = []
            while True:
                msg = await self._receive()
                if msg["type"] == "http.disconnect":
                    break
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body"):
                    break
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        return json.loads(await self.body() or b"null")


@dataclass
class Response:
    """A whole response; a dict or list body is sent as JSON. A body that
    is an async iterator of bytes is streamed, each chunk flushed."""

    body: Any = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    async def send(self, send: Send) -> None:
        headers = dict(self.headers)
        stream: AsyncIterator[bytes] | None = None
        if isinstance(self.body, (dict, list)):
            data = (json.dumps(self.body, separators=(",", ":")) + "\n").encode()
            headers.setdefault("content-type", "application/json")
        elif isinstance(self.body, str):
            data = self.body.encode()
            headers.setdefault("content-type", "text/plain; charset=utf-8")
        elif isinstance(self.body, (bytes, bytearray)):
            data = bytes(self.body)
        else:
            stream, data = self.body, b""
        if stream is None:
            headers["content-length"] = str(len(data))
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]})
        if stream is None:
            await send({"type": "http.response.body", "body": data})
            return
        async for chunk in stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def route(method: str, path: str) -> Callable[[F], F]:
    """Marks a method of a Handlers class as the handler of method + path."""

    def mark(fn: F) -> F:
        fn.__pinnedd_route__ = (method.upper(), path)  # type: ignore[attr-defined]
        return fn

    return mark


class Handlers:
    """Base class of an instance written as a class with handlers: each
    method marked with @route answers one method and path, returning a
    Response or a JSON value. Lifecycle hooks are methods of the same
    names as on any instance app: start, idle, wind_down, stop."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError(f"{type(self).__name__} serves HTTP only, not {scope['type']}")
        routes = _routes(type(self))
        req = Request(scope, receive)
        allowed = [m for (m, p) in routes if p == req.path]
        name = routes.get((req.method, req.path))
        if name is None:
            status = 405 if allowed else 404
            hdrs = {"allow": ", ".join(allowed)} if allowed else {}
            await Response({"error": "method not allowed" if allowed else "not found"}, status, hdrs).send(send)
            return
        out = await getattr(self, name)(req)
        if not isinstance(out, Response):
            out = Response(out)
        await out.send(send)


_route_cache: dict[type, dict[tuple[str, str], str]] = {}


def _routes(cls: type) -> dict[tuple[str, str], str]:
    r = _route_cache.get(cls)
    if r is None:
        r = {}
        for name in dir(cls):
            mark = getattr(getattr(cls, name, None), "__pinnedd_route__", None)
            if mark is not None:
                r[mark] = name
        _route_cache[cls] = r
    return r
