// Sends MESSAGE to a chat thread and prints the transcript whenever it
// changes; exits 0 once the thread is idle and the reply is complete.
//
//   URL=http://127.0.0.1:8080/threads/t1 MESSAGE="remember me" node smoke.mjs
import { randomUUID } from "node:crypto";
import { attach, send, line, status, transcript } from "./statewire.mjs";

const url = process.env.URL ?? "http://127.0.0.1:8080/threads/t1";
const message = process.env.MESSAGE ?? "hello";
const timeout = Number(process.env.TIMEOUT_MS ?? 300000);
const clientId = "js-" + randomUUID();
const messageId = "u-" + randomUUID();

let last = null;
function replied(state) {
  const msgs = transcript(state);
  const i = msgs.findIndex((m) => m.id === messageId);
  const reply = msgs[i + 1];
  return i >= 0 && reply?.role === "assistant" && reply.parts.every((p) => p.state === "done") && status(state) === "idle";
}

const s = attach(url, {
  clientId,
  onState(state) {
    const l = line(state);
    if (l !== last) {
      console.log(l);
      last = l;
    }
    if (replied(state)) {
      s.close();
      process.exit(0);
    }
  },
  onEnd(err) {
    console.error(err.message);
    process.exit(1);
  },
});
setTimeout(() => {
  console.error(`no complete reply within ${timeout} ms`);
  process.exit(2);
}, timeout).unref();

try {
  await send(url, clientId, 1, { type: "send", message: { id: messageId, role: "user", parts: [{ type: "text", text: message }] } });
} catch (err) {
  console.error(err.message);
  process.exit(1);
}
