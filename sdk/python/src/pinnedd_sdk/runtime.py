"""The plugin side of protocol 3: the hosts and their live instances, the
Control service, the broker stream that leads to pinnedd's Store service,
and the data socket's ASGI entry (secret check, routing, output gate)."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, cast

import grpc

from ._proto import goplugin_pb2, goplugin_pb2_grpc, health_pb2, health_pb2_grpc
from ._proto import pinned_pb2 as pb
from ._proto import pinned_pb2_grpc as pbg
from .cluster import ClusterClient
from .handlers import ASGIApp, Message, Receive, Scope, Send
from .instance import Instance
from .state import Fenced, State, StateError, TrayHandler

VERSION = "0.1.0"

HEADER_NAMESPACE = b"x-pinned-namespace"
HEADER_ID = b"x-pinned-id"
HEADER_SECRET = b"x-pinned-socket-secret"
HEADER_REFUSAL = "x-pinned-refusal"

# How long a stopping instance waits for its writes to be stored.
FRONTIER_WAIT = 10.0
# Load answers may be large (an instance's whole state); Commits up to the
# store's limit plus framing (plugins/store.go).
STORE_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 2**31 - 1),
                         ("grpc.max_send_message_length", (16 << 20) + (4 << 20))]


@dataclass
class Host:
    """Builds the instances of one namespace.

    new(inst) returns the instance's ASGI app (a Handlers object, a
    Starlette app, any ASGI callable), or an awaitable of one. The app may
    have the lifecycle hooks as methods, each optional and async:
    start() before the first request, idle() -> bool before an idle
    eviction (True keeps it), wind_down(deadline) when told of an eviction
    deadline, stop() last.
    """

    new: Callable[[Instance], ASGIApp | Awaitable[ASGIApp]]
    # Seconds an instance with no open request stays resident; 0 leaves
    # pinnedd's default.
    detached_timeout: float = 0
    keep_placement_on_idle: bool = False
    # Tray namespace -> the handler that runs its work items.
    trays: dict[str, TrayHandler] = field(default_factory=dict)


@dataclass
class _Live:
    inst: Instance
    app: ASGIApp


async def _hook(inst: Instance, app: Any, name: str, *args: Any) -> Any:
    fn = getattr(app, name, None)
    if fn is None:
        return None
    out = fn(*args)
    if inspect.isawaitable(out):
        out = await out
    return out


class Runtime(pbg.ControlServicer):
    """Serves the Control service and the data socket for hosts."""

    def __init__(self, hosts: dict[str, Host], logger: logging.Logger | None = None) -> None:
        if not hosts:
            raise ValueError("no hosts")
        for ns, h in hosts.items():
            if not ns.startswith("/") or len(ns) < 2 or "/" in ns[1:]:
                raise ValueError(f"namespace {ns!r}: want /name")
        self.hosts = hosts
        self.logger = logger or logging.getLogger("pinnedd")
        self.instances: dict[tuple[str, str], _Live] = {}
        self.socket = ""
        # secured: the data socket is reachable by other local processes, so
        # every request must carry the secret; until Describe brings it,
        # nothing is admitted.
        self.secured = False
        self.socket_secret = ""
        self.cluster_token = ""
        self.store: pbg.StoreStub | None = None
        self.store_channel: grpc.aio.Channel | None = None
        self.events: asyncio.Queue[pb.Event] = asyncio.Queue(maxsize=1024)
        self.broker = Broker()
        # TLS material for dialing the broker's services (set by serve()).
        self.tls: tuple[bytes, bytes, bytes] | None = None  # (our cert, our key, pinnedd's cert)
        self.shutdown_requested = asyncio.Event()

    # -- the data socket ---------------------------------------------------

    def _admit(self, scope: Scope) -> bool:
        got = [v for k, v in scope.get("headers", []) if k == HEADER_SECRET]
        if not self.secured:
            return True
        want = self.socket_secret.encode()
        return bool(want) and len(got) == 1 and hmac.compare_digest(got[0], want)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            return
        if scope["type"] not in ("http", "websocket"):
            return
        ok = self._admit(scope)
        ns = id_ = ""
        headers = []
        for k, v in scope.get("headers", []):
            # Pinnedd's routing headers and the secret never reach
            # instance code.
            if k == HEADER_NAMESPACE:
                ns = v.decode("utf-8", "replace")
            elif k == HEADER_ID:
                id_ = v.decode("utf-8", "replace")
            elif k != HEADER_SECRET:
                headers.append((k, v))
        if not ok:
            await _plain(scope, send, 403, b'{"error":"not from pinnedd: missing or wrong X-Pinned-Socket-Secret"}\n')
            return
        live = self.instances.get((ns, id_))
        if live is None:
            await _plain(scope, send, 503, b'{"error":"instance not active"}\n',
                         [(HEADER_REFUSAL.encode(), b"inactive"), (b"retry-after", b"1")])
            return
        scope = dict(scope, headers=headers)
        await _serve_gated(live, scope, receive, send)

    # -- Control -------------------------------------------------------------

    async def Describe(self, request: pb.DescribeRequest, context: Any) -> pb.DescribeResponse:
        if request.store_broker_id and self.store is None:
            info = await self.broker.wait(request.store_broker_id, timeout=5.0)
            if info is None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"no broker address for store {request.store_broker_id}")
                raise RuntimeError("unreachable: abort raises")
            self.store_channel = self._dial(info)
            self.store = pbg.StoreStub(self.store_channel)  # type: ignore[no-untyped-call]
        # The first Describe's secrets hold for the life of the process:
        # pinnedd describes each process once, so a later one is not its.
        if request.socket_secret and not self.socket_secret:
            self.socket_secret = request.socket_secret
        if request.cluster_call_token and not self.cluster_token:
            self.cluster_token = request.cluster_call_token
        resp = pb.DescribeResponse(data_socket=self.socket, sdk_version=f"python-{VERSION}", pid=os.getpid())
        for ns in sorted(self.hosts):
            h = self.hosts[ns]
            resp.hosts.append(pb.HostInfo(namespace=ns, detached_timeout_ms=int(h.detached_timeout * 1000),
                                          release_placement_on_idle=not h.keep_placement_on_idle))
        return resp

    def _dial(self, info: goplugin_pb2.ConnInfo) -> grpc.aio.Channel:
        if info.network != "unix":
            target = info.address
        else:
            target = "unix:" + info.address
        if self.tls is None:
            return grpc.aio.insecure_channel(target, options=STORE_CHANNEL_OPTIONS)
        cert, key, peer = self.tls
        creds = grpc.ssl_channel_credentials(root_certificates=peer, private_key=key, certificate_chain=cert)
        # go-plugin's certificates name localhost.
        return grpc.aio.secure_channel(target, creds, options=STORE_CHANNEL_OPTIONS + [
            ("grpc.ssl_target_name_override", "localhost"), ("grpc.default_authority", "localhost")])

    async def Activate(self, request: pb.ActivateRequest, context: Any) -> pb.ActivateResponse:
        try:
            await self.activate(request.namespace, request.id, request.generation)
        except KeyError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except Fenced as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"activate {request.namespace}/{request.id}: fenced: {e}")
        except grpc.aio.AioRpcError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"activate {request.namespace}/{request.id}: load state: {e.details()}")
        except Exception as e:  # host code failed
            self.logger.exception("activation failed", extra={"instance": f"{request.namespace}/{request.id}"})
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"activate {request.namespace}/{request.id}: {e}")
        return pb.ActivateResponse()

    async def activate(self, ns: str, id_: str, generation: int) -> Instance:
        """Builds, loads and starts an instance; a live one is kept."""
        host = self.hosts.get(ns)
        if host is None:
            raise KeyError(f"unknown namespace {ns!r}")
        k = (ns, id_)
        if k in self.instances:
            return self.instances[k].inst
        inst = Instance(ns, id_, generation, self.logger)
        inst._on_evict_me = lambda: self._emit(pb.EVENT_KIND_EVICT_ME, inst)
        inst._on_fenced = lambda: asyncio.get_running_loop().create_task(self._drop(inst, fenced=True))
        inst._on_reset = lambda: asyncio.get_running_loop().create_task(self._drop(inst, fenced=False))
        inst._cluster = ClusterClient(ns, lambda: self.cluster_token)
        loaded: list[pb.TrayData] = []
        if self.store is not None:
            try:
                # Load fences the predecessor: from here on its writes fail.
                resp = await self.store.Load(pb.StoreLoadRequest(namespace=ns, id=id_, generation=generation))
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.ABORTED:
                    raise Fenced(e.details() or "fenced") from e
                raise
            loaded = list(resp.trays)
        inst.state = State(inst, self.store, host.trays, loaded)
        try:
            built = host.new(inst)
            app = cast(ASGIApp, await built if inspect.isawaitable(built) else built)
            await _hook(inst, app, "start")
        except BaseException:
            await inst._stop_tasks(1.0)
            raise
        if k in self.instances:  # a concurrent activation won
            await self._stop(_Live(inst, app), 1.0)
            return self.instances[k].inst
        self.instances[k] = _Live(inst, app)
        inst.state.redeliver()
        self.logger.debug("instance activated", extra={"instance": f"{ns}/{id_}", "generation": generation})
        return inst

    def _emit(self, kind: int, inst: Instance) -> None:
        try:
            self.events.put_nowait(pb.Event(kind=kind, namespace=inst.namespace, id=inst.id))  # type: ignore[arg-type]
        except asyncio.QueueFull:
            inst.logger.warning("event queue full; event dropped")

    async def _drop(self, inst: Instance, fenced: bool) -> None:
        """Takes an instance whose commit failed out of service. A fenced
        one is reported (pinnedd keeps the placement off this node); a
        reset one is simply gone: its next request is refused in-band as
        inactive, and pinnedd activates it afresh from the store."""
        live = self.instances.get((inst.namespace, inst.id))
        if live is None or live.inst is not inst:
            return
        del self.instances[(inst.namespace, inst.id)]
        await self._stop(live, 5.0)
        if fenced:
            self._emit(pb.EVENT_KIND_FENCED, inst)
        else:
            inst.logger.info("instance reset after a failed commit; its next request activates it from the store")

    async def _stop(self, live: _Live, grace: float) -> int:
        """Cancels the instance, gives its tasks grace, runs the stop hook,
        then waits for its writes, so the placement is released only once
        everything it wrote is stored."""
        abandoned = await live.inst._stop_tasks(grace)
        try:
            await _hook(live.inst, live.app, "stop")
        except Exception:
            live.inst.logger.exception("stop hook failed")
        try:
            await asyncio.wait_for(live.inst.state.durable(), timeout=max(grace, FRONTIER_WAIT))
        except StateError:
            pass  # logged when it happened
        except asyncio.TimeoutError:
            live.inst.logger.error("instance stopped before its writes were durable")
        return abandoned

    async def Deactivate(self, request: pb.DeactivateRequest, context: Any) -> pb.DeactivateResponse:
        k = (request.namespace, request.id)
        live = self.instances.get(k)
        if live is None:
            return pb.DeactivateResponse()
        if request.only_if_idle and live.inst.tasks > 0:
            return pb.DeactivateResponse(kept=True)
        if request.reason == pb.REASON_IDLE:
            try:
                if await _hook(live.inst, live.app, "idle"):
                    return pb.DeactivateResponse(kept=True)
            except Exception:
                live.inst.logger.exception("idle hook failed")
        if self.instances.get(k) is not live:  # a concurrent deactivation won
            return pb.DeactivateResponse()
        del self.instances[k]
        abandoned = await self._stop(live, request.grace_ms / 1000)
        live.inst.logger.debug("instance deactivated", extra={"reason": pb.Reason.Name(request.reason),
                                                              "abandoned_tasks": abandoned})
        return pb.DeactivateResponse(abandoned_tasks=abandoned)

    async def WindDown(self, request: pb.WindDownRequest, context: Any) -> pb.WindDownResponse:
        live = self.instances.get((request.namespace, request.id))
        if live is None:
            return pb.WindDownResponse()
        live.inst._wind_down_ms = request.deadline_unix_ms
        if request.deadline_unix_ms:
            try:
                await _hook(live.inst, live.app, "wind_down", request.deadline_unix_ms / 1000)
            except Exception:
                live.inst.logger.exception("wind_down hook failed")
            if live.inst.tasks == 0:
                live.inst.request_eviction()
        return pb.WindDownResponse()

    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        resp = pb.StatsResponse()
        for (ns, id_), live in sorted(self.instances.items()):
            resp.instances.append(pb.InstanceStats(namespace=ns, id=id_, generation=live.inst.generation,
                                                   tasks=live.inst.tasks,
                                                   activated_at_ms=int(live.inst.activated_at * 1000)))
        return resp

    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        return pb.HealthResponse(serving=True)

    async def Shutdown(self, request: pb.ShutdownRequest, context: Any) -> pb.ShutdownResponse:
        await self.deactivate_all(request.grace_ms / 1000)
        return pb.ShutdownResponse()

    async def deactivate_all(self, grace: float) -> None:
        lives = list(self.instances.values())
        self.instances.clear()
        await asyncio.gather(*(self._stop(lv, grace) for lv in lives))

    async def Events(self, request: pb.EventsRequest, context: Any) -> AsyncIterator[pb.Event]:
        yield pb.Event(kind=pb.EVENT_KIND_READY)
        while True:
            yield await self.events.get()


class Broker(goplugin_pb2_grpc.GRPCBrokerServicer):
    """go-plugin's broker, plugin side: pinnedd announces on StartStream
    the address of each service it serves for this plugin (the Store)."""

    def __init__(self) -> None:
        self._offers: dict[int, goplugin_pb2.ConnInfo] = {}
        self._changed = asyncio.Condition()

    async def StartStream(self, request_iterator: AsyncIterator[goplugin_pb2.ConnInfo], context: Any) -> None:
        async for info in request_iterator:
            async with self._changed:
                self._offers[info.service_id] = info
                self._changed.notify_all()

    async def wait(self, service_id: int, timeout: float) -> goplugin_pb2.ConnInfo | None:
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(lambda: service_id in self._offers), timeout)
        except asyncio.TimeoutError:
            return None
        return self._offers[service_id]


class Controller(goplugin_pb2_grpc.GRPCControllerServicer):
    """go-plugin's controller: Shutdown is pinnedd's last word; exit."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    async def Shutdown(self, request: goplugin_pb2.Empty, context: Any) -> goplugin_pb2.Empty:
        self._rt.shutdown_requested.set()
        return goplugin_pb2.Empty()


