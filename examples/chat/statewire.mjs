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

// applyOp applies one op, as it came off the wire, to doc and returns the
// new root; it throws on an op that does not apply (statewire/PROTOCOL.md,
// and statewire/testdata/vectors/ops.json, which the tests run). A caller
// applies a frame's ops to a copy, so a throw leaves its state whole.
export function applyOp(doc, op) {
  if (!isObject(op)) throw new Error(`op is not an object: ${JSON.stringify(op)}`);
  if (typeof op.op !== "string") throw new Error(`op without "op": ${JSON.stringify(op)}`);
  if (!("path" in op)) throw new Error(`${op.op} without "path"`);
  const path = op.path;
  checkPath(path);
  switch (op.op) {
    case "set":
      if (!("value" in op)) throw new Error(`set without "value" at ${JSON.stringify(path)}`);
      return setValue(doc, path, op.value);
    case "delete":
      return deleteValue(doc, path);
    case "append":
      if (typeof op.text !== "string") throw new Error(`append without a string "text" at ${JSON.stringify(path)}`);
      return appendText(doc, path, op.text);
  }
  throw new Error(`unknown op ${JSON.stringify(op.op)}`);
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const bad = (path, why) => new Error(`bad path ${JSON.stringify(path)}: ${why}`);
// Own members only, and defined rather than assigned: a key such as
// "__proto__" or "constructor" is a member like any other.
const get = (obj, k) => (Object.hasOwn(obj, k) ? obj[k] : undefined);
const put = (obj, k, v) => Object.defineProperty(obj, k, { value: v, writable: true, enumerable: true, configurable: true });

function checkPath(path) {
  if (!Array.isArray(path)) throw new Error(`path must be an array, not ${JSON.stringify(path)}`);
  for (const el of path) {
    if (typeof el !== "string" && !(Number.isInteger(el) && el >= 0)) {
      throw bad(path, `element ${JSON.stringify(el)}: want a string or a non-negative integer`);
    }
  }
}

// walk follows path: the value there, undefined when a member on the way
// (or at the end) is missing or null; it throws on a path that cannot be
// (a key on an array, an index on an object or past an array's end, a
// scalar on the way).
function walk(doc, path) {
  let cur = doc;
  for (let n = 0; n < path.length; n++) {
    const el = path[n];
    if (isObject(cur)) {
      if (typeof el !== "string") throw bad(path.slice(0, n + 1), "object key must be a string");
      cur = get(cur, el);
      if (cur === undefined || cur === null) return { missing: n };
    } else if (Array.isArray(cur)) {
      if (typeof el !== "number" || el >= cur.length) throw bad(path.slice(0, n + 1), "array index out of range");
      cur = cur[el];
    } else throw bad(path.slice(0, n + 1), "not a container");
  }
  return { value: cur };
}

function setValue(doc, path, value) {
  if (path.length === 0) return value;
  // Check before creating anything: missing members become objects, so
  // from the first missing one on every element must be a key.
  const parentPath = path.slice(0, -1);
  const w = walk(doc, parentPath);
  if (w.missing !== undefined && path.slice(w.missing).some((el) => typeof el !== "string")) {
    throw bad(path, "object key must be a string");
  }
  let cur = doc;
  for (const el of parentPath) {
    if (isObject(cur)) {
      let next = get(cur, el);
      if (next === undefined || next === null) put(cur, el, (next = {}));
      cur = next;
    } else cur = cur[el];
  }
  const k = path[path.length - 1];
  if (isObject(cur)) {
    if (typeof k !== "string") throw bad(path, "object key must be a string");
    put(cur, k, value);
    return doc;
  }
  if (Array.isArray(cur)) {
    if (typeof k !== "number" || k > cur.length) throw bad(path, "array index out of range");
    cur[k] = value;
    return doc;
  }
  throw bad(path, "parent is not a container");
}

function deleteValue(doc, path) {
  if (path.length === 0) throw bad(path, "delete of the whole document");
  const w = walk(doc, path.slice(0, -1));
  if (w.missing !== undefined) throw bad(path, "missing");
  const parent = w.value;
  const k = path[path.length - 1];
  if (isObject(parent)) {
    if (typeof k !== "string") throw bad(path, "object key must be a string");
    delete parent[k];
    return doc;
  }
  if (Array.isArray(parent)) {
    if (typeof k !== "number" || k >= parent.length) throw bad(path, "array index out of range");
    parent.splice(k, 1);
    return doc;
  }
  throw bad(path, "parent is not a container");
}

function appendText(doc, path, text) {
  const w = walk(doc, path);
  const cur = w.missing !== undefined ? "" : w.value;
  if (typeof cur !== "string") throw bad(path, "append to a non-string");
  return setValue(doc, path, cur + text);
}

// The server sends a keepalive after 15 s of silence; a stream silent for
// three periods is dead somewhere on the way.
const SILENCE_MS = 45000;

// attach keeps a copy of the instance's document and calls onState(state)
// after every snapshot and update. It reconnects on lost connections, on
// fin with reconnect, and after Retry-After on 503. onEnd(err) is called
// when the server ends the stream for good (fin without reconnect). For a
// viewer of the wire (the console's inspector): onFrame(frame) sees each
// frame as it arrives, onError(err, waitMs) each failed or broken stream
// before the wait that follows it, and headers go with every request.
export function attach(url, { clientId = "", onState = () => {}, onFin = () => {}, onEnd = () => {}, onFrame = () => {}, onError = () => {}, headers = {}, silenceMs = SILENCE_MS } = {}) {
  let closed = false;
  let ctrl = null;
  (async () => {
    for (let attempt = 0; !closed; attempt++) {
      let wait = null;
      try {
        ctrl = new AbortController();
        const res = await fetch(url + "/stream", {
          method: "POST", body: JSON.stringify({ clientId }), signal: ctrl.signal,
          headers: { ...headers, "content-type": "application/json" },
        });
        if (res.status !== 200) {
          wait = retryAfter(res);
          const text = await res.text().catch(() => "");
          throw Object.assign(new Error(`stream: HTTP ${res.status} ${text.trim()}`), { status: res.status });
        }
        const fin = await readStream(res.body, onState, onFrame, () => ctrl.abort(), silenceMs);
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
        wait ??= backoff(attempt);
        onError(err, wait);
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
async function readStream(body, onState, onFrame, cut, silenceMs) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let state = null;
  let version = -1;
  let silence = null;
  try {
    for (;;) {
      clearTimeout(silence);
      silence = setTimeout(cut, silenceMs);
      const f = await readFrames();
      if (f) return f;
    }
  } finally {
    clearTimeout(silence);
  }

  // readFrames reads one chunk and handles the whole lines it completes;
  // it returns the fin if one came.
  async function readFrames() {
    const { value, done } = await reader.read();
    if (done) throw new Error("stream ended without fin");
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      const f = JSON.parse(line);
      onFrame(f);
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
      // keepalive, and frame types this client does not know: nothing.
    }
    return null;
  }
}

// postFrames sends one POST /frames (body: an object or its JSON text) and
// returns what came back, without retrying.
export async function postFrames(url, body, headers = {}) {
  const res = await fetch(url + "/frames", {
    method: "POST", headers: { ...headers, "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, body: json, text, retryAfter: retryAfter(res) };
}

// send posts one frame and resends it, same seq, until it is acknowledged;
// a 4xx rejects (err.status; on a seq gap, err.expected is the seq the
// server wants next). The server admits a client's seqs only in order
// (1, 2, 3, ...): one client sends one frame at a time, and a rejected
// frame's seq is used again by its next frame.
export async function send(url, clientId, seq, command, { headers = {} } = {}) {
  for (let attempt = 0; ; attempt++) {
    let wait = null;
    try {
      const r = await postFrames(url, { clientId, frames: [{ ...command, seq }] }, headers);
      if (r.status === 200 && r.body?.acked >= seq) return r.body;
      if (r.status >= 400 && r.status < 500) {
        throw Object.assign(new Error(`frames: HTTP ${r.status} ${r.body?.error ?? r.text}`), {
          fatal: true, status: r.status, expected: r.body?.expected,
        });
      }
      wait = r.retryAfter;
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
