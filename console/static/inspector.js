// The inspector: attaches to one Statewire instance of this fleet through
// this node (POST <instance>/stream), shows its document and the frames as
// they arrive, and writes frames (POST <instance>/frames). The protocol is
// examples/chat's client, statewire.mjs, as it is.
import { attach, send, transcript, status as threadStatus } from "./statewire.mjs";
import { el, banner, say, setupLogin, authHeaders } from "./common.js";

const MAX_FRAMES = 200;

const form = document.getElementById("attach");
const input = document.getElementById("url");
const sendToken = document.getElementById("send-token");
const framesList = document.getElementById("frames");
const sentList = document.getElementById("sent");

let session = null; // the attached stream: {close}
let target = ""; // the instance's path
let clientId = "";
let seq = 1; // the next frame's seq: a client numbers 1, 2, 3, ...
let sending = false;
let snapshots = 0;
let epoch = "";
let version = 0;

setupLogin(() => {});
form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  start(input.value);
});
document.getElementById("detach").addEventListener("click", () => stop("Detached."));
document.getElementById("chat").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const m = document.getElementById("message");
  const text = m.value;
  if (!text.trim()) return;
  m.value = "";
  write({ type: "send", message: { id: "u-" + crypto.randomUUID(), role: "user", parts: [{ type: "text", text }] } });
});
document.getElementById("frame-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  let cmd;
  try {
    cmd = JSON.parse(document.getElementById("frame").value);
  } catch (err) {
    banner(`The frame is not JSON: ${err.message}.`);
    return;
  }
  if (cmd === null || typeof cmd !== "object" || Array.isArray(cmd) || typeof cmd.type !== "string") {
    banner('A frame is a JSON object with a "type" (a command the host declares, or "cancel").');
    return;
  }
  delete cmd.seq;
  write(cmd);
});

const initial = new URLSearchParams(location.search).get("url");
if (initial) {
  input.value = initial;
  start(initial);
}

// instancePath turns what the operator typed into the instance's path on
// this node, or throws saying why not.
function instancePath(v) {
  let u;
  try {
    u = new URL(v.trim(), location.origin);
  } catch {
    throw new Error(`"${v}" is not a URL or a path.`);
  }
  if (u.origin !== location.origin) {
    throw new Error(`The inspector attaches through the node that serves it (${location.origin}); any node reaches every instance, so give the path alone: ${u.pathname}.`);
  }
  const p = u.pathname.replace(/\/+$/, "").replace(/\/(stream|frames)$/, "");
  if (!/^\/[^/_][^/]*\/[^/]+$/.test(p)) throw new Error(`"${p}" is not an instance path: /<namespace>/<id>, e.g. /threads/t1.`);
  return p;
}

function start(v) {
  let p;
  try {
    p = instancePath(v);
  } catch (err) {
    banner(err.message);
    return;
  }
  stop();
  banner("");
  target = p;
  clientId = "console-" + crypto.randomUUID().slice(0, 13);
  seq = 1;
  snapshots = 0;
  framesList.replaceChildren();
  sentList.replaceChildren();
  const u = new URL(location.href);
  u.searchParams.set("url", p);
  history.replaceState(null, "", u.pathname + u.search);
  document.title = `pinnedd · inspect ${p}`;
  say(`Attaching to ${p}…`);
  session = attach(p, {
    clientId,
    headers: sendToken.checked ? authHeaders() : {},
    onFrame: (f) => frame(f),
    onState: (state) => show(state),
    onFin: (f) => {
      if (f.reconnect) say(`${target}: the stream ended (fin ${f.code}); reconnecting…`);
    },
    onError: (err, waitMs) => {
      const why = err.status === 401 || err.status === 403
        ? `${err.message} (tick "Send my token" and give a token that admits this namespace)`
        : err.message;
      say(`${target}: disconnected (${why}); reconnecting in ${(waitMs / 1000).toFixed(1)} s…`);
    },
    onEnd: (err) => {
      say(`${target}: ${err.message}; the server will not take it back. Attach again to start over.`);
      session = null;
    },
  });
}

function stop(message) {
  session?.close();
  session = null;
  if (message) say(message);
}

function frame(f) {
  if (f.type === "snapshot") {
    snapshots++;
    epoch = f.epoch ?? "";
    version = f.version ?? 0;
  } else if (f.type === "ops") {
    version = f.version;
  }
  const text = JSON.stringify(f);
  framesList.append(el("li", { class: `frame ${f.type}` }, el("time", {}, new Date().toLocaleTimeString()), " ", text.length > 400 ? text.slice(0, 400) + "…" : text));
  while (framesList.childElementCount > MAX_FRAMES) framesList.firstElementChild.remove();
  framesList.scrollTop = framesList.scrollHeight;
}

function show(state) {
  const again = snapshots > 1 ? `; ${snapshots - 1} reconnect(s) so far` : "";
  say(`Attached to ${target}: epoch ${epoch}, version ${version}${again}.`);
  document.getElementById("conn").textContent = `Client id ${clientId}; next seq ${seq}.`;
  document.getElementById("doc").textContent = JSON.stringify(state, null, 2);
  const isChat = state?.messages?.messages !== undefined;
  document.getElementById("chat-note").textContent = isChat
    ? `Thread ${threadStatus(state) ?? "?"}.`
    : "Not a chat thread: its document is shown below.";
  document.getElementById("transcript").replaceChildren(
    ...(isChat ? transcript(state) : []).map((m) =>
      el("li", { class: m.role, "data-id": m.id },
        el("strong", {}, m.role + ": "),
        m.parts.filter((p) => p.type === "text").map((p) => p.text).join(""),
        m.parts.some((p) => p.state === "streaming") ? " …" : "")),
  );
}

// write sends one command with the next seq, resending it until it is
// acknowledged (a 503 or a lost answer) or refused (a 4xx, which leaves
// the seq free for the next frame).
async function write(command) {
  if (!target) {
    banner("Attach to an instance first.");
    return;
  }
  if (sending) {
    banner("One frame at a time: the last one is not acknowledged yet (Statewire admits a client's frames in order).");
    return;
  }
  sending = true;
  const n = seq;
  const item = el("li", {}, `seq ${n}: ${JSON.stringify(command)} — sending (resent until acknowledged)…`);
  sentList.append(item);
  try {
    const out = await send(target, clientId, n, command, { headers: sendToken.checked ? authHeaders() : {} });
    seq = n + 1;
    item.textContent = `seq ${n}: ${JSON.stringify(command)} — acknowledged (acked ${out.acked}, admitted ${out.admitted}, duplicates ${out.duplicates}).`;
    banner("");
  } catch (err) {
    if (err.expected) seq = err.expected;
    item.textContent = `seq ${n}: refused: ${err.message}`;
    banner(`The frame was refused: ${err.message}`);
  } finally {
    sending = false;
    document.getElementById("conn").textContent = `Client id ${clientId}; next seq ${seq}.`;
  }
}
