"""Statewire's server side for Python hosts (statewire/PROTOCOL.md in the
pinnedd repository): an instance keeps one JSON document that clients
mirror from ``POST <instance>/stream`` and change by commands they send to
``POST <instance>/frames``, admitted durably (the tray
("client_commands", <clientId>)) and executed by the host's run.

    sw = Statewire(inst, initial={...}, commands={"send": Command(validate, run=True)}, run=my_run)
    return sw          # the instance's ASGI app

    Host(new=..., trays=statewire_trays())
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from .handlers import Receive, Request, Response, Scope, Send
from .instance import Instance
from .state import Run, StateError, TrayHandler

POOL = "client_commands"
MAX_SEQ = 2**53 - 1
MAX_FRAMES = 64
MAX_BODY = 256 << 10
MAX_STREAM_BODY = 4 << 10
KEEPALIVE = 15.0
# How long an instance remembers a client's dedup mark after its last
# admission (the Go server's DefaultDedupWindow): then, with nothing of the
# client's pending, its tray is deleted and its seqs may start over.
DEDUP_WINDOW = 7 * 24 * 3600.0
STREAM_BUFFER = 4096
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

Path = list[str | int]


class OpError(ValueError):
    """An op that does not apply."""


def _walk_create(doc: Any, path: Path) -> tuple[Any, str | int]:
    """The parent of path's last element, creating missing (or null)
    object members on the way as objects; returns (parent, key)."""
    if not path:
        raise OpError("empty path")
    cur = doc
    for i, k in enumerate(path[:-1]):
        nxt = _child(cur, k, missing_ok=True)
        if nxt is None:
            if not all(isinstance(x, str) for x in path[i:]):
                raise OpError("set never creates an array")
            if not isinstance(cur, dict) or not isinstance(k, str):
                raise OpError(f"cannot create {k!r}")
            cur[k] = {}
            nxt = cur[k]
        cur = nxt
    return cur, path[-1]


def _child(cur: Any, k: str | int, missing_ok: bool) -> Any:
    if isinstance(cur, dict):
        if not isinstance(k, str):
            raise OpError("an integer element on an object")
        v = cur.get(k)
        if v is None and not missing_ok and k not in cur:
            raise OpError(f"no member {k!r}")
        return v
    if isinstance(cur, list):
        if isinstance(k, bool) or not isinstance(k, int):
            raise OpError("a string element on an array")
        if k < 0 or k >= len(cur):
            if missing_ok:
                raise OpError(f"index {k} past the end")
            raise OpError(f"index {k} past the end")
        return cur[k]
    raise OpError("path through a value that is neither object nor array")


def _check_path(p: Any) -> Path:
    if not isinstance(p, list) or not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool) and x >= 0) for x in p):
        raise OpError("bad path")
    return p


def apply_op(doc: Any, op: dict[str, Any]) -> Any:
    """Applies one op to doc (changing it in place where it can) and
    returns the document after it. Raises OpError when it does not apply."""
    kind = op.get("op")
    if "path" not in op:
        raise OpError("missing path")
    path = _check_path(op["path"])
    if kind == "set":
        if "value" not in op:
            raise OpError("missing value")
        value = op["value"]
        if not path:
            return value
        parent, k = _walk_create(doc, path)
        if isinstance(parent, dict) and isinstance(k, str):
            parent[k] = value
        elif isinstance(parent, list) and isinstance(k, int) and not isinstance(k, bool):
            if k < len(parent):
                parent[k] = value
            elif k == len(parent):
                parent.append(value)
            else:
                raise OpError(f"index {k} past the end")
        else:
            raise OpError("element does not fit its parent")
        return doc
    if kind == "delete":
        if not path:
            raise OpError("delete of the whole document")
        parent = doc
        for k in path[:-1]:
            parent = _child(parent, k, missing_ok=False)
        k = path[-1]
        if isinstance(parent, dict) and isinstance(k, str):
            parent.pop(k, None)
        elif isinstance(parent, list) and isinstance(k, int) and not isinstance(k, bool):
            if k >= len(parent):
                raise OpError(f"index {k} past the end")
            del parent[k]
        else:
            raise OpError("element does not fit its parent")
        return doc
    if kind == "append":
        text = op.get("text")
        if not isinstance(text, str):
            raise OpError("append needs a string text")
        if not path:
            if doc is None:
                return text
            if not isinstance(doc, str):
                raise OpError("append to a value that is not a string")
            return doc + text
        parent, k = _walk_create(doc, path)
        if isinstance(parent, dict) and isinstance(k, str):
            cur = parent.get(k)
            if cur is not None and not isinstance(cur, str):
                raise OpError("append to a value that is not a string")
            parent[k] = (cur or "") + text
        elif isinstance(parent, list) and isinstance(k, int) and not isinstance(k, bool):
            if k >= len(parent):
                raise OpError(f"index {k} past the end")
            cur = parent[k]
            if cur is not None and not isinstance(cur, str):
                raise OpError("append to a value that is not a string")
            parent[k] = (cur or "") + text
        else:
            raise OpError("element does not fit its parent")
        return doc
    raise OpError(f"unknown op {kind!r}")


def apply_ops(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Applies ops as one frame: all of them, or raises and leaves doc
    unchanged (they run on a copy)."""
    out = json.loads(json.dumps(doc))
    for op in ops:
        out = apply_op(out, op)
    return out


