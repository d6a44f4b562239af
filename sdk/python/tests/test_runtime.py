"""The runtime: the data socket's admission and routing, the Control
service's lifecycle, trays and tracked work (without a store: writes are
durable at once)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from conftest import request, routed

from pinnedd_sdk import Handlers, Host, Instance, Request, Response, Run, WindingDown, route
from pinnedd_sdk._proto import pinned_pb2 as pb
from pinnedd_sdk.runtime import Runtime


class Ctx:
    """The part of a grpc.aio ServicerContext the runtime uses."""

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


class Echo(Handlers):
    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.events: list[str] = []

    @route("GET", "/who")
    async def who(self, req: Request) -> dict[str, Any]:
        return {"ns": self.inst.namespace, "id": self.inst.id, "gen": self.inst.generation,
                "headers": sorted(req.headers)}

    @route("POST", "/boom")
    async def boom(self, req: Request) -> Response:
        raise ValueError("boom")

    async def start(self) -> None:
        self.events.append("start")

    async def stop(self) -> None:
        self.events.append("stop")


def secured(hosts: dict[str, Host]) -> Runtime:
    rt = Runtime(hosts)
    rt.secured = True
    rt.socket = "/nonexistent.sock"
    return rt


def test_data_socket_refuses_without_the_secret(run) -> None:
    async def go() -> None:
        rt = secured({"/echo": Host(new=Echo)})
        # Before Describe hands the secret over, nothing is admitted.
        a = await request(rt, "GET", "/who", routed("/echo", "a", "s3cret"))
        assert a.status == 403
        await rt.Describe(pb.DescribeRequest(socket_secret="s3cret", cluster_call_token="tok"), Ctx())
        # A later Describe does not change the secret.
        await rt.Describe(pb.DescribeRequest(socket_secret="other"), Ctx())
        await rt.Activate(pb.ActivateRequest(namespace="/echo", id="a", generation=7), Ctx())
        for hs in (routed("/echo", "a", None), routed("/echo", "a", "wrong"), routed("/echo", "a", "other"),
                   routed("/echo", "a", "s3cret") + [("X-Pinned-Socket-Secret", "s3cret")]):
            assert (await request(rt, "GET", "/who", hs)).status == 403
        a = await request(rt, "GET", "/who", routed("/echo", "a", "s3cret") + [("X-Client", "1")])
        assert a.status == 200
        # The routing headers and the secret never reach instance code.
        assert a.json() == {"ns": "/echo", "id": "a", "gen": 7, "headers": ["x-client"]}
        assert rt.cluster_token == "tok"
    run(go())


def test_inactive_instance_is_refused_in_band(run) -> None:
    async def go() -> None:
        rt = secured({"/echo": Host(new=Echo)})
        await rt.Describe(pb.DescribeRequest(socket_secret="s"), Ctx())
        a = await request(rt, "GET", "/who", routed("/echo", "nobody", "s"))
        assert a.status == 503
        assert a.headers["x-pinned-refusal"] == "inactive"
        assert a.headers["retry-after"] == "1"
    run(go())


def test_describe_names_hosts_and_socket(run) -> None:
    async def go() -> None:
        rt = secured({"/b": Host(new=Echo, detached_timeout=2.5), "/a": Host(new=Echo, keep_placement_on_idle=True)})
        d = await rt.Describe(pb.DescribeRequest(socket_secret="s"), Ctx())
        assert [(h.namespace, h.detached_timeout_ms, h.release_placement_on_idle) for h in d.hosts] == \
            [("/a", 0, False), ("/b", 2500, True)]
        assert d.data_socket == "/nonexistent.sock"
        assert d.sdk_version.startswith("python-")
    run(go())


def test_lifecycle_hooks_routing_and_errors(run) -> None:
    async def go() -> None:
        apps: list[Echo] = []

        def new(inst: Instance) -> Echo:
            apps.append(Echo(inst))
            return apps[-1]

        rt = secured({"/echo": Host(new=new)})
        await rt.Describe(pb.DescribeRequest(socket_secret="s"), Ctx())
        await rt.Activate(pb.ActivateRequest(namespace="/echo", id="a", generation=1), Ctx())
        await rt.Activate(pb.ActivateRequest(namespace="/echo", id="a", generation=1), Ctx())
        assert len(apps) == 1, "activating a live instance again must do nothing"
        assert apps[0].events == ["start"]
        assert (await request(rt, "GET", "/nope", routed("/echo", "a", "s"))).status == 404
        a = await request(rt, "POST", "/who", routed("/echo", "a", "s"))
        assert a.status == 405 and a.headers["allow"] == "GET"
        a = await request(rt, "POST", "/boom", routed("/echo", "a", "s"))
        assert a.status == 500 and a.json() == {"error": "internal error"}
        stats = await rt.Stats(pb.StatsRequest(), Ctx())
        assert [(i.namespace, i.id, i.generation) for i in stats.instances] == [("/echo", "a", 1)]
        r = await rt.Deactivate(pb.DeactivateRequest(namespace="/echo", id="a", reason=pb.REASON_OPERATOR), Ctx())
        assert r.abandoned_tasks == 0 and not r.kept
        assert apps[0].events == ["start", "stop"]
        assert (await request(rt, "GET", "/who", routed("/echo", "a", "s"))).status == 503
    run(go())


def test_unknown_namespace_fails_activation(run) -> None:
    async def go() -> None:
        rt = secured({"/echo": Host(new=Echo)})
        try:
            await rt.Activate(pb.ActivateRequest(namespace="/other", id="a", generation=1), Ctx())
        except RuntimeError as e:
            assert "NOT_FOUND" in str(e)
        else:
            raise AssertionError("activation of an unknown namespace succeeded")
    run(go())


def test_idle_hook_keeps_and_tracked_tasks_get_grace(run) -> None:
    class Worker(Handlers):
        def __init__(self, inst: Instance) -> None:
            self.inst = inst
            self.keep = True
            self.saw_cancel = False

        async def idle(self) -> bool:
            return self.keep

        async def start(self) -> None:
            async def polite() -> None:
                await self.inst.wait_cancelled()
                self.saw_cancel = True

            async def stubborn() -> None:
                await asyncio.sleep(3600)

            self.inst.spawn("polite", polite)
            self.inst.spawn("stubborn", stubborn)

    async def go() -> None:
        apps: list[Worker] = []
        rt = secured({"/w": Host(new=lambda i: apps.append(Worker(i)) or apps[-1])})
        await rt.Activate(pb.ActivateRequest(namespace="/w", id="a", generation=1), Ctx())
        inst = rt.instances[("/w", "a")].inst
        assert inst.tasks == 2
        r = await rt.Deactivate(pb.DeactivateRequest(namespace="/w", id="a", reason=pb.REASON_IDLE), Ctx())
        assert r.kept
        r = await rt.Deactivate(pb.DeactivateRequest(namespace="/w", id="a", reason=pb.REASON_DRAIN, only_if_idle=True), Ctx())
        assert r.kept, "an instance with tracked work is kept when only_if_idle"
        t0 = time.monotonic()
        r = await rt.Deactivate(pb.DeactivateRequest(namespace="/w", id="a", reason=pb.REASON_DRAIN, grace_ms=200), Ctx())
        assert not r.kept and r.abandoned_tasks == 1
        assert 0.15 < time.monotonic() - t0 < 2
        assert apps[0].saw_cancel and inst.cancelled
        await asyncio.sleep(0)
        assert inst.tasks == 0, "an abandoned task is cancelled"
        assert inst.spawn("late", asyncio.sleep, ) is None
    run(go())


def test_wind_down_checkpoint_and_evict_me(run) -> None:
    class Long(Handlers):
        def __init__(self, inst: Instance) -> None:
            self.inst = inst
            self.step = asyncio.Event()
            self.stopped_at_checkpoint = False

        async def start(self) -> None:
            async def work() -> None:
                try:
                    while True:
                        await self.step.wait()
                        self.step.clear()
                        self.inst.eviction_checkpoint()
                except WindingDown:
                    self.stopped_at_checkpoint = True

            self.inst.spawn("work", work)

    async def go() -> None:
        apps: list[Long] = []
        rt = secured({"/l": Host(new=lambda i: apps.append(Long(i)) or apps[-1])})
        await rt.Activate(pb.ActivateRequest(namespace="/l", id="a", generation=1), Ctx())
        events = rt.Events(pb.EventsRequest(), Ctx())
        assert (await events.__anext__()).kind == pb.EVENT_KIND_READY
        deadline = int(time.time() * 1000) + 60_000
        await rt.WindDown(pb.WindDownRequest(namespace="/l", id="a", deadline_unix_ms=deadline), Ctx())
        inst = rt.instances[("/l", "a")].inst
        assert inst.winding_down == deadline / 1000
        assert rt.events.empty(), "tracked work still runs: no EVICT_ME yet"
        apps[0].step.set()
        ev = await asyncio.wait_for(events.__anext__(), 5)
        assert (ev.kind, ev.namespace, ev.id) == (pb.EVENT_KIND_EVICT_ME, "/l", "a")
        assert apps[0].stopped_at_checkpoint
    run(go())


def test_trays_fields_and_work_items(run) -> None:
    runs: list[tuple[list[Any], bool]] = []
    fail_first = [True]

    async def handle(r: Run) -> None:
        runs.append(([i.payload for i in r.items], r.resume))
        await r.applied()
        if fail_first[0]:
            fail_first[0] = False
            raise RuntimeError("left for redelivery")

    class T(Handlers):
        def __init__(self, inst: Instance) -> None:
            self.inst = inst

    async def go() -> None:
        rt = secured({"/t": Host(new=T, trays={"jobs": handle})})
        inst = await rt.activate("/t", "a", 1)
        tr = inst.tray("notes", "n1")
        assert tr.get("x", 5) == 5
        tr.set("x", {"a": [1, 2]})
        assert tr.get("x") == {"a": [1, 2]} and tr.fields() == ["x"]
        tr.delete("x")
        assert tr.get("x") is None
        jobs = inst.tray("jobs", "j")
        seqs = await jobs.append({"n": 1}, {"n": 2})
        assert seqs == [1, 2]
        for _ in range(100):
            await asyncio.sleep(0.01)
            if runs:
                break
        assert runs == [([{"n": 1}, {"n": 2}], False)]
        # The failed run left the items, now applied: the next delivery
        # resumes them, and settles them.
        assert [i.applied for i in jobs.items()] == [True, True]
        inst.state.redeliver()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not jobs.marked:
                break
        assert runs[1] == ([{"n": 1}, {"n": 2}], True)
        assert not jobs.marked and inst.trays() == []
        await inst.durable()
    run(go())


def test_invalid_writes_fail_at_once(run) -> None:
    from pinnedd_sdk import InvalidWrite

    async def go() -> None:
        rt = secured({"/t": Host(new=lambda i: Handlers())})
        inst = await rt.activate("/t", "a", 1)
        for bad in (lambda: inst.tray("", "x").set("f", 1), lambda: inst.tray("n", "x").set("", 1),
                    lambda: inst.tray("n", "x").set("f\x00", 1), lambda: inst.tray("n", "x").set("f", "v" * (1 << 20))):
            try:
                bad()
            except InvalidWrite:
                pass
            else:
                raise AssertionError("an invalid write was queued")
        assert inst.state.queued == 0
    run(go())


def test_instance_logs_carry_its_name_and_the_call_fields(capsys: Any) -> None:
    import json
    import logging
    import sys

    from pinnedd_sdk.plugin import JSONFormatter

    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JSONFormatter())
    log = logging.getLogger("test-instance-logs")
    log.handlers[:] = [h]
    log.propagate = False

    async def go() -> None:
        rt = secured({"/t": Host(new=lambda i: Handlers())})
        rt.logger = log
        inst = await rt.activate("/t", "a", 1)
        inst.logger.warning("careful", extra={"err": "x"})
    run_ = asyncio.run
    run_(go())
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line == {"level": "WARN", "msg": "careful", "instance": "/t/a", "err": "x"}
