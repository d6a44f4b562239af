"""pinnedd_sdk: write pinnedd host plugins in Python.

A plugin serves one or more namespaces; each instance (namespace, id) is an
ASGI app built per id by its Host. The SDK speaks plugin protocol 3
(plugins/PROTOCOL.md in the pinnedd repository): go-plugin's handshake,
the Control service over gRPC with mutual TLS, instance HTTP on the data
socket (uvicorn), durable state through pinnedd's Store service.

    from pinnedd_sdk import Host, Handlers, Instance, Request, route, serve

    class Counter(Handlers):
        def __init__(self, inst: Instance) -> None:
            self.tray = inst.tray("counter", "~")

        @route("POST", "/increment")
        async def increment(self, req: Request) -> dict:
            v = self.tray.get("value", 0) + 1
            self.tray.set("value", v)  # the answer waits until it is stored
            return {"value": v}

    serve({"/counters": Host(new=Counter)})
"""

from .cluster import ClusterClient, ClusterResponse
from .handlers import ASGIApp, Handlers, Request, Response, route
from .instance import Evicted, Instance, WindingDown
from .plugin import PROTOCOL_VERSION, serve
from .runtime import VERSION, Host, Runtime
from .state import Fenced, InvalidWrite, Item, Run, StateError, StateUnavailable, Tray, TrayHandler

__all__ = [
    "ASGIApp", "ClusterClient", "ClusterResponse", "Evicted", "Fenced", "Handlers", "Host", "Instance",
    "InvalidWrite", "Item", "PROTOCOL_VERSION", "Request", "Response", "Run", "Runtime", "StateError",
    "StateUnavailable", "Tray", "TrayHandler", "VERSION", "WindingDown", "route", "serve",
]