class Document:
    """The instance's document. Every change is one ops frame to every
    stream; several changes made in one ``batch()`` are one frame."""

    def __init__(self, initial: Any) -> None:
        self.epoch = secrets.token_hex(8)
        self.version = 0
        self._doc: Any = json.loads(json.dumps(initial))
        self._streams: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._pending: list[dict[str, Any]] | None = None

    def get(self, path: Sequence[str | int], default: Any = None) -> Any:
        """A copy of the value at path, or default."""
        cur = self._doc
        for k in path:
            try:
                cur = _child(cur, k, missing_ok=False)
            except OpError:
                return default
            if cur is None:
                return default
        return json.loads(json.dumps(cur))

    def has(self, path: Sequence[str | int]) -> bool:
        return self.get(path) is not None

    def set(self, path: Sequence[str | int], value: Any) -> None:
        self.apply([{"op": "set", "path": list(path), "value": value}])

    def delete(self, path: Sequence[str | int]) -> None:
        self.apply([{"op": "delete", "path": list(path)}])

    def append_text(self, path: Sequence[str | int], text: str) -> None:
        self.apply([{"op": "append", "path": list(path), "text": text}])

    def apply(self, ops: list[dict[str, Any]]) -> None:
        """Applies ops (all or none: OpError) and publishes them."""
        self._doc = apply_ops(self._doc, ops)
        if self._pending is not None:
            self._pending.extend(ops)
            return
        self._publish(ops)

    def batch(self) -> "_Batch":
        """``with doc.batch(): ...``: the changes made inside are one frame."""
        return _Batch(self)

    def _publish(self, ops: list[dict[str, Any]]) -> None:
        if not ops:
            return
        self.version += 1
        frame = {"type": "ops", "version": self.version, "ops": ops}
        for q in list(self._streams):
            if q.qsize() >= STREAM_BUFFER:
                # The instance never waits for a slow reader.
                self._streams.discard(q)
                q.put_nowait({"type": "fin", "code": "lagging", "reconnect": True})
                q.put_nowait(None)
            else:
                q.put_nowait(frame)

    def _subscribe(self) -> tuple[dict[str, Any], asyncio.Queue[dict[str, Any] | None]]:
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._streams.add(q)
        snap = {"type": "snapshot", "epoch": self.epoch, "version": self.version, "state": json.loads(json.dumps(self._doc))}
        return snap, q


class _Batch:
    def __init__(self, doc: Document) -> None:
        self._d = doc
        self._saved: Any = None

    def __enter__(self) -> Document:
        self._saved = json.loads(json.dumps(self._d._doc))
        self._d._pending = []
        return self._d

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ops, self._d._pending = self._d._pending or [], None
        if exc_type is not None:
            self._d._doc = self._saved  # all or none
            return
        self._d._publish(ops)


