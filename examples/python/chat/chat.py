#!/usr/bin/python3
"""The durable echo chat (examples/chat) in Python, on Statewire: each id
under /threads is a thread whose transcript lives in the tray ("log", "~")
field "messages", and whose replies echo the user's words one at a time.
The same document and commands as the Go host, so the chat's Node clients
(examples/chat/smoke.mjs, attach.mjs) work against it unchanged.

    POST /threads/t1/stream   snapshot + ops (Statewire)
    POST /threads/t1/frames   {"clientId":"c1","frames":[{"seq":1,"type":"send","message":{...}}]}

The assistant message is stored before its reply streams, the streamed
text only at the end: a reply cut off by a crash restarts from its first
word under the same message id. CHAT_WORD_DELAY (a number of seconds, or
Go-style "20ms") sets the pace; 50 ms by default.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
from typing import Any

from pinnedd_sdk import Host, Instance, serve
from pinnedd_sdk.statewire import AdmitError, Command, CommandSpec, RunContext, Statewire, statewire_trays

MAIN = "main"
MAX_TEXT = 32 << 10
ID = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


def word_delay() -> float:
    v = os.environ.get("CHAT_WORD_DELAY", "")
    try:
        if v.endswith("ms"):
            return float(v[:-2]) / 1000
        if v.endswith("s"):
            return float(v[:-1])
        return float(v) if v else 0.05
    except ValueError:
        logging.getLogger("chat").warning("ignoring bad CHAT_WORD_DELAY", extra={"value": v})
        return 0.05


def validate_send(f: dict[str, Any]) -> None:
    """Every level strictly: a field the host does not know is refused."""
    if set(f) - {"seq", "type", "message"}:
        raise ValueError(f"send: unknown field {sorted(set(f) - {'seq', 'type', 'message'})[0]!r} "
                         "(a send frame has seq, type and message{id, role, parts[{type, text}]})")
    m = f.get("message")
    if not isinstance(m, dict):
        raise ValueError("missing message")
    if set(m) - {"id", "role", "parts"}:
        raise ValueError(f"message: unknown field {sorted(set(m) - {'id', 'role', 'parts'})[0]!r}")
    if "id" in m and not (isinstance(m["id"], str) and (m["id"] == "" or ID.match(m["id"]))):
        raise ValueError("message id must be 1-100 characters of A-Z a-z 0-9 . _ : -")
    if "role" in m and m["role"] not in ("", "user"):
        raise ValueError('message role must be "user"')
    parts = m.get("parts")
    if not isinstance(parts, list) or not parts:
        raise ValueError("message has no parts")
    n = 0
    for i, p in enumerate(parts):
        if not isinstance(p, dict) or set(p) - {"type", "text"}:
            raise ValueError(f"part {i}: a part has type and text")
        if p.get("type") != "text":
            raise ValueError(f'part {i}: unsupported part type {p.get("type")!r} (only "text")')
        if not isinstance(p.get("text"), str):
            raise ValueError(f'part {i}: text part without "text"')
        n += len(p["text"].encode())
    if n > MAX_TEXT:
        raise ValueError(f"message text over {MAX_TEXT} bytes")


def message_id(c: Command) -> str:
    return c.frame["message"].get("id") or f"u-{c.client_id}-{c.seq}"


def transcript(msgs: dict[str, Any]) -> list[dict[str, Any]]:
    """Follows the parent links back from the main branch's head."""
    out: list[dict[str, Any]] = []
    by_id = msgs.get("messages") or {}
    cur = ((msgs.get("branches") or {}).get(msgs.get("mainBranchId")) or {}).get("headId")
    while cur is not None and cur in by_id and len(out) <= len(by_id):
        out.append(by_id[cur])
        cur = by_id[cur].get("parentId")
    return out[::-1]


