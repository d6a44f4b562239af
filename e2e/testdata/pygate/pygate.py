"""The Python SDK's output gate against pinnedd's real Store service
(supervisor.NewStoreServer over memstore, with commits that set the field
"boom" failed and those that set "slow" held 300 ms), which
e2e/python_test.go serves on the unix socket given as argv[1]. Prints "ok"
or fails with an AssertionError.

What it checks, through the runtime's data-socket entry:
- an answer written behind a write leaves only once the write is stored;
- a failed commit turns the answer held behind it into 504, drops the
  instance (the next request is refused in-band as inactive), and a fresh
  activation loads only what was stored;
- a response already started when a write it follows fails is cut;
- a write fenced by a newer activation answers 503 + Retry-After and
  reports FENCED.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc

from pinnedd_sdk import Host, Instance
from pinnedd_sdk._proto import pinned_pb2 as pb
from pinnedd_sdk._proto import pinned_pb2_grpc as pbg
from pinnedd_sdk.runtime import Runtime

sys.path.insert(0, sys.argv[2])  # the SDK's tests: the request helper
from conftest import request, routed  # noqa: E402

NS = "/gate"


class Ctx:
    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


class Gate:
    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.tray = inst.tray("t", "~")
        self.seen: list[tuple[int, int]] = []  # (done, queued) at each send

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        st = self.inst.state

        async def watched(m: dict[str, Any]) -> None:
            await send(m)
            self.seen.append((st.done, st.queued))

        name = scope["path"].strip("/")
        if scope["path"] == "/stream":
            await watched({"type": "http.response.start", "status": 200, "headers": []})
            await watched({"type": "http.response.body", "body": b"one\n", "more_body": True})
            self.tray.set("boom", 1)
            await watched({"type": "http.response.body", "body": b"two\n", "more_body": True})
            await watched({"type": "http.response.body", "body": b""})
            return
        if scope["method"] == "POST":
            self.tray.set(name, name)
        body = json.dumps({f: self.tray.get(f) for f in self.tray.fields()}).encode()
        await watched({"type": "http.response.start", "status": 200, "headers": []})
        await watched({"type": "http.response.body", "body": body})


async def main(socket: str) -> None:
    apps: list[Gate] = []
    rt = Runtime({NS: Host(new=lambda inst: apps.append(Gate(inst)) or apps[-1])})
    rt.store = pbg.StoreStub(grpc.aio.insecure_channel("unix:" + socket))  # type: ignore[no-untyped-call]
    h = routed(NS, "a", None)

    await rt.Activate(pb.ActivateRequest(namespace=NS, id="a", generation=1), Ctx())
    a = await request(rt, "POST", "/slow", h)
    assert a.status == 200 and a.json() == {"slow": "slow"}, a.body
    # Every message left only once the write queued before it was stored.
    assert apps[0].seen and all(done == queued for done, queued in apps[0].seen), apps[0].seen

    a = await request(rt, "POST", "/boom", h)
    assert a.status == 504 and b"outcome unknown" in a.body, (a.status, a.body)
    await asyncio.sleep(0.1)
    a = await request(rt, "GET", "/x", h)
    assert a.status == 503 and a.headers.get("x-pinned-refusal") == "inactive", (a.status, a.headers)

    # A fresh activation loads what was stored: not the failed write.
    await rt.Activate(pb.ActivateRequest(namespace=NS, id="a", generation=1), Ctx())
    a = await request(rt, "GET", "/x", h)
    assert a.status == 200 and a.json() == {"slow": "slow"}, a.body

    # A response under way when a write it follows fails is cut.
    try:
        await request(rt, "GET", "/stream", h)
    except Exception as e:  # the server ends the connection on it
        assert type(e).__name__ == "_Cut", repr(e)
    else:
        raise AssertionError("a started response survived a failed write behind it")

    # A newer activation fences this one: its write answers 503.
    await asyncio.sleep(0.1)
    await rt.Activate(pb.ActivateRequest(namespace=NS, id="a", generation=1), Ctx())
    await rt.store.Load(pb.StoreLoadRequest(namespace=NS, id="a", generation=2))
    a = await request(rt, "POST", "/late", h)
    assert a.status == 503 and a.headers.get("retry-after") == "1", (a.status, a.body)
    ev = await asyncio.wait_for(rt.events.get(), 5)
    assert (ev.kind, ev.namespace, ev.id) == (pb.EVENT_KIND_FENCED, NS, "a"), ev
    print("ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