@dataclass(frozen=True)
class Command:
    """One admitted frame: its client, seq, type and the frame itself."""

    client_id: str
    seq: int
    type: str
    frame: dict[str, Any]


@dataclass
class CommandSpec:
    """A command the host declares. validate(frame) raises ValueError for
    a frame to refuse (400). run=True: its frames go to the host's run, in
    batches."""

    validate: Callable[[dict[str, Any]], None] | None = None
    run: bool = False


class AdmitError(Exception):
    """Raised by a host's admit: the frames are refused given the
    instance's state (409), and nothing is admitted."""


class RunContext:
    """One batch of run commands, delivered to the host's run."""

    def __init__(self, run: Run, commands: list[Command], stop: asyncio.Event) -> None:
        self._run = run
        self.commands = commands
        # The batch was declared applied before a crash: redelivered.
        self.resume = run.resume
        self._stop = stop

    async def applied(self) -> None:
        """Declares the batch applied, durably (see Run.applied)."""
        await self._run.applied()

    @property
    def stop_requested(self) -> bool:
        """A cancel of the batch's client arrived."""
        return self._stop.is_set()

    async def wait_stop(self) -> None:
        await self._stop.wait()


RunFn = Callable[[RunContext], Awaitable[None]]
AdmitFn = Callable[[list[Command]], None]


