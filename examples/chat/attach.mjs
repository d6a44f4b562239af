// Attaches to a chat thread and prints the transcript whenever it changes;
// exits 0 once the thread is idle (a reply in progress is waited for).
//
//   URL=http://127.0.0.1:8080/threads/t1 node attach.mjs
import { randomUUID } from "node:crypto";
import { attach, line, status } from "./statewire.mjs";

const url = process.env.URL ?? "http://127.0.0.1:8080/threads/t1";
const timeout = Number(process.env.TIMEOUT_MS ?? 300000);

let last = null;
const s = attach(url, {
  clientId: "js-" + randomUUID(),
  onState(state) {
    const l = line(state);
    if (l !== last) {
      console.log(l);
      last = l;
    }
    if (status(state) === "idle") {
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
  console.error(`thread not idle within ${timeout} ms`);
  process.exit(2);
}, timeout).unref();
