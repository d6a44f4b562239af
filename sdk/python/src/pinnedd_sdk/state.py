"""Durable state: trays with persistent fields and work items, written
through to pinnedd's Store service in order, batched.

Writes change the in-memory tray at once and are queued; a flusher task
commits the queue. ``State.durable_up_to`` waits for the durability frontier,
which is what the output gate (runtime.py) and ``Tray.append`` wait on.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import grpc

from ._proto import pinned_pb2 as pb

if TYPE_CHECKING:
    from ._proto.pinned_pb2_grpc import StoreStub
    from .instance import Instance

# The state store's limits (statestore/validate.go), the same on every store.
MAX_TRAY_NAME_LEN = 128
MAX_FIELD_NAME_LEN = 128
MAX_VALUE_LEN = 1 << 20
MAX_APPEND_ITEMS = 4096
MAX_APPEND_BYTES = 16 << 20
# One Commit's bounds: the store's (MaxMutations, MaxCommitBytes).
_MAX_BATCH_MUTATIONS = 1024
_MAX_BATCH_BYTES = 16 << 20
_COMMIT_TIMEOUT = 30.0


class StateError(Exception):
    """A durable write did not happen, or its outcome is unknown."""


class Fenced(StateError):
    """A newer activation of the id exists elsewhere: this one must stop."""


class StateUnavailable(StateError):
    """A commit failed; the instance is reset from the store."""


class InvalidWrite(StateError, ValueError):
    """A write the store would refuse; nothing was queued."""


@dataclass(frozen=True)
class Item:
    """One unit of durable work in a tray."""

    seq: int
    payload: Any
    # A run declared it applied before the process stopped: it comes back
    # with Run.resume set.
    applied: bool


@dataclass
class Run:
    """One delivery of a tray's pending items to its handler."""

    instance: "Instance"
    tray: "Tray"
    items: list[Item]
    # The batch was declared applied before a crash: this is a redelivery.
    resume: bool

    async def applied(self) -> None:
        """Declares the batch applied, durably: if the process dies after
        this returns, the batch is redelivered with resume set."""
        if self.items:
            self.tray._mark_applied(self.items[-1].seq)
            await self.tray._state.durable()


TrayHandler = Callable[[Run], Awaitable[None]]


def _check_name(what: str, name: str, limit: int) -> None:
    b = name.encode("utf-8")
    if not b or len(b) > limit or b"\x00" in b:
        raise InvalidWrite(f"{what} {name!r}: want 1..{limit} bytes of UTF-8 without NUL")