@dataclass
class _Active:
    client_id: str
    max_seq: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class Statewire:
    """The Statewire server of one instance: its ASGI app."""

    def __init__(self, inst: Instance, initial: Any, commands: dict[str, CommandSpec], run: RunFn | None = None,
                 admit: AdmitFn | None = None, keepalive: float = KEEPALIVE,
                 other: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None,
                 dedup_window: float = DEDUP_WINDOW) -> None:
        if keepalive <= 0 or keepalive > KEEPALIVE:
            raise ValueError(f"keepalive must be in (0, {KEEPALIVE}] s")
        if dedup_window <= 0:
            raise ValueError("dedup_window must be positive")
        if "cancel" in commands:
            raise ValueError("cancel is Statewire's own command")
        if any(c.run for c in commands.values()) and run is None:
            raise ValueError("run commands need a run")
        self.inst = inst
        self.doc = Document(initial)
        self.commands = commands
        self._run = run
        self._admit = admit
        self._keepalive = keepalive
        self._other = other
        self._admission = asyncio.Lock()
        self._turn = asyncio.Lock()
        self._active: list[_Active] = []
        self._dedup_window = dedup_window
        self._forgetter: asyncio.Task[None] | None = None
        inst.attached[_KEY] = self

    def pending(self) -> list[Command]:
        """Admitted commands not yet settled, of every client (a previous
        activation's included), by client then seq."""
        out: list[Command] = []
        for ns, cid in self.inst.trays(POOL):
            out.extend(_command(cid, it.payload) for it in self.inst.tray(ns, cid).items())
        return out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._forgetter is None:
            # Untracked: it must neither keep the instance resident nor
            # hold a wind-down; it ends with the instance.
            self._forgetter = asyncio.get_running_loop().create_task(self._forget_idle_clients(), name="statewire-forget")
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ("/stream", "/frames"):
            req = Request(scope, receive)
            if scope["path"] == "/stream":
                await self._stream(req, send)
            else:
                await (await self._frames(req)).send(send)
            return
        if self._other is not None:
            await self._other(scope, receive, send)
            return
        await Response({"error": "not found: Statewire serves POST /stream and POST /frames"}, 404).send(send)

    # -- forgetting clients ------------------------------------------------

    async def _forget_idle_clients(self) -> None:
        """Now and then while the instance lives, forget_clients: a
        long-lived instance forgets the clients that left, one activated
        again those that left while it slept."""
        every = min(self._dedup_window / 2, 3600.0)
        while not self.inst.cancelled:
            try:
                await self.forget_clients(time.time())
            except StateError as e:
                self.inst.logger.warning("forgetting idle Statewire clients failed", extra={"err": str(e)})
            try:
                await asyncio.wait_for(self.inst.wait_cancelled(), every)
            except asyncio.TimeoutError:
                pass

    async def forget_clients(self, now: float) -> int:
        """Deletes the tray of each client with nothing pending or running
        whose last admission is older than the dedup window, and returns
        how many; a tray without a time (written before there was one)
        gets now, its window starting here. Admissions wait meanwhile, so
        the next one of a forgotten client starts from seq 1."""
        forgotten = 0
        async with self._admission:
            for ns, cid in self.inst.trays(POOL):
                tray = self.inst.tray(ns, cid)
                if tray.items() or any(a.client_id == cid for a in self._active):
                    continue
                at = tray.get("admittedAt")
                if at is None:
                    tray.set("admittedAt", int(now * 1000))
                elif now * 1000 - int(at) >= self._dedup_window * 1000:
                    for name in tray.fields():
                        tray.delete(name)
                    forgotten += 1
        return forgotten

    # -- stream ------------------------------------------------------------

    async def _stream(self, req: Request, send: Send) -> None:
        body = await req.body()
        if len(body) > MAX_STREAM_BODY:
            await Response({"error": f"stream body over {MAX_STREAM_BODY} bytes"}, 400).send(send)
            return
        if body.strip():
            try:
                b = json.loads(body)
            except ValueError as e:
                await Response({"error": f"stream body: {e}"}, 400).send(send)
                return
            if not isinstance(b, dict) or set(b) - {"clientId"} or ("clientId" in b and not (
                    isinstance(b["clientId"], str) and _CLIENT_ID.match(b["clientId"]))):
                await Response({"error": 'stream body: want {"clientId": "..."} or nothing'}, 400).send(send)
                return
        snap, q = self.doc._subscribe()
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-store")]})
            await _line(send, snap)
            cancelled = asyncio.ensure_future(self.inst.wait_cancelled())
            try:
                while True:
                    get = asyncio.ensure_future(q.get())
                    done, _ = await asyncio.wait({get, cancelled}, timeout=self._keepalive,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if get not in done:
                        get.cancel()
                    if cancelled in done:
                        await _line(send, {"type": "fin", "code": "evicted", "reconnect": True})
                        break
                    if not done:
                        await _line(send, {"type": "keepalive"})
                        continue
                    frame = get.result()
                    if frame is None:
                        break
                    await _line(send, frame)
            finally:
                cancelled.cancel()
            await send({"type": "http.response.body", "body": b""})
        finally:
            self.doc._streams.discard(q)

    # -- frames ------------------------------------------------------------

    async def _frames(self, req: Request) -> Response:
        body = await req.body()
        if len(body) > MAX_BODY:
            return Response({"error": f"body over {MAX_BODY} bytes"}, 413)
        try:
            b = json.loads(body)
        except ValueError as e:
            return Response({"error": f"malformed JSON: {e}"}, 400)
        if not isinstance(b, dict):
            return Response({"error": 'want {"clientId": "...", "frames": [...]}'}, 400)
        if set(b) - {"clientId", "frames"}:
            return Response({"error": f"unknown field {sorted(set(b) - {'clientId', 'frames'})[0]!r}"}, 400)
        cid = b.get("clientId")
        if not isinstance(cid, str) or not _CLIENT_ID.match(cid):
            return Response({"error": "clientId must be 1-64 characters of A-Z a-z 0-9 . _ : -"}, 400)
        frames = b.get("frames")
        if not isinstance(frames, list) or not 1 <= len(frames) <= MAX_FRAMES:
            return Response({"error": f"frames must be an array of 1-{MAX_FRAMES} frames"}, 400)
        last = 0
        for i, f in enumerate(frames):
            if not isinstance(f, dict):
                return Response({"error": f"frame {i}: not an object"}, 400)
            seq = f.get("seq")
            if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ:
                return Response({"error": f"frame {i}: seq must be an integer from 1 to {MAX_SEQ}"}, 400)
            if seq <= last:
                return Response({"error": f"frame {i}: seqs must increase within a request"}, 400)
            last = seq
            t = f.get("type")
            if t != "cancel":
                spec = self.commands.get(t) if isinstance(t, str) else None
                if spec is None:
                    return Response({"error": f"frame {i}: unknown command type {t!r}"}, 400)
                if spec.validate is not None:
                    try:
                        spec.validate(f)
                    except ValueError as e:
                        return Response({"error": f"frame {i}: {e}"}, 400)
            elif set(f) - {"seq", "type"}:
                return Response({"error": f"frame {i}: cancel has only seq and type"}, 400)
            if len(json.dumps(f).encode()) > (1 << 20):
                return Response({"error": f"frame {i}: too large to store"}, 413)

        async with self._admission:
            tray = self.inst.tray(POOL, cid)
            mark = int(tray.get("admitted", 0))
            items = tray.items()
            if items:
                mark = max(mark, items[-1].payload.get("seq", 0))
            dups = [f for f in frames if f["seq"] <= mark]
            new = [f for f in frames if f["seq"] > mark]
            for i, f in enumerate(new):
                if f["seq"] != mark + 1 + i:
                    idx = frames.index(f)
                    return Response({"error": f"frame {idx}: seq {f['seq']} skips {mark + 1 + i}, the next seq of this client; "
                                              "nothing of the request was admitted", "expected": mark + 1 + i}, 409)
            cmds = [_command(cid, f) for f in new]
            if cmds and self._admit is not None:
                try:
                    self._admit(cmds)
                except AdmitError as e:
                    return Response({"error": str(e)}, 409)
            if new:
                try:
                    tray.set("admittedAt", int(time.time() * 1000))
                    await tray.append(*new)
                except StateError as e:
                    return Response({"error": f"state store unavailable: {e}"}, 503, {"retry-after": "1"})
                # A cancel stops its client's runs as soon as it is admitted.
                for c in cmds:
                    if c.type == "cancel":
                        for a in self._active:
                            if a.client_id == cid and a.max_seq < c.seq:
                                a.stop.set()
            acked = mark + len(new)
        return Response({"acked": acked, "admitted": len(new), "duplicates": len(dups)})

    # -- execution -----------------------------------------------------------

    async def _deliver(self, run: Run) -> None:
        """The command pool's handler: one client's pending frames."""
        cmds = [_command(run.tray.id, it.payload) for it in run.items]
        runs = [c for c in cmds if c.type != "cancel" and self.commands.get(c.type, CommandSpec()).run]
        if runs and self._run is not None:
            active = _Active(run.tray.id, runs[-1].seq)
            # A cancel queued behind run commands in the same batch stops it.
            if any(c.type == "cancel" and c.seq > active.max_seq for c in cmds):
                active.stop.set()
            self._active.append(active)
            try:
                async with self._turn:  # one batch runs at a time
                    await self._run(RunContext(run, runs, active.stop))
            finally:
                self._active.remove(active)
        # Settled by the SDK once this returns; the mark stays in the tray.
        run.tray.set("admitted", max(int(run.tray.get("admitted", 0)), cmds[-1].seq))


def _command(client_id: str, frame: dict[str, Any]) -> Command:
    return Command(client_id, int(frame["seq"]), str(frame["type"]), frame)


async def _line(send: Send, frame: dict[str, Any]) -> None:
    await send({"type": "http.response.body", "body": (json.dumps(frame, separators=(",", ":")) + "\n").encode(),
                "more_body": True})


_KEY = object()


async def _pool(run: Run) -> None:
    sw = run.instance.attached.get(_KEY)
    if not isinstance(sw, Statewire):
        raise RuntimeError("a command pool without a Statewire server on its instance")
    await sw._deliver(run)


def statewire_trays() -> dict[str, TrayHandler]:
    """The Host's trays entry for Statewire's command pools."""
    return {POOL: _pool}
