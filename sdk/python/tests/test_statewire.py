"""Statewire's server side against the protocol's language-neutral
conformance vectors (statewire/testdata/vectors), and its stream."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

from conftest import request, routed

from pinnedd_sdk import Host, Instance
from pinnedd_sdk._proto import pinned_pb2 as pb
from pinnedd_sdk.runtime import Runtime
from pinnedd_sdk.statewire import CommandSpec, OpError, RunContext, Statewire, apply_ops, statewire_trays

VECTORS = Path(__file__).resolve().parents[3] / "statewire" / "testdata" / "vectors"


class Ctx:
    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def test_ops_vectors() -> None:
    cases = json.loads((VECTORS / "ops.json").read_text())["cases"]
    assert len(cases) > 20
    for c in cases:
        doc = copy.deepcopy(c["doc"])
        if c.get("error"):
            try:
                apply_ops(doc, c["ops"])
            except OpError:
                pass
            else:
                raise AssertionError(f"{c['name']}: applied, want an error")
            assert doc == c["doc"], f"{c['name']}: a failed frame changed the document"
        else:
            assert apply_ops(doc, c["ops"]) == c["want"], c["name"]


def say(f: dict[str, Any]) -> None:
    if not isinstance(f.get("text"), str):
        raise ValueError("say needs a string text")


def test_frames_vectors(run: Any) -> None:
    v = json.loads((VECTORS / "frames.json").read_text())
    assert set(v["commands"]) == {"say"}

    async def go() -> None:
        rt = Runtime({"/sw": Host(new=lambda inst: Statewire(inst, {}, {"say": CommandSpec(say)}),
                                  trays=statewire_trays())})
        rt.secured, rt.socket = True, "/x"
        await rt.Describe(pb.DescribeRequest(socket_secret="s"), Ctx())
        await rt.Activate(pb.ActivateRequest(namespace="/sw", id="a", generation=1), Ctx())
        for n, case in enumerate(v["cases"]):
            for i, step in enumerate(case["steps"]):
                body = {"clientId": f"c{n}", "frames": step["frames"], **step.get("extra", {})}
                a = await request(rt, "POST", "/frames", routed("/sw", "a", "s"), json.dumps(body).encode())
                where = f"{case['name']} step {i}: {a.body!r}"
                assert a.status == step["status"], where
                if "answer" in step:
                    assert a.json() == step["answer"], where
                if "expected" in step:
                    assert a.json()["expected"] == step["expected"], where
    run(go())


def test_stream_snapshot_ops_and_fin_at_eviction(run: Any) -> None:
    ran: list[list[str]] = []

    def new(inst: Instance) -> Statewire:
        async def go(rc: RunContext) -> None:
            ran.append([c.frame["text"] for c in rc.commands])
            await rc.applied()
            sw.doc.append_text(["log"], "".join(ran[-1]))
        sw = Statewire(inst, {"log": ""}, {"say": CommandSpec(say, run=True)}, run=go, keepalive=0.2)
        return sw

    async def go() -> None:
        rt = Runtime({"/sw": Host(new=new, trays=statewire_trays())})
        await rt.Activate(pb.ActivateRequest(namespace="/sw", id="a", generation=1), Ctx())
        lines: list[dict[str, Any]] = []
        got = asyncio.Event()

        async def send(m: dict[str, Any]) -> None:
            if m.get("body"):
                lines.append(json.loads(m["body"]))
                got.set()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/stream", "query_string": b"",
                 "headers": [(b"x-pinned-namespace", b"/sw"), (b"x-pinned-id", b"a")]}
        stream = asyncio.ensure_future(rt(scope, receive, send))
        while not lines:
            await asyncio.sleep(0.01)
        assert lines[0]["type"] == "snapshot" and lines[0]["state"] == {"log": ""} and lines[0]["version"] == 0
        a = await request(rt, "POST", "/frames", routed("/sw", "a", None),
                          json.dumps({"clientId": "c", "frames": [{"seq": 1, "type": "say", "text": "hi"}]}).encode())
        assert a.json() == {"acked": 1, "admitted": 1, "duplicates": 0}
        for _ in range(200):
            if any(l["type"] == "ops" for l in lines):
                break
            await asyncio.sleep(0.01)
        ops = [l for l in lines if l["type"] == "ops"]
        assert ops == [{"type": "ops", "version": 1, "ops": [{"op": "append", "path": ["log"], "text": "hi"}]}]
        assert ran == [["hi"]]
        await asyncio.sleep(0.3)
        assert any(l["type"] == "keepalive" for l in lines)
        await rt.Deactivate(pb.DeactivateRequest(namespace="/sw", id="a", reason=pb.REASON_DRAIN), Ctx())
        await asyncio.wait_for(stream, 5)
        assert lines[-1] == {"type": "fin", "code": "evicted", "reconnect": True}
    run(go())


def test_clients_forgotten_after_the_dedup_window(run: Any) -> None:
    """A client with nothing pending is forgotten once its last admission is
    older than the dedup window: its tray goes, and its seqs start over. One
    with a command still pending is kept."""
    made: list[Statewire] = []

    def new(inst: Instance) -> Statewire:
        made.append(Statewire(inst, {}, {"say": CommandSpec(say)}, dedup_window=60.0))
        return made[-1]

    async def go() -> None:
        rt = Runtime({"/sw": Host(new=new, trays=statewire_trays())})
        await rt.Activate(pb.ActivateRequest(namespace="/sw", id="a", generation=1), Ctx())

        async def frames(cid: str, seq: int) -> Any:
            body = {"clientId": cid, "frames": [{"seq": seq, "type": "say", "text": "hi"}]}
            return (await request(rt, "POST", "/frames", routed("/sw", "a", None), json.dumps(body).encode())).json()

        assert await frames("old", 1) == {"acked": 1, "admitted": 1, "duplicates": 0}
        sw = made[0]
        inst = sw.inst

        async def settled() -> None:  # tray runs are asynchronous
            for _ in range(500):
                if not inst.tray("client_commands", "old").items():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the command was never run")
        await settled()
        # Nothing happens within the window.
        assert await sw.forget_clients(time.time() + 30) == 0
        assert ("client_commands", "old") in inst.trays("client_commands")
        # Past it, the client is forgotten, and seq 1 is new again.
        assert await sw.forget_clients(time.time() + 61) == 1
        assert ("client_commands", "old") not in inst.trays("client_commands")
        assert await frames("old", 1) == {"acked": 1, "admitted": 1, "duplicates": 0}
        await settled()
        # A tray without a time gets one and keeps its client for a window.
        inst.tray("client_commands", "old").delete("admittedAt")
        assert await sw.forget_clients(time.time() + 61) == 0
        assert inst.tray("client_commands", "old").get("admittedAt") is not None
    run(go())
