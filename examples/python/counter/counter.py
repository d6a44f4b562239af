#!/usr/bin/python3
"""The counter host in Python: the same HTTP contract as examples/counter.

    POST /counters/alice/increment -> {"value":1}
    GET  /counters/alice/value     -> {"value":1}

The value lives in the tray ("counter", "~"), written through to pinnedd's
store. An increment's answer waits at the SDK's output gate until its write
is stored, so an acknowledged increment survives kill -9 of this process.

Run it under pinnedd: pinnedd agent ... --plugin /counters=$PWD/counter.py
(with the SDK installed: pip install ./sdk/python).
"""

from __future__ import annotations

from pinnedd_sdk import Handlers, Host, Instance, Request, Response, StateError, route, serve


class Counter(Handlers):
    def __init__(self, inst: Instance) -> None:
        self.tray = inst.tray("counter", "~")
        self.value: int = self.tray.get("value", 0)

    @route("POST", "/increment")
    async def increment(self, req: Request) -> Response:
        # No await between reading and writing: one event loop, so no other
        # request interleaves. The write is queued before the answer, which
        # the gate then holds until the write is stored.
        try:
            self.tray.set("value", self.value + 1)
        except StateError as e:
            # Nothing was queued: a fence or an instance being reset.
            return Response({"error": str(e)}, 503, {"retry-after": "1"})
        self.value += 1
        return Response({"value": self.value})

    @route("GET", "/value")
    async def get(self, req: Request) -> Response:
        return Response({"value": self.value})


HOSTS = {"/counters": Host(new=Counter)}

if __name__ == "__main__":
    serve(HOSTS)
