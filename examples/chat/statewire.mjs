// A Statewire client for Node 20 and browsers, no dependencies (global
// fetch and ReadableStream). See statewire/PROTOCOL.md.
//
//   const s = attach(url, { onState(state) { ... } });
//   await send(url, clientId, seq, { type: "send", message: { ... } });
//   s.close();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// backoff: 100 ms doubling to 2 s, with jitter.
function backoff(attempt) {
  const d = Math.min(100 * 2 ** Math.min(attempt, 5), 2000);
  return d / 2 + Math.random() * (d / 2);
}

function retryAfter(res) {
  const s = Number(res?.headers?.get("retry-after"));
  return Number.isFinite(s) && s >= 0 ? s * 1000 : null;
}

// applyOp applies one op to doc and returns the new root.
export function applyOp(doc, op) {
  const path = op.path ?? [];
  if (op.op === "append") {
    const cur = lookup(doc, path);
    if (cur !== undefined && cur !== null && typeof cur !== "string") throw new Error(`append to a non-string at ${JSON.stringify(path)}`);
    return setAt(doc, path, (cur ?? "") + (op.text ?? ""));
  }
  if (op.op === "set") return setAt(doc, path, op.value ?? null);
  if (op.op === "delete") {
    if (path.length === 0) return null;
    const parent = lookup(doc, path.slice(0, -1));
    const k = path[path.length - 1];
    if (Array.isArray(parent)) {
      if (typeof k !== "number" || k >= parent.length) throw new Error(`bad index ${JSON.stringify(path)}`);
      parent.splice(k, 1);
    } else if (parent && typeof parent === "object") {
      delete parent[k];
    } else throw new Error(`bad path ${JSON.stringify(path)}`);
    return doc;
  }
  throw new Error(`unknown op ${op.op}`);
}

function lookup(doc, path) {
  let cur = doc;
  for (const k of path) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = cur[k];
  }
  return cur;
}

function setAt(doc, path, value) {
  if (path.length === 0) return value;
  let cur = doc;
  for (const k of path.slice(0, -1)) {
    if (cur[k] === undefined || cur[k] === null) cur[k] = {};
    cur = cur[k];
    if (typeof cur !== "object") throw new Error(`bad path ${JSON.stringify(path)}`);
  }
  const k = path[path.length - 1];
  if (Array.isArray(cur) && (typeof k !== "number" || k > cur.length)) throw new Error(`bad index ${JSON.stringify(path)}`);
  cur[k] = value;
  return doc;
}

// attach keeps a copy of the instance's document and calls onState(state)
// after every snapshot and update. It reconnects on lost connections, on
// fin with reconnect, and after Retry-After on 503. onEnd(err) is called
// when the server ends the stream for good (fin without reconnect).
export function attach(url, { clientId = "", onState = () => {}, onFin = () => {}, onEnd = () => {} } = {}) {
  let closed = false;
  let ctrl = null;
  (async () => {
    for (let attempt = 0; !closed; attempt++) {
      let wait = null;
      try {
        ctrl = new AbortController();
        const res = await fetch(url + "/stream", {
          method: "POST", body: JSON.stringify({ clientId }), signal: ctrl.signal,
          headers: { "content-type": "application/json" },
        });
        if (res.status !== 200) {
          wait = retryAfter(res);
          await res.body?.cancel();
          throw new Error(`stream: HTTP ${res.status}`);
        }
        const fin = await readStream(res.body, onState);
        if (fin) {
          onFin(fin);
          if (!fin.reconnect) {
            closed = true;
            onEnd(new Error(`stream ended: ${fin.code}`));
            return;
          }
        }
        attempt = 0;
      } catch (err) {
        if (closed) return;
      }
      await sleep(wait ?? backoff(attempt));
    }
  })();
  return {
    close() {
      closed = true;
      ctrl?.abort();
    },
  };
}

// readStream reads NDJSON frames until a fin (returned) or the end.
async function readStream(body, onState) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let state = null;
  let version = -1;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("stream ended without fin");
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      const f = JSON.parse(line);
      if (f.type === "snapshot") {
        state = f.state;
        version = f.version ?? 0;
        onState(state);
      } else if (f.type === "ops") {
        if (version < 0 || f.version !== version + 1) throw new Error(`ops ${f.version} after ${version}`);
        // Apply to a copy: a bad op must not leave a torn state behind.
        let next = structuredClone(state);
        for (const op of f.ops) next = applyOp(next, op);
        state = next;
        version = f.version;
        onState(state);
      } else if (f.type === "fin") {
        await reader.cancel().catch(() => {});
        return f;
      }
    }
  }
}

// send posts one frame and resends it, same seq, until it is acknowledged;
// a 4xx rejects.
export async function send(url, clientId, seq, command) {
  for (let attempt = 0; ; attempt++) {
    let wait = null;
    try {
      const res = await fetch(url + "/frames", {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ clientId, frames: [{ ...command, seq }] }),
      });
      const text = await res.text();
      if (res.status === 200 && JSON.parse(text).acked >= seq) return;
      if (res.status >= 400 && res.status < 500) throw Object.assign(new Error(`frames: HTTP ${res.status} ${text}`), { fatal: true });
      wait = retryAfter(res);
    } catch (err) {
      if (err.fatal) throw err;
    }
    await sleep(wait ?? backoff(attempt));
  }
}

// Chat threads (examples/chat): the main branch in order, and one line.
export function transcript(state) {
  const m = state?.messages;
  const out = [];
  let id = m?.branches?.[m.mainBranchId]?.headId;
  while (id != null && m.messages[id] && out.length <= Object.keys(m.messages).length) {
    out.push(m.messages[id]);
    id = m.messages[id].parentId;
  }
  return out.reverse();
}

export function line(state) {
  return transcript(state)
    .map((msg) => `${msg.role}: ${msg.parts.filter((p) => p.type === "text").map((p) => p.text).join("").trim()}`)
    .join(" | ");
}

export function status(state) {
  return state?.threads?.main?.status;
}