class Tray:
    """A durable slot of an instance: persistent fields (JSON values) and a
    queue of work items."""

    def __init__(self, state: "State", ns: str, id: str) -> None:
        self._state = state
        self.ns = ns
        self.id = id
        self._fields: dict[str, bytes] = {}
        self._items: list[Item] = []
        self._running = False

    def get(self, name: str, default: Any = None) -> Any:
        """The field's value, or default when it is not set."""
        raw = self._fields.get(name)
        return default if raw is None else json.loads(raw)

    def fields(self) -> list[str]:
        return sorted(self._fields)

    def items(self) -> list[Item]:
        return list(self._items)

    @property
    def marked(self) -> bool:
        """The tray holds unfinished work."""
        return bool(self._items)

    def set(self, name: str, value: Any) -> None:
        """Writes a field through to the store. The tray changes at once;
        the write is durable once Instance.durable() returns (and any
        response sent after it waits for it: the output gate)."""
        self._check(name)
        raw = json.dumps(value, separators=(",", ":")).encode()
        if len(raw) > MAX_VALUE_LEN:
            raise InvalidWrite(f"field {name}: {len(raw)} bytes (max {MAX_VALUE_LEN})")
        self._state._raise_if_failed()
        self._fields[name] = raw
        self._state._enqueue(pb.StoreMutation(tray_ns=self.ns, tray_id=self.id, set_field=pb.SetFieldOp(name=name, value=raw)))

    def delete(self, name: str) -> None:
        self._check(name)
        self._state._raise_if_failed()
        self._fields.pop(name, None)
        self._state._enqueue(pb.StoreMutation(tray_ns=self.ns, tray_id=self.id, set_field=pb.SetFieldOp(name=name)))

    async def append(self, *payloads: Any) -> list[int]:
        """Adds work items (JSON values) and waits until they are durable:
        an item append returned for is delivered to the tray's handler,
        again after any crash, until a run settles it."""
        self._check(None)
        raw = [json.dumps(p, separators=(",", ":")).encode() for p in payloads]
        if len(raw) > MAX_APPEND_ITEMS:
            raise InvalidWrite(f"{len(raw)} items in one append (max {MAX_APPEND_ITEMS})")
        if any(len(r) > MAX_VALUE_LEN for r in raw) or sum(map(len, raw)) > MAX_APPEND_BYTES:
            raise InvalidWrite("item or append over the store's size limits")
        st = self._state
        st._raise_if_failed()
        box: list[int] = []
        st._enqueue(pb.StoreMutation(tray_ns=self.ns, tray_id=self.id, append_items=pb.AppendItemsOp(payloads=raw)),
                    append=(self, raw, box))
        await st.durable()
        return box

    def _check(self, name: str | None) -> None:
        _check_name("tray namespace", self.ns, MAX_TRAY_NAME_LEN)
        _check_name("tray id", self.id, MAX_TRAY_NAME_LEN)
        if name is not None:
            _check_name("field name", name, MAX_FIELD_NAME_LEN)

    def _stored(self, raw: list[bytes], seqs: list[int]) -> None:
        self._items.extend(Item(s, json.loads(r), False) for s, r in zip(seqs, raw))

    def _mark_applied(self, up_to: int) -> None:
        self._items = [Item(i.seq, i.payload, True) if i.seq <= up_to else i for i in self._items]
        self._state._enqueue(pb.StoreMutation(tray_ns=self.ns, tray_id=self.id, mark_applied_up_to=up_to))

    def _settle(self, up_to: int) -> None:
        # A tray left with nothing deletes itself.
        self._items = [i for i in self._items if i.seq > up_to]
        self._state._enqueue(pb.StoreMutation(tray_ns=self.ns, tray_id=self.id, remove_items_up_to=up_to))
        if not self._items and not self._fields:
            self._state._enqueue(pb.StoreMutation(tray_ns=self.ns, tray_id=self.id, delete_tray=True))