class HealthServicer(health_pb2_grpc.HealthServicer):
    """gRPC health: go-plugin checks the service "plugin"."""

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def _plain(scope: Scope, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008 if status == 403 else 1013})
        return
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())] + (extra or [])})
    await send({"type": "http.response.body", "body": body})


class _Cut(Exception):
    """The response started and a write it follows failed: the connection
    must end so the client never takes a part for the whole."""


async def _serve_gated(live: _Live, scope: Scope, receive: Receive, send: Send) -> None:
    """Runs the instance's app behind its output gate: each message it
    sends leaves only once every write queued before it is stored. A
    failed write turns an answer not yet started into 504 (503 when fenced)
    and cuts one that has."""
    st = live.inst.state
    started = False
    replaced = False

    async def gated(msg: Message) -> None:
        nonlocal started, replaced
        if replaced:
            return
        target = st.queued
        if st.done < target or st.err is not None:
            try:
                await st.durable_up_to(target)
            except StateError as e:
                if started or scope["type"] == "websocket":
                    raise _Cut() from e
                replaced = True
                if isinstance(e, Fenced):
                    await _plain(scope, send, 503, b'{"error":"fenced: the instance moved; retry"}\n', [(b"retry-after", b"1")])
                else:
                    await _plain(scope, send, 504, b'{"error":"outcome unknown: the state write failed"}\n')
                return
        if msg["type"] == "http.response.start":
            started = True
        elif msg["type"] == "websocket.accept":
            started = True
        await send(msg)

    try:
        await live.app(scope, receive, gated)
    except _Cut:
        raise
    except Exception:
        live.inst.logger.exception("handler failed")
        if started:
            raise  # the server ends the connection
        if not replaced:
            await _plain(scope, send, 500, b'{"error":"internal error"}\n')


def now_ms() -> int:
    return int(time.time() * 1000)