class Thread:
    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.log = inst.tray("log", "~")
        self.delay = word_delay()
        msgs = self.log.get("messages") or {"mainBranchId": MAIN, "branches": {MAIN: {"headId": None}}, "messages": {}}
        status = "idle"
        conv = transcript(msgs)
        if conv:
            # A reply cut off by a crash (or a turn admitted, not answered) is
            # about to be redelivered: say so from the first snapshot.
            last = conv[-1]
            if last["role"] == "user" or last["parts"] and last["parts"][0].get("state") == "streaming":
                status = "streaming"
        self.sw = Statewire(inst, initial={"messages": msgs, "threads": {MAIN: {"status": status}}},
                            commands={"send": CommandSpec(validate=validate_send, run=True)},
                            run=self.run, admit=self.admit)
        # Sends a previous activation admitted and did not run keep their ids.
        self.reserved: dict[str, str] = {message_id(c): f"{c.client_id}/{c.seq}"
                                         for c in self.sw.pending() if c.type == "send"}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.sw(scope, receive, send)

    def admit(self, cmds: list[Command]) -> None:
        """A message id is used once per thread: once acknowledged, a send
        whose id is taken could never be shown."""
        mine: dict[str, str] = {}
        for c in cmds:
            if c.type != "send":
                continue
            mid, owner = message_id(c), f"{c.client_id}/{c.seq}"
            taken = self.reserved.get(mid)
            if self.sw.doc.has(["messages", "messages", mid]) or taken is not None and taken != owner or mid in mine:
                raise AdmitError(f'message id "{mid}" is already used in this thread; send the message with a new id '
                                 "(or none: the server makes one)")
            mine[mid] = owner
        self.reserved.update(mine)

    def append_message(self, m: dict[str, Any]) -> None:
        """Links m under the branch head, unless its id exists already (a
        send redelivered before its run was marked applied)."""
        if self.sw.doc.has(["messages", "messages", m["id"]]):
            return
        head = self.sw.doc.get(["messages", "branches", MAIN, "headId"])
        with self.sw.doc.batch() as d:
            d.set(["messages", "messages", m["id"]], {**m, "parentId": head})
            d.set(["messages", "branches", MAIN, "headId"], m["id"])

    def persist(self) -> None:
        self.log.set("messages", self.sw.doc.get(["messages"]))

    async def run(self, rc: RunContext) -> None:
        """Store the user messages, mark the batch applied, store the
        assistant message, then stream the echo."""
        for c in rc.commands:
            parts = [{"type": "text", "text": p["text"], "state": "done"} for p in c.frame["message"]["parts"]]
            self.append_message({"id": message_id(c), "role": "user", "parts": parts})
        self.persist()
        await rc.applied()
        conv = transcript(self.sw.doc.get(["messages"]))
        users = [m for m in conv if m["role"] == "user"]
        if not users:
            raise RuntimeError("a run without a user message")
        user, last = users[-1], conv[-1]
        status = ["threads", MAIN, "status"]
        # A reply stored whole before the process died is finished.
        if last["role"] == "assistant" and last["parts"] and last["parts"][0].get("state") == "done":
            self.sw.doc.set(status, "idle")
            self.persist()
            return
        self.sw.doc.set(status, "streaming")
        # Reuse the assistant message of an interrupted reply; otherwise
        # store a new one before a single word streams.
        if last["role"] == "assistant":
            reply = last["id"]
        else:
            reply = "a-" + secrets.token_hex(12)
            self.append_message({"id": reply, "role": "assistant", "parts": [{"type": "text", "text": "", "state": "streaming"}]})
        text = ["messages", "messages", reply, "parts", 0, "text"]
        with self.sw.doc.batch() as d:
            d.set(text, "")
            d.set(["messages", "messages", reply, "parts", 0, "state"], "streaming")
        # The output gate holds every frame written after this write until
        # it is stored: no word leaves before the assistant message.
        self.persist()
        words = ["echo:"] + [w for p in user["parts"] for w in p["text"].split()]
        for i, w in enumerate(words):
            await asyncio.sleep(self.delay)
            if self.inst.cancelled:
                # Evicted or crashed: the batch stays queued and the reply
                # restarts on the next activation.
                raise asyncio.CancelledError()
            if rc.stop_requested:
                break
            self.sw.doc.append_text(text, w if i == 0 else " " + w)
        # The finished reply is durable before any client sees "idle".
        self.sw.doc.set(["messages", "messages", reply, "parts", 0, "state"], "done")
        self.persist()
        self.sw.doc.set(status, "idle")
        self.persist()


HOSTS = {"/threads": Host(new=Thread, trays=statewire_trays())}

if __name__ == "__main__":
    serve(HOSTS)