class State:
    """An instance's trays and the queue of their writes to the store. With
    no store (a node without one, or a unit test) writes are durable at
    once and items are numbered here."""

    def __init__(self, inst: "Instance", store: "StoreStub | None", handlers: dict[str, TrayHandler],
                 loaded: list[pb.TrayData]) -> None:
        self._inst = inst
        self._store = store
        self._handlers = handlers
        self._trays: dict[tuple[str, str], Tray] = {}
        self._queue: list[tuple[pb.StoreMutation, tuple[Tray, list[bytes], list[int]] | None]] = []
        self.queued = 0  # writes ever queued
        self.done = 0  # writes ever committed
        self.err: StateError | None = None
        self._changed = asyncio.Condition()
        self._flusher: asyncio.Task[None] | None = None
        for td in loaded:
            t = self.tray(td.tray_ns, td.tray_id)
            t._fields = dict(td.fields)
            t._items = [Item(it.seq, json.loads(it.payload), it.applied) for it in td.items]

    def tray(self, ns: str, id: str) -> Tray:
        t = self._trays.get((ns, id))
        if t is None:
            t = self._trays[(ns, id)] = Tray(self, ns, id)
        return t

    def tray_keys(self, ns: str = "") -> list[tuple[str, str]]:
        return sorted(k for k, t in self._trays.items() if (not ns or k[0] == ns) and (t._fields or t._items))

    def _raise_if_failed(self) -> None:
        if self.err is not None:
            raise self.err

    def _enqueue(self, m: pb.StoreMutation, append: tuple[Tray, list[bytes], list[int]] | None = None) -> None:
        self.queued += 1
        if self._store is None:
            self.done += 1
            if append is not None:
                tray, raw, box = append
                nxt = tray._items[-1].seq + 1 if tray._items else 1
                box.extend(range(nxt, nxt + len(raw)))
                tray._stored(raw, box)
                self.kick(tray)
            return
        self._queue.append((m, append))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def durable_up_to(self, target: int) -> None:
        """Waits until the first target writes ever queued are committed,
        or raises the error that stopped them."""
        if self.done >= target:
            return
        async with self._changed:
            await self._changed.wait_for(lambda: self.done >= target or self.err is not None)
        if self.done < target:
            assert self.err is not None
            raise self.err

    async def durable(self) -> None:
        """Waits until every write queued so far is committed."""
        await self.durable_up_to(self.queued)

    async def _flush(self) -> None:
        assert self._store is not None
        while self._queue and self.err is None:
            n, size = 0, 0
            for m, _ in self._queue[:_MAX_BATCH_MUTATIONS]:
                size += m.ByteSize()
                if n and size > _MAX_BATCH_BYTES:
                    break
                n += 1
            batch = self._queue[:n]
            req = pb.StoreCommitRequest(namespace=self._inst.namespace, id=self._inst.id,
                                        generation=self._inst.generation, mutations=[m for m, _ in batch])
            stored: list[Tray] = []
            try:
                resp = await self._store.Commit(req, timeout=_COMMIT_TIMEOUT)
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    # A write the store will never take: drop it rather
                    # than block every later one, and say so loudly.
                    self._inst.logger.error("state write rejected; dropped", extra={"err": e.details()})
                    del self._queue[:n]
                    self.done += n
                elif code == grpc.StatusCode.ABORTED:
                    self.err = Fenced(e.details() or "fenced")
                else:
                    self.err = StateUnavailable(f"{code.name}: {e.details()}")
                    self._inst.logger.warning("state write failed; the instance is reset from the store",
                                              extra={"err": e.details(), "dropped_writes": len(self._queue)})
            else:
                i = 0
                for m, append in batch:
                    if m.HasField("append_items"):
                        if append is not None and i < len(resp.seqs):
                            tray, raw, box = append
                            box.extend(resp.seqs[i].seqs)
                            tray._stored(raw, box)
                            stored.append(tray)
                        i += 1
                del self._queue[:n]
                self.done += n
            if self.err is not None:
                # Nothing more of this activation reaches the store: done
                # stays short of queued, so every output held behind the
                # dropped writes fails.
                self._queue.clear()
                # Out of the runtime's hands before a held answer says
                # 504: a later request reaches a fresh activation.
                if isinstance(self.err, Fenced):
                    self._inst._fenced()
                else:
                    self._inst._reset()
            async with self._changed:
                self._changed.notify_all()
            for t in stored:
                self.kick(t)

    def kick(self, tray: Tray) -> None:
        """Starts a run of the tray's items if its namespace has a handler
        and none is going."""
        found = self._handlers.get(tray.ns)
        if found is None or tray._running or not tray._items:
            return
        handler: TrayHandler = found
        tray._running = True

        async def run() -> None:
            try:
                while not self._inst.cancelled and tray._items:
                    items = list(tray._items)
                    try:
                        await handler(Run(self._inst, tray, items, items[0].applied))
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        if not self._inst.cancelled:
                            self._inst.logger.exception("tray run failed; left for redelivery",
                                                        extra={"tray": f"{tray.ns}:{tray.id}"})
                        return
                    tray._settle(items[-1].seq)
                    await self.durable()
            finally:
                tray._running = False

        self._inst.spawn(f"tray {tray.ns}:{tray.id}", run)

    def redeliver(self) -> None:
        """Starts runs for every marked tray with a handler: the work the
        previous activation left."""
        for key in sorted(self._trays):
            self.kick(self._trays[key])
